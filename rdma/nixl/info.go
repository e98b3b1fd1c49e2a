package nixl

import "github.com/kvtier/kvtier/rdma"

// Info describes the loaded library and the agent, for the startup log
// line (docs/NIXL.md proposes its wording).
type Info struct {
	Library string // the file the loader mapped for libnixl_capi.so
	Version string // the NIXL wheel's name and version found next to it, e.g. "nixl_cu12 1.5.1"; "" if unknown
	Backend string // the backend plugin in use, e.g. "UCX"
	Agent   string // this transport's NIXL agent name
}

// Describe returns tr's Info when tr is a NIXL transport.
func Describe(tr rdma.Transport) (Info, bool) {
	d, ok := tr.(interface{ Info() Info })
	if !ok {
		return Info{}, false
	}
	return d.Info(), true
}

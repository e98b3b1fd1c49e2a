package nixl

// Info describes the loaded library, for the startup log line.
type Info struct {
	Library string // the path dlopen'ed (resolved to the file actually loaded when possible)
	Version string // the NIXL package version found next to the library ("" if unknown)
	Backend string // the backend plugin in use, e.g. "UCX"
	Agent   string // this transport's agent name
}

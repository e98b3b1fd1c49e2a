package wire

import (
	"sync"

	"github.com/kvtier/kvtier/messages"
)

// namespaces holds one string per namespace this process has decoded, so
// that keys decoded from different calls share their namespace's bytes.
// The tiers' and the bridge's maps are keyed by messages.Key; comparing
// two keys whose namespaces share their bytes stops at the pointer, rather
// than reading a stored key's namespace from a cold cache line (the
// profile of kvtierd under the manager bench put ~13% of its CPU in key
// equality). A node serves a handful of namespaces; past maxInterned
// (a client inventing namespaces) the decoder stops interning new ones,
// which costs only the speed-up.
var namespaces = struct {
	sync.Mutex
	m map[string]messages.Namespace
}{m: map[string]messages.Namespace{}}

const maxInterned = 4096

// canonicalNamespace returns the process's one copy of ns (bytes of a
// frame, not kept), making it if there is room. A namespace seen before
// costs no allocation.
func canonicalNamespace(ns []byte) messages.Namespace {
	namespaces.Lock()
	defer namespaces.Unlock()
	if c, ok := namespaces.m[string(ns)]; ok {
		return c
	}
	c := messages.Namespace(ns)
	if len(namespaces.m) < maxInterned {
		namespaces.m[string(c)] = c
	}
	return c
}

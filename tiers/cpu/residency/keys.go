package residency

import (
	"unsafe"

	"github.com/kvtier/kvtier/messages"
)

// Keys publishes a tier's keys into one region: a tier's decision core
// (the CPU tier's State, the fs tier's Index) calls Writing, Readable and
// Gone as keys come and go, inside the actor that owns it — the region's
// one writer.
//
// The index is a hint: a key it lacks (withdrawn, or dropped because its
// buckets were full) costs an engine a recompute; a key it still shows
// costs a lookup that answers MISS. Leases, not the index, guarantee a HIT.
type Keys struct {
	region *Region
	state  uint8
	nsfp   map[messages.Namespace]uint64 // the namespace part of the fingerprint, cached
}

// maxCachedNamespaces bounds the namespace cache (a node serves a few
// layouts; beyond that each fingerprint hashes its namespace again).
const maxCachedNamespaces = 256

// NewKeys publishes into region with state (StateCPU, StateSecondary).
func NewKeys(region *Region, state uint8) *Keys {
	return &Keys{region: region, state: state, nsfp: map[messages.Namespace]uint64{}}
}

// Readable publishes k.
func (x *Keys) Readable(k messages.Key) { x.region.Publish(x.fingerprint(k), x.state) }

// Writing publishes k as being written (StateWriting): an engine asks the
// daemon about it, and waits, rather than recompute it.
func (x *Keys) Writing(k messages.Key) { x.region.Publish(x.fingerprint(k), StateWriting) }

// Gone withdraws k.
func (x *Keys) Gone(k messages.Key) { x.region.Withdraw(x.fingerprint(k)) }

// KeyFingerprint is k's fingerprint (Fingerprint of its namespace, hash and
// group).
func KeyFingerprint(k messages.Key) uint64 {
	return Fingerprint(string(k.Namespace), unsafe.Slice(unsafe.StringData(k.Hash), len(k.Hash)), k.Group)
}

func (x *Keys) fingerprint(k messages.Key) uint64 {
	nsfp, ok := x.nsfp[k.Namespace]
	if !ok {
		nsfp = NamespaceFingerprint(string(k.Namespace))
		if len(x.nsfp) < maxCachedNamespaces {
			x.nsfp[k.Namespace] = nsfp
		}
	}
	// NB: the hash is only read: no copy of the string's bytes.
	return FingerprintWith(nsfp, unsafe.Slice(unsafe.StringData(k.Hash), len(k.Hash)), k.Group)
}

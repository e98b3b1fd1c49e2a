package cpu

import (
	"unsafe"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/cpu/residency"
)

// Residency publishes the tier's readable keys in the shared-memory
// residency index that out-of-process engines read without a message
// (tiers/cpu/residency; docs/PROTOCOL.md, "Residency index"). It is the
// State's Observer, so it is written only inside the CPU tier's Receive:
// one writer, as the index requires.
//
// The index is a hint: a key it lacks (withdrawn, or dropped because its
// buckets were full) costs the engine a recompute, a key it still shows
// costs a lookup that answers MISS. Leases, not the index, guarantee a HIT.
type Residency struct {
	region *residency.Region
	nsfp   map[messages.Namespace]uint64 // the namespace part of the fingerprint, cached
}

// maxCachedNamespaces bounds the namespace cache (a node serves a few
// layouts; beyond that each fingerprint hashes its namespace again).
const maxCachedNamespaces = 256

// NewResidency publishes into region.
func NewResidency(region *residency.Region) *Residency {
	return &Residency{region: region, nsfp: map[messages.Namespace]uint64{}}
}

// Readable implements Observer.
func (x *Residency) Readable(k messages.Key) { x.region.Publish(x.fingerprint(k), residency.StateCPU) }

// Gone implements Observer.
func (x *Residency) Gone(k messages.Key) { x.region.Withdraw(x.fingerprint(k)) }

func (x *Residency) fingerprint(k messages.Key) uint64 {
	nsfp, ok := x.nsfp[k.Namespace]
	if !ok {
		nsfp = residency.NamespaceFingerprint(string(k.Namespace))
		if len(x.nsfp) < maxCachedNamespaces {
			x.nsfp[k.Namespace] = nsfp
		}
	}
	// NB: the hash is only read: no copy of the string's bytes.
	hash := unsafe.Slice(unsafe.StringData(k.Hash), len(k.Hash))
	return residency.FingerprintWith(nsfp, hash, k.Group)
}

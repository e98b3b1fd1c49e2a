// Package tiermsg is the secondary-tier contract (tiers/contract.go): the
// requests a secondary tier's actor (tiers/fs, tiers/obj, tiers/p2p)
// serves for the tiering actor, and its answers. Every request with a Corr
// is answered to its sender with the same Corr; slot memory crosses in Src
// and Dest, held by the sender (a pin or a write reservation) until the
// answer comes back, and touched only by the tier's I/O workers.
//
// It owns the message types only: the tiers own their logic, and the
// public vocabulary (keys, contexts, errors, stats) is messages'.
package tiermsg

import (
	"github.com/kvtier/kvtier/messages"
)

// Message is a message of this protocol (sealed: only this package's
// types are).
type Message interface{ tierMessage() }

func (*Lookup) tierMessage()          {}
func (*LookupResult) tierMessage()    {}
func (*Read) tierMessage()            {}
func (*ReadResult) tierMessage()      {}
func (*Write) tierMessage()           {}
func (*WriteResult) tierMessage()     {}
func (*Delete) tierMessage()          {}
func (*StatsQuery) tierMessage()      {}
func (*StatsReply) tierMessage()      {}
func (*ReadBatch) tierMessage()       {}
func (*ReadBatchResult) tierMessage() {}

// Lookup asks a secondary tier which of Keys it holds.
type Lookup struct {
	Corr uint64 // echoed in LookupResult
	Keys []messages.Key
	Req  *messages.ReqContext // the request that started the lookup (its peer sources); may be nil
}

// LookupResult answers Lookup.
type LookupResult struct {
	Corr  uint64
	Found []bool // one per key
	Err   error  // ErrTierUnavailable when the tier could not tell (then Found is all false)
}

// Read asks a tier to read Key's block into Dest (a slot reserved for
// the reader) and verify its checksum.
type Read struct {
	Corr uint64
	Key  messages.Key
	Dest []byte // len = block bytes
}

// ReadResult answers Read. With Err nil, Dest holds the block and
// Checksum is its verified CRC32C.
type ReadResult struct {
	Corr     uint64
	Key      messages.Key
	Checksum uint32
	Err      error // ErrNotFound, ErrInvalidBlock (removed), ErrTierUnavailable, or an I/O error
	// Prov is the provenance stored with the block (with Err nil), nil when
	// the block was stored without one (an older format, or none known).
	Prov *messages.Provenance
}

// Write asks a tier to store Src as Key's block. The tier verifies Src
// against Checksum before it makes the block visible.
type Write struct {
	Corr     uint64
	Key      messages.Key
	Src      []byte // a pinned slot; read only by the tier's workers
	Checksum uint32 // CRC32C of Src, as committed in the CPU tier
	// Prov is stored with the block (in its header) and announced with it;
	// nil when unknown. Read only by the tier (and its workers).
	Prov *messages.Provenance
}

// WriteResult answers Write.
type WriteResult struct {
	Corr uint64
	Key  messages.Key
	Err  error // ErrTierFull, ErrTierUnavailable, ErrChecksum or an I/O error
}

// Delete removes Key's block from a tier (a bad copy). No reply.
type Delete struct {
	Key messages.Key
}

// StatsQuery asks a secondary tier for its counters.
type StatsQuery struct {
	Corr uint64
}

// StatsReply answers StatsQuery.
type StatsReply struct {
	Corr  uint64
	Stats messages.SecondaryStats
}

// ReadBatch asks a batched tier to read Keys into the reserved Slots
// (Dests[i] is slot Slots[i]'s memory) and verify each block. The caller
// keeps the reservation until the answer arrives.
type ReadBatch struct {
	Corr  uint64
	Keys  []messages.Key
	Slots []int    // reserved CPU slot per key
	Dests [][]byte // slot memory per key
}

// ReadBatchResult answers ReadBatch, per key. The tier answers only
// once nothing of the batch can touch Dests any more.
type ReadBatchResult struct {
	Corr      uint64
	Checksums []uint32               // verified CRC32C per key (valid where Errs[i] == nil)
	Errs      []error                // per key: nil = read and verified
	Source    []string               // per key: where it came from (peer node id), for stats and logs
	Prov      []*messages.Provenance // per key: the provenance the source sent (nil: unknown); may be empty
}

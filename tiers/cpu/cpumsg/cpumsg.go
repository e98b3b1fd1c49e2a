// Package cpumsg is the CPU tier's protocol: the requests the tier's actor
// serves (from the bridge, the tiering actor, peer sessions and the node)
// and its answers. Every request with a Corr is answered to its sender with
// a reply carrying the same Corr, so the asking actor matches it without a
// blocking future (docs/DESIGN.md §10); requests that answer only an
// error get a messages.Ack.
//
// It owns the message types only; the tier's logic is tiers/cpu's, and the
// public vocabulary (keys, contexts, events, errors) is messages'.
package cpumsg

import (
	"time"

	"github.com/kvtier/kvtier/messages"
)

// Message is a message of the CPU tier's protocol (sealed: only this
// package's types are).
type Message interface{ cpuMessage() }

func (*LookupAndLease) cpuMessage()  {}
func (*ResidentOf) cpuMessage()      {}
func (*Resident) cpuMessage()        {}
func (*LookupResult) cpuMessage()    {}
func (*LeaseToPin) cpuMessage()      {}
func (*PinResult) cpuMessage()       {}
func (*TouchKeys) cpuMessage()       {}
func (*UnpinKeys) cpuMessage()       {}
func (*ReserveSlots) cpuMessage()    {}
func (*ReserveResult) cpuMessage()   {}
func (*CommitSlots) cpuMessage()     {}
func (*GrantCredit) cpuMessage()     {}
func (*CreditGranted) cpuMessage()   {}
func (*BindCredit) cpuMessage()      {}
func (*CreditBound) cpuMessage()     {}
func (*ReleaseCredit) cpuMessage()   {}
func (*ReleaseJob) cpuMessage()      {}
func (*ReleaseHolder) cpuMessage()   {}
func (*ReleaseOrigin) cpuMessage()   {}
func (*OrphanJobs) cpuMessage()      {}
func (*ClearTier) cpuMessage()       {}
func (*VerifyBlock) cpuMessage()     {}
func (*TakeTierEvents) cpuMessage()  {}
func (*TierEvents) cpuMessage()      {}
func (*TierStats) cpuMessage()       {}
func (*TierStatsResult) cpuMessage() {}

// Requests to the CPU tier. Every request with a Corr is answered to its
// sender with a reply carrying the same Corr, so the asking actor can match
// it without a blocking future (docs/DESIGN.md §10).

// LookupAndLease asks for the status of keys; HITs are leased to Holder.
type LookupAndLease struct {
	Corr   uint64          // correlation id, echoed in LookupResult
	Holder messages.Holder // who the HITs are leased to
	Keys   []messages.Key  // keys in prefix order
	Prefix bool            // stop at the first key that is not a HIT
	TTL    time.Duration   // lease length
	// WantChecksums asks for the committed CRC32C of every HIT (a peer
	// round sends them to the consumer, which verifies the bytes it gets).
	WantChecksums bool
	// WantProv asks for each HIT's retained provenance in LookupResult.Prov
	// (a peer round sends it to the consumer, whose stored events are then
	// full).
	WantProv bool
	// WantSlots asks for each HIT's slot in LookupResult.Slots (an engine
	// that loads from the leased slots without waiting for its pin).
	WantSlots bool
}

// LookupResult answers LookupAndLease.
type LookupResult struct {
	Corr   uint64                  // from the request
	Holder messages.Holder         // from the request: an asker that restarted can release the leases
	Status []messages.LookupStatus // one per key
	// Checksums, with WantChecksums: per key, the committed CRC32C of a HIT
	// (0 otherwise).
	Checksums []uint32
	// Prov, with WantProv: per key, the provenance the CPU tier retained for
	// a HIT, nil for anything else or when unknown. Shared and immutable:
	// never written through.
	Prov []*messages.Provenance
	// Slots, with WantSlots: per key, the slot of a HIT (0 otherwise).
	Slots []int
}

// LeaseToPin turns Holder's leases on Keys into read pins owned by Job.
type LeaseToPin struct {
	Corr   uint64          // correlation id
	Holder messages.Holder // whose leases are consumed
	Job    messages.JobRef // who owns the pins
	Keys   []messages.Key  // keys to pin, all-or-nothing
	// WantProv asks for each key's retained provenance in PinResult.Prov (a
	// cascade writes it into the secondary tier's block header).
	WantProv bool
	// KeepRank pins without making the keys most recently used (an engine
	// load: vLLM's LRU re-ranks at the request's end, through Touch).
	KeepRank bool
}

// PinResult answers LeaseToPin.
type PinResult struct {
	Corr  uint64          // from the request
	Job   messages.JobRef // from the request: whoever gets an answer it no longer expects (a restarted asker) can release the pins
	Slots []int           // slot per key
	Err   error           // ErrUnknownKey when a key is not ready; nothing pinned then
	// Prov is, with WantProv and no Err, one entry per key (nil when
	// unknown). Shared and immutable.
	Prov []*messages.Provenance
}

// TouchKeys marks keys recently used. No reply.
type TouchKeys struct {
	Keys []messages.Key // keys to touch; unknown ones are ignored
}

// UnpinKeys releases Job's pins on Keys.
type UnpinKeys struct {
	Corr uint64          // correlation id
	Job  messages.JobRef // the pin owner
	Keys []messages.Key  // keys to unpin, all-or-nothing
}

// ReserveSlots makes the absent Keys write-pending for Job, evicting as needed.
type ReserveSlots struct {
	Corr uint64          // correlation id
	Job  messages.JobRef // the writer
	Keys []messages.Key  // keys to store
	// BlockBytes is the size of the slots wanted: the engine session's
	// geometry. 0: the geometry an engine stored the keys' namespace in,
	// else the pool's first (a promotion, a peer's blocks).
	BlockBytes int
}

// ReserveResult answers ReserveSlots.
type ReserveResult struct {
	Corr    uint64         // from the request
	ToStore []messages.Key // keys now write-pending for the job
	Slots   []int          // slot per ToStore key
	Evicted []messages.Key // keys evicted to make room
	Err     error          // ErrFull when there was no room for all; nothing changed then
}

// CommitSlots ends Job's writes of Keys: readable with OK, freed without.
type CommitSlots struct {
	Corr      uint64               // correlation id
	Job       messages.JobRef      // the writer
	Keys      []messages.Key       // keys written
	Slots     []int                // nil, or per key: the slot the tier gave the writer for it (checked, not trusted)
	OK        bool                 // whether the bytes are complete and valid
	Checksums []uint32             // CRC32C per key when OK
	Ctx       *messages.ReqContext // context of the job, for the stored event
	Place     []messages.Placement // per key: its place in Ctx's call, for the stored event (nil: unknown)
	// Prov is nil or one entry per key: a non-nil entry is that key's
	// provenance, used for its stored event and retained with the block,
	// instead of Ctx and Place (promotions from a stored header, blocks
	// fetched from a peer). Shared and immutable from then on.
	Prov []*messages.Provenance
}

// GrantCredit reserves up to N slots as Owner's credit (an engine session's
// slots for stores not yet asked for), evicting in policy order when no
// slot is free. Credited slots are never evicted, looked up or given to
// anyone else until BindCredit or ReleaseCredit.
type GrantCredit struct {
	Corr  uint64          // correlation id, echoed in CreditGranted
	Owner messages.JobRef // OriginCredit, the session's number
	N     int             // slots wanted
	// BlockBytes is the size of the slots wanted (the session's geometry);
	// 0: the pool's first.
	BlockBytes int
}

// CreditGranted answers GrantCredit: fewer slots than asked when the tier
// holds too many pinned, leased or write-pending blocks.
type CreditGranted struct {
	Corr    uint64          // from the request
	Owner   messages.JobRef // from the request
	Slots   []int           // the slots granted
	Evicted []messages.Key  // blocks evicted to make room
}

// BindCredit moves Owner's credited Slots to Job's writes of Keys (slot i
// for key i). A key the tier already holds keeps its slot in the credit.
type BindCredit struct {
	Corr  uint64          // correlation id, echoed in CreditBound
	Owner messages.JobRef // whose credit
	Job   messages.JobRef // the store job that now writes the bound keys
	Keys  []messages.Key  // keys, in the engine's call order
	Slots []int           // one credited slot per key
}

// CreditBound answers BindCredit.
type CreditBound struct {
	Corr  uint64 // from the request
	Bound []bool // per key: its slot is now its write-pending slot
	Err   error  // ErrBadRequest: a slot not Owner's credit, or named twice; nothing bound
}

// ReleaseCredit frees Owner's remaining credit after Quarantine (a worker
// may still be copying into a credited slot). No reply.
type ReleaseCredit struct {
	Owner      messages.JobRef // whose credit
	Quarantine time.Duration   // how long the slots stay out of use first
}

// ReleaseJob drops Job's pins and frees its unfinished writes.
type ReleaseJob struct {
	Corr uint64          // correlation id
	Job  messages.JobRef // the job
}

// ReleaseHolder ends every lease of Holder. No reply.
type ReleaseHolder struct {
	Holder messages.Holder // whose leases end
}

// ReleaseOrigin ends every lease, pin and write of an origin (after the
// bridge restarts with no memory of its requests). No reply.
type ReleaseOrigin struct {
	Origin messages.Origin // whose holds are dropped
	// Quarantine keeps the origin's pinned and write-pending slots out of
	// use this long before freeing them (leases end at once): an engine
	// whose bridge restarted may still be copying into or out of them, and a
	// slot reused meanwhile would take (or give) its late bytes. The job
	// deadline is the bound of a copy in flight. 0 frees them at once.
	Quarantine time.Duration
}

// OrphanJobs ends jobs whose engine is gone: their write-pending keys are
// unindexed at once (their writes will never commit), and their pinned and
// write-pending slots stay out of use for Quarantine, then are freed — a
// worker may still be copying through them. 0 frees them at once. No reply.
type OrphanJobs struct {
	Jobs       []messages.JobRef
	Quarantine time.Duration
}

// ClearTier frees every ready, unpinned block.
type ClearTier struct {
	Corr uint64 // correlation id
}

// VerifyBlock recomputes a block's checksum; a mismatch drops the block.
// The node asks it from outside the actors, so it carries its reply.
type VerifyBlock struct {
	Key   messages.Key             // the block
	Reply messages.Reply[struct{}] // answer: nil, or why (ErrChecksum, ErrUnknownKey)
}

// TakeTierEvents drains the tier's event buffer.
type TakeTierEvents struct {
	Corr uint64 // correlation id
}

// TierEvents answers TakeTierEvents.
type TierEvents struct {
	Corr    uint64           // from the request
	Events  []messages.Event // oldest first
	Dropped uint64           // events dropped because the buffer was full, since the last drain
}

// TierStats asks the CPU tier for its gauges and counters.
type TierStats struct {
	Corr uint64 // correlation id
}

// TierStatsResult answers TierStats; only the CPU-tier fields of Stats are set.
type TierStatsResult struct {
	Corr  uint64         // from the request
	Stats messages.Stats // pool gauges and tier counters
}

// ResidentOf asks the CPU tier (from the KV-event hub) for the blocks of
// Namespace it holds readable now, for an engine that just joined under Topic: the
// event hub re-announces them under that topic only, so a router credits
// a pod that came after the blocks did. The answer is a *Resident, sent
// to the asker in order with the tier's own events.
type ResidentOf struct {
	Namespace messages.Namespace // the joining engine's key namespace
	Topic     string             // the joining engine's topic, echoed in the answer
}

// Resident answers ResidentOf: Event is a BlockStored of every block of
// the namespace the tier held then, parents before their children, with
// each block's retained provenance (Prov).
type Resident struct {
	Topic string
	Event messages.Event
}

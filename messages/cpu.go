package messages

import "time"

// Requests to the CPU tier. Every request with a Corr is answered to its
// sender with a reply carrying the same Corr, so the asking actor can match
// it without a blocking future (DESIGN.md §8 pitfalls).

// LookupAndLease asks for the status of keys; HITs are leased to Holder.
type LookupAndLease struct {
	Corr   uint64        // correlation id, echoed in LookupResult
	Holder Holder        // who the HITs are leased to
	Keys   []Key         // keys in prefix order
	Prefix bool          // stop at the first key that is not a HIT
	TTL    time.Duration // lease length
	// WantChecksums asks for the committed CRC32C of every HIT (a peer
	// round sends them to the consumer, which verifies the bytes it gets).
	WantChecksums bool
	// WantProv asks for each HIT's retained provenance in LookupResult.Prov
	// (a peer round sends it to the consumer, whose stored events are then
	// full).
	WantProv bool
}

// LookupResult answers LookupAndLease.
type LookupResult struct {
	Corr   uint64         // from the request
	Holder Holder         // from the request: an asker that restarted can release the leases
	Status []LookupStatus // one per key
	// Checksums, with WantChecksums: per key, the committed CRC32C of a HIT
	// (0 otherwise).
	Checksums []uint32
	// Prov, with WantProv: per key, the provenance the CPU tier retained for
	// a HIT, nil for anything else or when unknown. Shared and immutable:
	// never written through.
	Prov []*Provenance
}

// LeaseToPin turns Holder's leases on Keys into read pins owned by Job.
type LeaseToPin struct {
	Corr   uint64 // correlation id
	Holder Holder // whose leases are consumed
	Job    JobRef // who owns the pins
	Keys   []Key  // keys to pin, all-or-nothing
	// WantProv asks for each key's retained provenance in PinResult.Prov (a
	// cascade writes it into the secondary tier's block header).
	WantProv bool
}

// PinResult answers LeaseToPin.
type PinResult struct {
	Corr  uint64 // from the request
	Job   JobRef // from the request: whoever gets an answer it no longer expects (a restarted asker) can release the pins
	Slots []int  // slot per key
	Err   error  // ErrUnknownKey when a key is not ready; nothing pinned then
	// Prov is, with WantProv and no Err, one entry per key (nil when
	// unknown). Shared and immutable.
	Prov []*Provenance
}

// TouchKeys marks keys recently used. No reply.
type TouchKeys struct {
	Keys []Key // keys to touch; unknown ones are ignored
}

// UnpinKeys releases Job's pins on Keys.
type UnpinKeys struct {
	Corr uint64 // correlation id
	Job  JobRef // the pin owner
	Keys []Key  // keys to unpin, all-or-nothing
}

// ReserveSlots makes the absent Keys write-pending for Job, evicting as needed.
type ReserveSlots struct {
	Corr uint64 // correlation id
	Job  JobRef // the writer
	Keys []Key  // keys to store
}

// ReserveResult answers ReserveSlots.
type ReserveResult struct {
	Corr    uint64 // from the request
	ToStore []Key  // keys now write-pending for the job
	Slots   []int  // slot per ToStore key
	Evicted []Key  // keys evicted to make room
	Err     error  // ErrFull when there was no room for all; nothing changed then
}

// CommitSlots ends Job's writes of Keys: readable with OK, freed without.
type CommitSlots struct {
	Corr      uint64      // correlation id
	Job       JobRef      // the writer
	Keys      []Key       // keys written
	OK        bool        // whether the bytes are complete and valid
	Checksums []uint32    // CRC32C per key when OK
	Ctx       *ReqContext // context of the job, for the stored event
	Place     []Placement // per key: its place in Ctx's call, for the stored event (nil: unknown)
	// Prov is nil or one entry per key: a non-nil entry is that key's
	// provenance, used for its stored event and retained with the block,
	// instead of Ctx and Place (promotions from a stored header, blocks
	// fetched from a peer). Shared and immutable from then on.
	Prov []*Provenance
}

// ReleaseJob drops Job's pins and frees its unfinished writes.
type ReleaseJob struct {
	Corr uint64 // correlation id
	Job  JobRef // the job
}

// ReleaseHolder ends every lease of Holder. No reply.
type ReleaseHolder struct {
	Holder Holder // whose leases end
}

// ReleaseOrigin ends every lease, pin and write of an origin (after the
// bridge restarts with no memory of its requests). No reply.
type ReleaseOrigin struct {
	Origin Origin // whose holds are dropped
	// Quarantine keeps the origin's pinned and write-pending slots out of
	// use this long before freeing them (leases end at once): an engine
	// whose bridge restarted may still be copying into or out of them, and a
	// slot reused meanwhile would take (or give) its late bytes. The job
	// deadline is the bound of a copy in flight. 0 frees them at once.
	Quarantine time.Duration
}

// ClearTier frees every ready, unpinned block.
type ClearTier struct {
	Corr uint64 // correlation id
}

// VerifyBlock recomputes a block's checksum; a mismatch drops the block.
type VerifyBlock struct {
	Corr uint64 // correlation id
	Key  Key    // the block
}

// TakeTierEvents drains the tier's event buffer.
type TakeTierEvents struct {
	Corr uint64 // correlation id
}

// TierEvents answers TakeTierEvents.
type TierEvents struct {
	Corr    uint64  // from the request
	Events  []Event // oldest first
	Dropped uint64  // events dropped because the buffer was full, since the last drain
}

// TierStats asks the CPU tier for its gauges and counters.
type TierStats struct {
	Corr uint64 // correlation id
}

// TierStatsResult answers TierStats; only the CPU-tier fields of Stats are set.
type TierStatsResult struct {
	Corr  uint64 // from the request
	Stats Stats  // pool gauges and tier counters
}

// Ack answers requests that return only an error.
type Ack struct {
	Corr uint64 // from the request
	Err  error  // nil on success
}

package messages

import (
	"time"
)

// Secondary tiers (fs, obj) and the tiering actor that cascades to them and
// promotes from them (DESIGN.md §4 store and secondary-hit flows).
//
// Every request to a tier carries a Corr the tier echoes in its answer, so
// the tiering actor matches answers without blocking futures. Slot memory
// crosses in Src / Dest: the sender holds a pin (cascade) or a write
// reservation (promotion) on that slot until the answer comes back, and the
// tier touches the bytes only in its I/O workers, never in Receive.

// TierRefreshed tells the tiering actor that a tier may now hold blocks it
// answered absent before (the P2P tier: a peer's session came up — a new
// member, or one restarted with its data), so the absences cached from its
// answers are dropped and the next lookups ask it again.
type TierRefreshed struct {
	Tier string // the tier's name
}

// TierLookup asks a secondary tier which of Keys it holds.
type TierLookup struct {
	Corr uint64 // echoed in TierLookupResult
	Keys []Key
	Req  *ReqContext // the request that started the lookup (its peer sources); may be nil
}

// TierLookupResult answers TierLookup.
type TierLookupResult struct {
	Corr  uint64
	Found []bool // one per key
	Err   error  // ErrTierUnavailable when the tier could not tell (then Found is all false)
}

// TierRead asks a tier to read Key's block into Dest (a slot reserved for
// the reader) and verify its checksum.
type TierRead struct {
	Corr uint64
	Key  Key
	Dest []byte // len = block bytes
}

// TierReadResult answers TierRead. With Err nil, Dest holds the block and
// Checksum is its verified CRC32C.
type TierReadResult struct {
	Corr     uint64
	Key      Key
	Checksum uint32
	Err      error // ErrNotFound, ErrInvalidBlock (removed), ErrTierUnavailable, or an I/O error
	// Prov is the provenance stored with the block (with Err nil), nil when
	// the block was stored without one (an older format, or none known).
	Prov *Provenance
}

// TierWrite asks a tier to store Src as Key's block. The tier verifies Src
// against Checksum before it makes the block visible.
type TierWrite struct {
	Corr     uint64
	Key      Key
	Src      []byte // a pinned slot; read only by the tier's workers
	Checksum uint32 // CRC32C of Src, as committed in the CPU tier
	// Prov is stored with the block (in its header) and announced with it;
	// nil when unknown. Read only by the tier (and its workers).
	Prov *Provenance
}

// TierWriteResult answers TierWrite.
type TierWriteResult struct {
	Corr uint64
	Key  Key
	Err  error // ErrTierFull, ErrTierUnavailable, ErrChecksum or an I/O error
}

// TierDelete removes Key's block from a tier (a bad copy). No reply.
type TierDelete struct {
	Key Key
}

// TierStatsQuery asks a secondary tier for its counters.
type TierStatsQuery struct {
	Corr uint64
}

// TierStatsReply answers TierStatsQuery.
type TierStatsReply struct {
	Corr  uint64
	Stats SecondaryStats
}

// SecondaryStats are one secondary tier's gauges and counters.
type SecondaryStats struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"` // "fs" or "obj"
	Healthy  bool   `json:"healthy"`
	Blocks   int    `json:"blocks"`         // blocks indexed (fs) or unknown (obj: -1)
	Bytes    int64  `json:"bytes"`          // bytes used (fs)
	Capacity int64  `json:"capacity_bytes"` // byte capacity (fs; 0 = unbounded)
	InFlight int    `json:"in_flight"`      // I/O operations queued or running

	Lookups        uint64 `json:"lookups"`          // keys looked up
	Found          uint64 `json:"found"`            // keys found
	Reads          uint64 `json:"reads"`            // blocks read and verified
	ReadFailures   uint64 `json:"read_failures"`    // reads that failed (I/O, missing)
	Writes         uint64 `json:"writes"`           // blocks written
	WriteFailures  uint64 `json:"write_failures"`   // writes that failed (I/O, checksum)
	WritesFull     uint64 `json:"writes_full"`      // writes dropped for lack of room (capacity, ENOSPC)
	WritesShed     uint64 `json:"writes_shed"`      // writes shed: queue full or tier unhealthy
	Evictions      uint64 `json:"evictions"`        // blocks evicted for capacity
	Invalid        uint64 `json:"invalid"`          // stored blocks found invalid and removed
	Deleted        uint64 `json:"deleted"`          // blocks removed on request (bad copies)
	Unhealthy      uint64 `json:"unhealthy"`        // transitions to unhealthy
	ScannedBlocks  int    `json:"scanned_blocks"`   // blocks found by the start-up scan
	ScanRemoved    int    `json:"scan_removed"`     // leftovers removed by the start-up scan
	RetriedIOCalls uint64 `json:"retried_io_calls"` // transient failures retried
	// ChoreFailures is housekeeping I/O that failed (fs segments layout):
	// a segment's seal (its footer; at start, a torn segment's) or its
	// removal. Blocks are not lost by it: an unsealed segment is walked and
	// sealed at the next start, a file left behind is rescanned.
	ChoreFailures uint64 `json:"chore_failures"`
	// ChoresFull are the ChoreFailures for lack of room (ENOSPC).
	ChoresFull uint64 `json:"chores_full"`

	// The P2P tier's: lookups it was asked, the PeerLookup messages they
	// sent (the directory's saving), and its directory's size.
	LookupCalls    uint64 `json:"lookup_calls,omitempty"`    // TierLookup calls
	PeerAsks       uint64 `json:"peer_asks,omitempty"`       // peers asked, summed over lookups
	DirectoryKeys  int    `json:"directory_keys,omitempty"`  // keys the directory records, all peers
	DirectoryBytes int64  `json:"directory_bytes,omitempty"` // its approximate memory
}

// AsyncLookup asks the tiering actor about keys the CPU tier answered MISS
// for. It answers at once: RETRY for keys whose secondary lookup or
// promotion is in flight (or was just started), MISS for keys known absent
// from every tier Req may load from, or whose lookup passed its deadline.
type AsyncLookup struct {
	Corr   uint64
	Req    *ReqContext // the request (its TierFilter, and provenance for the stored event)
	Keys   []Key       // the CPU tier's MISS keys, in prefix order
	Prefix bool        // keys are the tail of a prefix scan: promote only a found prefix
}

// AsyncLookupResult answers AsyncLookup: Retry or Miss per key.
type AsyncLookupResult struct {
	Corr   uint64
	Status []LookupStatus
}

// Cascade tells the tiering actor that Keys became readable in the CPU tier
// (a successful store commit) with Checksums. Fire and forget: the tiering
// actor pins, writes and unpins on its own, shedding past its queue bound.
type Cascade struct {
	Keys      []Key
	Checksums []uint32
	Ctx       *ReqContext
}

// TieringIdle asks to be answered once the tiering actor has no lookup,
// promotion or cascade in flight (answered at once when idle). For
// simulators and tests that need a settled node; the engine never waits.
type TieringIdle struct {
	Reply Reply[struct{}]
}

// GetTieringStats asks the tiering actor for its counters and every
// secondary tier's.
type GetTieringStats struct {
	Reply Reply[TieringStats]
}

// TieringStats is a snapshot of the tiering actor and its tiers.
type TieringStats struct {
	Tiers []SecondaryStats `json:"tiers"` // in configured order

	LookupsStarted      uint64            `json:"lookups_started"`      // keys whose secondary lookup was started
	LookupsTimedOut     uint64            `json:"lookups_timed_out"`    // keys whose lookup passed its deadline
	LookupsUnavailable  uint64            `json:"lookups_unavailable"`  // tier lookup answers that were errors (tier unhealthy); counted as absent
	Retries             uint64            `json:"retries"`              // keys answered RETRY
	NegativeHits        uint64            `json:"negative_hits"`        // keys answered MISS from the negative cache
	Promoted            map[string]uint64 `json:"promoted"`             // blocks promoted into the CPU tier, by source tier
	PromotionsFailed    map[string]uint64 `json:"promotions_failed"`    // promotions that failed (I/O, corrupt), by tier
	PromotionsFull      uint64            `json:"promotions_full"`      // promotions refused: no CPU slots
	PromotionsBusy      uint64            `json:"promotions_busy"`      // promotion reads the tier refused for back-pressure (asked again later, never marked absent)
	PromotionsReaped    uint64            `json:"promotions_reaped"`    // promotion jobs past their deadline
	CascadeWritten      map[string]uint64 `json:"cascade_written"`      // blocks written by cascades, by tier
	CascadeDropped      map[string]uint64 `json:"cascade_dropped"`      // cascade writes shed (queue full, unhealthy, evicted first), by tier
	CascadeFailed       map[string]uint64 `json:"cascade_failed"`       // cascade writes that failed in the tier, by tier
	CascadesReaped      uint64            `json:"cascades_reaped"`      // cascade jobs past their deadline
	InFlightLookups     int               `json:"in_flight_lookups"`    // keys with a lookup in flight
	InFlightPromotions  int               `json:"in_flight_promotions"` // keys being promoted
	InFlightCascades    int               `json:"in_flight_cascades"`   // (key, tier) cascade writes in flight
	NegativeEntries     int               `json:"negative_entries"`     // keys in the negative cache
	LookupDeadline      time.Duration     `json:"lookup_deadline_ns"`
	CascadeQueuePerTier int               `json:"cascade_queue_per_tier"`
}

package messages

import (
	"time"
)

// What the node reports of its secondary tiers and the tiering actor (the
// stats API). Their protocols live beside them: the secondary-tier contract
// in tiers/tiermsg, the tiering actor's in tiers/tiering/tieringmsg.

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

	// The P2P tier's: lookups it was asked, the peermsg.Lookup messages they
	// sent (the directory's saving), and its directory's size.
	LookupCalls    uint64 `json:"lookup_calls,omitempty"`    // tiermsg.Lookup calls
	PeerAsks       uint64 `json:"peer_asks,omitempty"`       // peers asked, summed over lookups
	DirectoryKeys  int    `json:"directory_keys,omitempty"`  // keys the directory records, all peers
	DirectoryBytes int64  `json:"directory_bytes,omitempty"` // its approximate memory
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

package messages

import (
	"time"
)

// Messages between the P2P tier (tiers/p2p), the peer sessions and the
// control plane (peer/), and the batched read the tiering actor sends to a
// tier that wants whole promotions at once (the P2P tier: one Fetch round
// per peer, not one per block).

// TierReadBatch asks a batched tier to read Keys into the reserved Slots
// (Dests[i] is slot Slots[i]'s memory) and verify each block. The caller
// keeps the reservation until the answer arrives.
type TierReadBatch struct {
	Corr  uint64
	Keys  []Key
	Slots []int    // reserved CPU slot per key
	Dests [][]byte // slot memory per key
}

// TierReadBatchResult answers TierReadBatch, per key. The tier answers only
// once nothing of the batch can touch Dests any more.
type TierReadBatchResult struct {
	Corr      uint64
	Checksums []uint32      // verified CRC32C per key (valid where Errs[i] == nil)
	Errs      []error       // per key: nil = read and verified
	Source    []string      // per key: where it came from (peer node id), for stats and logs
	Prov      []*Provenance // per key: the provenance the source sent (nil: unknown); may be empty
}

// PeerLookup asks one peer which Keys it holds (one Lookup round). The
// session answers PeerLookupResult to the sender.
type PeerLookup struct {
	Corr uint64
	Keys []Key
}

// PeerLookupResult answers PeerLookup. Hits are leased to Round at the
// producer until a PeerFetch, a PeerRelease, or the producer's lease TTL.
type PeerLookupResult struct {
	Corr      uint64
	Node      string
	Round     uint64
	Hits      []bool        // per key
	Checksums []uint32      // per key, committed CRC32C at the producer (hits only)
	Prov      []*Provenance // per key, what the producer knows of a hit's origin (nil: unknown); may be empty
	Err       error         // ErrPeerUnavailable, ErrPeerTimeout, ErrPeerRefused: Hits all false
	RTT       time.Duration
}

// PeerFetch asks the session to fetch leased hits of Round into the
// consumer's reserved Slots. Checksums are the producer's, from the lookup:
// every block is verified against them before it is reported OK.
type PeerFetch struct {
	Corr      uint64
	Round     uint64
	Keys      []Key
	Slots     []int
	Checksums []uint32
}

// PeerFetchResult answers PeerFetch, sent only once the data plane no longer
// touches Slots.
type PeerFetchResult struct {
	Corr     uint64
	Node     string
	Round    uint64
	OK       []bool // per key: in place and verified
	Bytes    int64
	Err      error // the round's failure (all OK false), nil on success
	Duration time.Duration
}

// PeerRelease tells the session the consumer will not fetch Round: the
// producer's leases end now (an Abort frame), not at their TTL. No reply.
type PeerRelease struct {
	Round uint64
}

// PeerStats are one peer's counters, as seen by this node.
type PeerStats struct {
	Node       string `json:"node"`
	Ready      bool   `json:"ready"`       // outbound session ready (we can fetch from it)
	Serving    bool   `json:"serving"`     // inbound session ready (we serve it)
	Lookups    uint64 `json:"lookups"`     // keys we asked it for
	Hits       uint64 `json:"hits"`        // keys it had
	Fetched    uint64 `json:"fetched"`     // blocks fetched and verified
	FetchBytes uint64 `json:"fetch_bytes"` // bytes fetched
	Failures   uint64 `json:"failures"`    // rounds that failed (timeout, refused, corrupt, gone)
	Corrupt    uint64 `json:"corrupt"`     // blocks that failed their checksum
	Served     uint64 `json:"served"`      // blocks we wrote into its pool
	FetchNanos uint64 `json:"fetch_ns"`    // total fetch latency, for a mean
	Fetches    uint64 `json:"fetches"`     // fetch rounds completed
	Resets     uint64 `json:"resets"`      // times its ready outbound session was lost
}

// GetPeerStats asks the control plane for every peer's counters.
type GetPeerStats struct {
	Reply Reply[[]PeerStats]
}

// AwaitPeers asks the P2P tier to answer once every node in Nodes has a
// ready session (at once if they have). For tests, benchmarks and start-up
// probes; the engine never waits for peers.
type AwaitPeers struct {
	Nodes []string
	Reply Reply[struct{}]
}

// PeerShutdown asks the control plane to stop serving and using peers:
// new rounds are refused (lookups answered as misses), rounds in flight
// may finish until Deadline and are aborted then, every session says Bye
// and releases what peers' rounds hold in the CPU tier. Answered once every
// session is done (at the latest shortly after Deadline).
type PeerShutdown struct {
	Deadline time.Time
	Reply    Reply[PeerShutdownResult]
}

// PeerShutdownResult says how the peer shutdown went.
type PeerShutdownResult struct {
	Sessions int // sessions drained
	Aborted  int // rounds still in flight at the deadline, aborted
}

// ProbePeer asks one peer, through its session, which of Keys it holds
// now (a Lookup round whose leases are released at once). An operator and
// benchmark probe of what a peer would answer; it promotes nothing.
type ProbePeer struct {
	Node  string
	Keys  []Key
	Reply Reply[[]bool]
}

// Package peermsg is the peers' protocol inside a node: the P2P tier's
// rounds with the peer sessions (Lookup, Fetch, Release), and the node's
// requests to the control plane (stats, readiness, shutdown, probes).
// What crosses the network is peer/wire's, not this.
//
// It owns the message types only: the sessions and the P2P tier own their
// logic, and the public vocabulary (keys, errors, peer stats) is messages'.
package peermsg

import (
	"time"

	"github.com/kvtier/kvtier/messages"
)

// Message is a message of this protocol (sealed: only this package's
// types are).
type Message interface{ peerMessage() }

func (*Lookup) peerMessage()         {}
func (*LookupResult) peerMessage()   {}
func (*Fetch) peerMessage()          {}
func (*FetchResult) peerMessage()    {}
func (*Release) peerMessage()        {}
func (*GetStats) peerMessage()       {}
func (*AwaitPeers) peerMessage()     {}
func (*Shutdown) peerMessage()       {}
func (*ShutdownResult) peerMessage() {}
func (*Probe) peerMessage()          {}

// Lookup asks one peer which Keys it holds (one Lookup round). The
// session answers LookupResult to the sender.
type Lookup struct {
	Corr uint64
	Keys []messages.Key
}

// LookupResult answers Lookup. Hits are leased to Round at the
// producer until a Fetch, a Release, or the producer's lease TTL.
type LookupResult struct {
	Corr      uint64
	Node      string
	Round     uint64
	Hits      []bool                 // per key
	Checksums []uint32               // per key, committed CRC32C at the producer (hits only)
	Prov      []*messages.Provenance // per key, what the producer knows of a hit's origin (nil: unknown); may be empty
	// Sizes is, per key, a hit's length in bytes (0 for a miss); nil when
	// every hit is the consumer's slot size. A block sits at the start of
	// its slot: one larger than a slot of ours is never a hit here.
	Sizes []int
	Err   error // ErrPeerUnavailable, ErrPeerTimeout, ErrPeerRefused: Hits all false
	RTT   time.Duration
}

// Fetch asks the session to fetch leased hits of Round into the
// consumer's reserved Slots. Checksums are the producer's, from the lookup:
// every block is verified against them before it is reported OK.
type Fetch struct {
	Corr      uint64
	Round     uint64
	Keys      []messages.Key
	Slots     []int
	Checksums []uint32
	// Sizes is each block's length in bytes, as the LookupResult said (nil,
	// or an entry of 0: the slot size); each is checked against its
	// checksum at that length.
	Sizes []int
}

// FetchResult answers Fetch, sent only once the data plane no longer
// touches Slots.
type FetchResult struct {
	Corr     uint64
	Node     string
	Round    uint64
	OK       []bool // per key: in place and verified
	Bytes    int64  // the verified blocks' bytes (each at its own length)
	Err      error  // the round's failure (all OK false), nil on success
	Duration time.Duration
}

// Release tells the session the consumer will not fetch Round: the
// producer's leases end now (an Abort frame), not at their TTL. No reply.
type Release struct {
	Round uint64
}

// GetStats asks the control plane for every peer's counters.
type GetStats struct {
	Reply messages.Reply[[]messages.PeerStats]
}

// AwaitPeers asks the P2P tier to answer once every node in Nodes has a
// ready session (at once if they have). For tests, benchmarks and start-up
// probes; the engine never waits for peers.
type AwaitPeers struct {
	Nodes []string
	Reply messages.Reply[struct{}]
}

// Shutdown asks the control plane to stop serving and using peers:
// new rounds are refused (lookups answered as misses), rounds in flight
// may finish until Deadline and are aborted then, every session says Bye
// and releases what peers' rounds hold in the CPU tier. Answered once every
// session is done (at the latest shortly after Deadline).
type Shutdown struct {
	Deadline time.Time
	Reply    messages.Reply[ShutdownResult]
}

// ShutdownResult says how the peer shutdown went.
type ShutdownResult struct {
	Sessions int // sessions drained
	Aborted  int // rounds still in flight at the deadline, aborted
}

// Probe asks one peer, through its session, which of Keys it holds
// now (a Lookup round whose leases are released at once). An operator and
// benchmark probe of what a peer would answer; it promotes nothing.
type Probe struct {
	Node  string
	Keys  []messages.Key
	Reply messages.Reply[[]bool]
}

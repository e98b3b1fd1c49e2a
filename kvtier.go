// Package kvtier is the public face of a kvtier node: Open starts one inside
// the calling process (the same actors the daemon runs), Node.Manager is the
// engine-facing API, Node.Close shuts it down within a deadline.
//
// The package is a facade: the node's wiring lives in node, its
// configuration in config, its metrics in node/metrics. It holds no
// state of its own and exports no internal type.
package kvtier

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/engine"
	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/node"
)

// Manager is the API an inference engine's scheduler calls (engine.Manager,
// where it is documented call by call): the embedded node's Manager() and
// the standalone daemon's Go client implement it.
type Manager = engine.Manager

// SlotMemory is the CPU pool's bytes, addressed by slot index
// (engine.SlotMemory).
type SlotMemory = engine.SlotMemory

var (
	// ErrDuplicateNode: Open found another live node registered under this
	// node's id in etcd discovery.
	ErrDuplicateNode = node.ErrDuplicateNode
	// ErrNoPeers: the node has no peers configured.
	ErrNoPeers = node.ErrNoPeers
	// ErrNoSecondaryTiers: the node has no secondary tier configured.
	ErrNoSecondaryTiers = node.ErrNoSecondaryTiers
)

// Node is a running kvtier node.
type Node struct{ n *node.Node }

// Open validates cfg, maps the CPU pool and starts the node's actors. Its
// components open in order (pool, engine endpoint, events, peers, tiers,
// actors); if one fails, those already open close in reverse.
func Open(ctx context.Context, cfg Config) (*Node, error) {
	n, err := node.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Node{n: n}, nil
}

// AwaitEngineBlockBytes serves cfg's engine address before Open, for a
// daemon started with no block size: it returns the bytes per block the
// first engine's hello declares (rounded up to a page; every call is
// answered SIZING meanwhile, and an engine says hello again) and closes the
// socket, so that Open with that BlockBytes binds the same address.
func AwaitEngineBlockBytes(ctx context.Context, cfg Config) (int, error) {
	return node.AwaitEngineBlockBytes(ctx, cfg)
}

// Close shuts the node down within ctx (the node's call timeout when ctx
// has no deadline): intake stops, engine jobs and peer rounds drain until
// nine tenths of ctx, sessions say Bye, events are flushed, the actors stop,
// and the pool is unmapped once nothing can read it. Calls after the first
// return the first's result.
func (n *Node) Close(ctx context.Context) error { return n.n.Close(ctx) }

// Manager returns the engine-facing API.
func (n *Node) Manager() Manager { return n.n.Manager() }

// Registry is the node's private Prometheus registry.
func (n *Node) Registry() *prometheus.Registry { return n.n.Registry() }

// EngineAddr is the engine endpoint's bound address ("" without one); a tcp
// port of 0 is resolved.
func (n *Node) EngineAddr() string { return n.n.EngineAddr() }

// PeerAddr is the control plane's bound address ("" without peers).
func (n *Node) PeerAddr() string { return n.n.PeerAddr() }

// PeerStats returns every known peer's counters (ErrNoPeers without peers).
func (n *Node) PeerStats(ctx context.Context) ([]messages.PeerStats, error) {
	return n.n.PeerStats(ctx)
}

// WaitPeers returns once this node has a ready session to every one of
// nodes (it can fetch from them), or ctx ends.
func (n *Node) WaitPeers(ctx context.Context, nodes ...string) error {
	return n.n.WaitPeers(ctx, nodes...)
}

// ProbePeer asks peer node which of keys it holds right now, through this
// node's session with it; nothing is promoted and the peer's leases are
// released at once. For operators and benchmarks.
func (n *Node) ProbePeer(ctx context.Context, peer string, keys []messages.Key) ([]bool, error) {
	return n.n.ProbePeer(ctx, peer, keys)
}

// TieringIdle waits until the tiering actor has no secondary lookup,
// promotion or cascade in flight, or ctx ends; without secondary tiers it
// returns at once. Simulators and tests use it to settle a node.
func (n *Node) TieringIdle(ctx context.Context) error { return n.n.TieringIdle(ctx) }

// TieringStats returns the tiering actor's counters and each secondary
// tier's (ErrNoSecondaryTiers without any).
func (n *Node) TieringStats(ctx context.Context) (messages.TieringStats, error) {
	return n.n.TieringStats(ctx)
}

// Inventory returns, by medium ("cpu", "disk", "object", "peer"), the blocks
// the node's tiers hold readable now: what its KV events announce as stored
// and not removed.
func (n *Node) Inventory(ctx context.Context) (map[string][]messages.Key, error) {
	return n.n.Inventory(ctx)
}

// VerifyBlock recomputes a resident block's CRC32C and compares it with the
// checksum taken at its commit; a mismatch drops the block and returns an
// error wrapping messages.ErrChecksum, an absent key messages.ErrUnknownKey.
func (n *Node) VerifyBlock(ctx context.Context, key messages.Key) error {
	return n.n.VerifyBlock(ctx, key)
}

// FlushEvents publishes the events hub's open batch once every event
// announced before the call is translated, and returns the sequence number
// the next batch will get. Without events it returns 0.
func (n *Node) FlushEvents(ctx context.Context) (next uint64, err error) {
	return n.n.FlushEvents(ctx)
}

// EventsEndpoint is the bound PUB address of the node's KV events, "" when
// events are off.
func (n *Node) EventsEndpoint() string { return n.n.EventsEndpoint() }

// EventsReplayEndpoint is the bound replay ROUTER address, "" without one.
func (n *Node) EventsReplayEndpoint() string { return n.n.EventsReplayEndpoint() }

// EventsCounters are the events hub's counters (zero when events are off).
func (n *Node) EventsCounters() *events.Counters { return n.n.EventsCounters() }

// EventsHashFormat is how the node's events write block hashes ("int" or
// "bytes"; "" is the default, int).
func (n *Node) EventsHashFormat() string { return n.n.EventsHashFormat() }

// Topology is the actors a node runs, in spawn order, with who sends to whom.
type Topology = node.Topology

// Component is one actor of a Topology.
type Component = node.Component

// PlanTopology is the actors a node opened with cfg runs, in spawn order.
func PlanTopology(cfg Config) (Topology, error) { return node.PlanTopology(cfg) }

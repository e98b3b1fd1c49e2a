package node

// Standalone mode: the node side of the engine endpoint (docs/DESIGN.md
// §3.2). With Config.EngineListen set, Open binds the
// endpoint before any actor starts (a bad address fails Open), the guardian
// spawns the endpoint actor beside the bridge, and Close stops the endpoint
// before anything else so no engine call arrives during the drain.

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/endpoint"
	"github.com/kvtier/kvtier/scheduler/wire"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/cpu"
	"github.com/kvtier/kvtier/tiers/cpu/residency"
	"github.com/kvtier/kvtier/tiers/fs"
)

// EngineAddr is the engine endpoint's bound address ("" without one); a tcp
// port of 0 is resolved.
func (n *Node) EngineAddr() string {
	if n.endpoint == nil {
		return ""
	}
	return n.endpoint.Addr()
}

// openIndex creates the residency index beside the pool (standalone mode:
// engines in other processes read it) and makes the CPU tier's State
// publish into it. A fresh file every time: a restarted daemon's index has
// a new inode, so an engine never reads a dead daemon's table as the new
// one's.
func (n *Node) openIndex(state *cpu.State, slots int) error {
	if n.cfg.EngineListen == "" {
		return nil
	}
	capacities := []int{indexKeys(slots, n.cfg.BlockBytes)}
	for _, tc := range n.cfg.SecondaryTiers {
		if tc.Kind == tiers.KindFS && len(capacities) < residency.MaxRegions {
			capacities = append(capacities, fsIndexCapacity(int64(tc.Capacity), n.cfg.BlockBytes, slots))
		}
	}
	idx, err := residency.Create(n.cfg.PoolPath+".index", capacities)
	if err != nil {
		return fmt.Errorf("kvtier: residency index: %w", err)
	}
	n.index = idx
	state.SetObserver(residency.NewKeys(idx.Region(0), residency.StateCPU))
	return nil
}

// maxFSIndexKeys bounds an fs tier's region (16 bytes of index a key): an
// fs tier larger than that is advertised in part (a block left out costs
// a recompute, the index being a hint).
const maxFSIndexKeys = 1 << 21

// fsIndexCapacity is how many keys an fs tier's region is sized for: its
// capacity in blocks (indexKeys), or four times the pool for an unbounded
// tier.
func fsIndexCapacity(capacity int64, blockBytes, slots int) int {
	n := int64(4 * slots)
	if capacity > 0 {
		n = int64(indexKeys(int(min(capacity/int64(blockBytes), maxFSIndexKeys)), blockBytes))
	}
	return int(max(1, min(n, maxFSIndexKeys)))
}

// smallerSizes is how much smaller than the first block size the index's
// regions are sized for. A pool that also serves a smaller size holds
// more blocks than it has slots of the first (four times as many at a
// quarter of the size), and a key a full region drops is a recompute for
// an engine that trusts the index (index_complete). Costs the index 16 to
// 32 bytes a key (a region is a power of two of buckets at a load of at
// most one half): with blocks of 16 KiB, 0.4 to 0.8 % of the pool; with
// blocks of a page, nothing more than before.
const smallerSizes = 4

// indexKeys is how many keys n blocks of blockBytes may become in sizes
// down to a quarter of it, never below a page (a declared size is served
// rounded up to one).
func indexKeys(n, blockBytes int) int {
	return n * max(1, min(smallerSizes, blockBytes/endpoint.SlotAlign))
}

// fsObserver is the publisher of the i-th fs tier's region, nil when it
// has none (no index, or more fs tiers than regions).
func (n *Node) fsObserver(i int) fs.Observer {
	if n.index == nil || i+1 >= n.index.Regions() {
		return nil
	}
	return residency.NewKeys(n.index.Region(i+1), residency.StateSecondary)
}

// indexComplete: the index covers every tier a lookup may find a block in
// (the CPU tier and every fs tier; no object tier, no peer), so a key it
// lacks is a MISS an engine may answer by itself.
func (n *Node) indexComplete() bool {
	fsTiers := 0
	for _, tc := range n.cfg.SecondaryTiers {
		if tc.Kind != tiers.KindFS {
			return false
		}
		fsTiers++
	}
	return n.index != nil && fsTiers+1 <= n.index.Regions() && !n.cfg.Peers.Enabled()
}

func (n *Node) closeIndex() {
	if n.index != nil {
		_ = n.index.Close()
	}
}

// openEndpoint restricts the pool file and binds the engine endpoint, when
// the config asks for one.
func (n *Node) openEndpoint() error {
	c := n.cfg
	if c.EngineListen == "" {
		return nil
	}
	gid, mode, err := engineAccess(c.EngineGroup)
	if err != nil {
		return err
	}
	// The pool holds cached KV: only the owner (and the configured group)
	// may map it.
	if gid >= 0 {
		if err := os.Chown(c.PoolPath, -1, gid); err != nil {
			return fmt.Errorf("kvtier: pool file group: %w", err)
		}
	}
	if err := os.Chmod(c.PoolPath, mode); err != nil {
		return fmt.Errorf("kvtier: pool file mode: %w", err)
	}
	if err := restrict(n.index.Path(), gid, mode); err != nil {
		return fmt.Errorf("kvtier: residency index: %w", err)
	}
	clock := c.EngineClock
	if clock == nil {
		clock = supervision.RealClock{}
	}
	ep, err := endpoint.New(endpoint.Config{
		Listen:      endpoint.ListenOptions{Addr: c.EngineListen, AllowRemote: c.EngineAllowRemote, Mode: mode, GID: gid, Poll: c.EnginePoll},
		Clock:       clock,
		NodeClock:   c.Clock,
		Grace:       c.EngineGrace,
		CallTimeout: c.CallTimeout,
		Hello: wire.Hello{PoolPath: n.pool.Path(), BlockBytes: n.pool.BlockBytes(), Slots: n.pool.Slots(),
			Namespace: messages.Namespace(c.Namespace), JobWorkers: c.JobWorkers, IndexPath: n.index.Path(),
			IndexComplete: n.indexComplete()},
		Geometry:   n.engineGeometry,
		Geometries: n.pool.Geometries,
		Log:        c.Logger.With().Str("actor", "endpoint").Logger(),
	})
	if err != nil {
		return err
	}
	n.endpoint = ep
	return nil
}

// restrict gives a file engines map the engine socket's group and mode.
func restrict(path string, gid int, mode os.FileMode) error {
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			return err
		}
	}
	return os.Chmod(path, mode)
}

// engineAccess resolves engine_group to a gid (-1 without one) and the file
// mode of the socket and the pool.
func engineAccess(group string) (int, os.FileMode, error) {
	gid, err := config.EngineGroupID(group)
	switch {
	case err != nil:
		return 0, 0, err
	case gid < 0:
		return -1, 0o600, nil
	}
	return gid, 0o660, nil
}

// endpointProps builds the engine endpoint's actor (it calls the bridge).
func (n *Node) endpointProps(w wiring) *actor.Props {
	if n.endpoint == nil {
		w.fail(errors.New("engine endpoint planned but not opened"))
		return nil
	}
	w.to("bridge") // Start wires it (startEndpoint)
	w.to("events") // and the hub, where there is one (AnnounceTo)
	return n.endpoint.Props()
}

// startEndpoint begins serving once the actors are up, and registers the
// endpoint's metrics.
func (n *Node) startEndpoint(pids map[string]*actor.PID) {
	if n.endpoint == nil {
		return
	}
	if hub := pids["events"]; hub != nil {
		n.endpoint.AnnounceTo(hub)
	}
	n.endpoint.Start(n.system, pids["endpoint"], pids["bridge"])
}

// closeEndpoint stops engine intake from the socket (first step of Close).
func (n *Node) closeEndpoint() error {
	if n.endpoint == nil {
		return nil
	}
	if err := n.endpoint.Close(); err != nil {
		return fmt.Errorf("close engine endpoint: %w", err)
	}
	return nil
}

// registerEndpointMetrics adds the endpoint's metrics to the node registry.
func (n *Node) registerEndpointMetrics() {
	if n.endpoint != nil {
		n.registry.MustRegister(n.endpoint.Collectors()...)
	}
}

// AwaitEngineBlockBytes serves cfg's engine address before a node opens,
// for a daemon that sizes its slots from the first engine: it returns the
// bytes per block the first engine's hello declares (rounded up to a page),
// answering every call SIZING meanwhile, and closes the socket so that
// Open can bind the address. cfg must name an engine address.
func AwaitEngineBlockBytes(ctx context.Context, cfg config.Config) (int, error) {
	if cfg.EngineListen == "" {
		return 0, fmt.Errorf("%w: sizing slots from an engine needs engine_listen", messages.ErrBadConfig)
	}
	gid, mode, err := engineAccess(cfg.EngineGroup)
	if err != nil {
		return 0, err
	}
	log := zerolog.Nop()
	if cfg.Logger != nil {
		log = cfg.Logger.With().Str("component", "sizing").Logger()
	}
	return endpoint.AwaitBlockBytes(ctx, endpoint.ListenOptions{Addr: cfg.EngineListen,
		AllowRemote: cfg.EngineAllowRemote, Mode: mode, GID: gid}, log)
}

// engineGeometry is the pool's region for an engine that declared blocks of
// blockBytes: the region of exactly that size when the pool has one, else
// of that size rounded up to a page (made now). Every region is the pool
// file, already given the engine socket's group and mode.
func (n *Node) engineGeometry(blockBytes int) (endpoint.Geometry, error) {
	r, ok := n.pool.Region(blockBytes)
	if !ok {
		var err error
		if r, err = n.pool.Geometry(roundUp(blockBytes, endpoint.SlotAlign)); err != nil {
			return endpoint.Geometry{}, err
		}
	}
	return endpoint.Geometry{BlockBytes: r.BlockBytes, Base: r.Base, Slots: r.Slots, Path: r.Path}, nil
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }

// Package node wires a kvtier node: it maps the CPU pool, plans the actors
// from the topology table (topology.go), spawns and stops them in order,
// opens and closes the sockets and tiers around them, and serves the
// embedded engine API over their messages. It holds no tier or request
// state itself (that lives in the actors, reached only by messages) and is
// reached from outside only through the kvtier facade.
package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/node/metrics"
	"github.com/kvtier/kvtier/peer/peermsg"
	"github.com/kvtier/kvtier/scheduler"
	"github.com/kvtier/kvtier/scheduler/endpoint"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/cpu"
	"github.com/kvtier/kvtier/tiers/cpu/residency"
)

// Node is a running kvtier node.
type Node struct {
	cfg      config.Config
	system   *actor.ActorSystem
	dispatch *actors.WarmDispatcher // runs the actors' mailboxes
	guardian *actor.PID
	bridge   *actor.PID
	pool     *cpu.Pool
	index    *residency.File // standalone mode: the residency index engines read (standalone.go)
	restarts atomic.Uint64
	registry *prometheus.Registry
	metrics  *metrics.Node
	manager  *embedded
	endpoint *endpoint.Endpoint // standalone mode only (standalone.go)
	cpu      *actor.PID
	state    *cpu.State     // the CPU tier's, its actor's to touch once spawned
	plan     []planned      // the actors, in spawn order (topology.go)
	offload  actors.Offload // the actors' reads of slot memory off their mailboxes
	events   eventsState    // KV events (node_events.go)
	tiers    tiersState     // secondary tiers (node_tiers.go)
	peers    peersState     // peers: P2P tier, control and data planes (node_peers.go)

	closeOnce sync.Once
	closeErr  error
	closing   chan struct{} // closed when Close begins: engine intake stops
	stopped   chan struct{} // closed once the actors were stopped: calls fail fast
}

// Open validates cfg, maps the CPU pool and starts the node's actors. Its
// components open in order (pool, engine endpoint, events, peers, tiers,
// actors); if one fails, those already open close in reverse.
func Open(ctx context.Context, cfg config.Config) (_ *Node, err error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var undo undoStack
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	slots := int(cfg.PoolBytes / int64(cfg.BlockBytes))
	pool, err := cpu.OpenPool(cfg.PoolPath, slots, cfg.BlockBytes)
	if err != nil {
		return nil, fmt.Errorf("kvtier: open pool: %w", err)
	}
	undo.push(func() { _ = pool.Close() })
	// NB: leases expire on the clock's monotonic time: a wall clock stepped
	// by NTP must neither end a HIT's lease early nor extend it.
	state, err := cpu.NewBudgetState(pool.Budget(), cfg.BlockBytes, cfg.Policy, supervision.Steady(cfg.Clock))
	if err != nil {
		return nil, err
	}
	// NB: a local, not the named result: a failed return sets the result to
	// nil before the deferred undo runs, and the closes below need the node.
	n := &Node{cfg: cfg, pool: pool, closing: make(chan struct{}), stopped: make(chan struct{})}
	if err := n.openIndex(state, slots); err != nil {
		return nil, err
	}
	undo.push(n.closeIndex)
	for _, c := range []struct {
		open  func() error
		close func()
	}{
		{n.openEndpoint, func() { _ = n.closeEndpoint() }},
		{n.openEvents, func() { _ = n.closeEvents(ctx) }},
		{n.openPeers, func() { _ = n.closePeers() }},
		{n.openTiers, func() { _ = n.closeTiers(ctx) }}, // a failed openTiers closes what it opened
		{func() error { return n.start(ctx, state) }, nil},
		{func() error { n.startLearning(); return nil }, n.stopLearning},
	} {
		if err := c.open(); err != nil {
			return nil, err
		}
		if c.close != nil {
			undo.push(c.close)
		}
	}
	n.manager = &embedded{node: n}
	n.registry, n.metrics = metrics.New(n.manager.Stats, cfg.CallTimeout)
	n.registerEndpointMetrics()
	n.registerEventsMetrics()
	if n.tiers.tiering != nil {
		metrics.RegisterTiers(n.registry, n.TieringStats, cfg.CallTimeout)
	}
	if n.peers.counters != nil {
		metrics.RegisterPeers(n.registry, n.peers.counters, n.peers.transport, n.peers.discovery)
	}
	cfg.Logger.Info().Str("pool", pool.Path()).Int("slots", slots).Int("block_bytes", cfg.BlockBytes).
		Str("policy", cfg.Policy).Msg("kvtier node open")
	return n, nil
}

// start plans the node's actors (topology.go), wires their PIDs and spawns
// them under the guardian, in spawn order.
func (n *Node) start(ctx context.Context, state *cpu.State) error {
	plan, err := plan(n.cfg, table)
	if err != nil {
		return err
	}
	n.system = actors.NewSystem(*n.cfg.Logger)
	supervision.AttachFaults(n.system, n.cfg.Faults) // chaos tests only; nil: nothing
	n.state, n.plan = state, plan
	n.cpu, n.events.hub = n.pidOf("cpu"), n.pidIf("events")
	n.tiers.tiering, n.peers.tier, n.peers.plane = n.pidIf("tiering"), n.pidIf("p2p"), n.pidIf("peers")
	children, err := n.children()
	if err != nil {
		n.system.Shutdown()
		return err
	}
	n.dispatch = actors.NewWarmDispatcher(actors.WarmWorkers, actors.Throughput)
	for _, c := range children {
		c.Props.Configure(actor.WithDispatcher(n.dispatch))
	}
	spawned := make(chan map[string]*actor.PID, 1)
	guardian, err := n.system.Root.SpawnNamed(actors.GuardianProps(children, spawned, &n.restarts, *n.cfg.Logger), guardianName)
	if err != nil {
		n.system.Shutdown()
		_ = n.dispatch.Close(ctx)
		return fmt.Errorf("spawn guardian: %w", err)
	}
	n.guardian = guardian
	select {
	case pids := <-spawned:
		if err := n.checkSpawned(pids); err != nil {
			n.stopActors(context.Background())
			return err
		}
		n.bridge = pids["bridge"]
		n.startEndpoint(pids)
		return nil
	case <-ctx.Done():
		n.stopActors(context.Background())
		return fmt.Errorf("start actors: %w", ctx.Err())
	}
}

// bridgeProps builds the bridge.
func (n *Node) bridgeProps(w wiring) *actor.Props {
	return scheduler.Props(scheduler.Config{
		CPU: fx.RefOf(w.to("cpu")), Slot: n.pool.Slot, Offload: &n.offload, Clock: n.cfg.Clock, LeaseTTL: n.cfg.LeaseTTL,
		Workers: n.cfg.JobWorkers, LoadTimeout: n.cfg.LoadJobTimeout, StoreTimeout: n.cfg.StoreJobTimeout,
		JobSeq: &atomic.Uint64{}, Counters: &scheduler.Counters{}, Restarts: &n.restarts,
		Tiering: fx.RefOf(w.to("tiering")),
		Log:     n.cfg.Logger.With().Str("actor", "bridge").Logger(),
	})
}

// Manager returns the engine-facing API.
func (n *Node) Manager() Manager { return n.manager }

// Registry is the node's private Prometheus registry.
func (n *Node) Registry() *prometheus.Registry { return n.registry }

// Close shuts the node down within ctx (the node's call timeout when ctx
// has no deadline), supervisor-ordered (docs/DESIGN.md §2.5):
//
//  1. stop intake: engine calls that start work are refused (ErrClosed),
//     and the control plane starts and accepts no new peer round;
//  2. drain engine jobs and peer rounds in flight, both at once, until the
//     drain deadline (nine tenths of what ctx leaves); then the bridge
//     reaps the engine jobs left and the plane aborts the rounds left. The
//     standalone endpoint stays open meanwhile, for the engine's reports;
//  3. release: every peer session says Bye and gives back what peers'
//     rounds hold in the CPU tier; pending KV events are flushed; the
//     engine endpoint closes;
//  4. stop the actors, and their timers with them;
//  5. close the events publisher, the data plane (its connections and the
//     pool's registration), the control sockets and the secondary tiers'
//     I/O workers;
//  6. unmap and remove the pool — only once nothing can touch it. If an
//     actor, a tier I/O worker (a stuck disk) or a transfer may still use a
//     slot, the pool stays mapped and the error says why.
//
// Close never waits past ctx: a dead or stopped peer costs at most the
// drain deadline, a stuck disk is reported rather than waited for. Only
// persistent tiers' files remain. Calls after the first return the first's
// result.
func (n *Node) Close(ctx context.Context) error {
	n.closeOnce.Do(func() { n.closeErr = n.shutdown(ctx) })
	return n.closeErr
}

func (n *Node) shutdown(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.CallTimeout)
		defer cancel()
	}
	close(n.closing)
	errs := n.drain(ctx)
	n.stopLearning()
	if err := n.flushEvents(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := n.closeEndpoint(); err != nil {
		errs = append(errs, err)
	}
	actorsErr := n.stopActors(ctx)
	if err := n.closeEvents(ctx); err != nil {
		errs = append(errs, err)
	}
	// NB: until all four are known stopped, something may still touch slot
	// memory — an actor, a checksum an actor runs off its mailbox, a tier
	// I/O worker copying into a slot, a transfer writing into one — so the
	// pool stays mapped (leaked) rather than risk a fault.
	stopped := []struct {
		what string
		err  error
	}{{"stop actors", actorsErr}, {"stop slot readers", n.offload.Close(ctx)},
		{"stop data plane", n.closePeers()}, {"stop tier I/O", n.closeTiers(ctx)}}
	mapped := false
	for _, s := range stopped {
		if s.err != nil {
			mapped = true
			errs = append(errs, fmt.Errorf("%s (pool left mapped): %w", s.what, s.err))
		}
	}
	if !mapped {
		errs = append(errs, n.pool.Close())
		n.closeIndex() // NB: the CPU tier wrote it; it is stopped
	}
	return errors.Join(errs...)
}

// drain is Close's second step: the bridge (engine jobs) and the control
// plane (peer rounds) stop intake and drain together until one deadline,
// then reap or abort what is left and answer. Waiting for their answers is
// bounded too, halfway into what ctx leaves after the deadline, so the
// steps after it keep their time even if an actor cannot answer.
func (n *Node) drain(ctx context.Context) []error {
	left := time.Until(deadlineOf(ctx))
	budget := left * 9 / 10
	wait, cancel := context.WithTimeout(ctx, budget+(left-budget)/2)
	defer cancel()
	type peerResult struct {
		res peermsg.ShutdownResult
		err error
	}
	peers := make(chan peerResult, 1)
	go func() {
		// NB: the plane and the bridge both read their deadline on the
		// node's clock.
		res, err := n.shutdownPeers(wait, n.cfg.Clock.Now().Add(budget))
		peers <- peerResult{res, err}
	}()
	var errs []error
	engineDeadline := n.cfg.Clock.Now().Add(budget)
	if _, err := call(wait, n, func(r messages.Reply[struct{}]) any {
		return &messages.Shutdown{Deadline: engineDeadline, Reply: r}
	}); err != nil {
		errs = append(errs, fmt.Errorf("drain engine jobs: %w", err))
	}
	p := <-peers
	switch {
	case errors.Is(p.err, messages.ErrClosed):
		// The peers were shut down before Close (or are being): nothing to add.
	case p.err != nil:
		errs = append(errs, fmt.Errorf("drain peers: %w", p.err))
	case n.peers.plane != nil:
		n.cfg.Logger.Info().Int("sessions", p.res.Sessions).Int("aborted_rounds", p.res.Aborted).Msg("kvtier peers drained")
	}
	return errs
}

// deadlineOf is ctx's deadline; ctx must have one.
func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// stopActors stops the actors in the reverse of their spawn order, each
// once it has processed what it was sent (an actor stops before those it
// sends to), then the guardian, the system and the dispatcher.
func (n *Node) stopActors(ctx context.Context) error {
	var err error
	if n.guardian != nil {
		for i := len(n.plan) - 1; i >= 0 && err == nil; i-- {
			err = actors.StopAndWait(ctx, n.system, n.pidOf(n.plan[i].Name))
		}
		if gerr := actors.StopAndWait(ctx, n.system, n.guardian); err == nil {
			err = gerr
		}
	}
	close(n.stopped)
	n.system.Shutdown()
	if derr := n.dispatch.Close(ctx); err == nil {
		err = derr
	}
	supervision.DetachFaults(n.system)
	return err
}

// undoStack holds the closes of what Open opened so far, run in reverse.
type undoStack []func()

func (u *undoStack) push(f func()) { *u = append(*u, f) }

func (u undoStack) run() {
	for i := len(u) - 1; i >= 0; i-- {
		u[i]()
	}
}

// Package kvtier is the public face of a kvtier node: Open starts one inside
// the calling process (the same actors the daemon runs), Node.Manager is the
// engine-facing API, Node.Close shuts it down within a deadline.
//
// The package wires actors, tiers and the bridge together and owns the node's
// lifecycle; it holds no tier or request state itself — that lives in the
// actors, reached only by messages.
package kvtier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/cpu"
)

// Node is a running kvtier node.
type Node struct {
	cfg      Config
	system   *actor.ActorSystem
	guardian *actor.PID
	bridge   *actor.PID
	pool     *cpu.Pool
	restarts atomic.Uint64
	registry *prometheus.Registry
	metrics  *nodeMetrics
	manager  *embedded
	endpoint *scheduler.Endpoint // standalone mode only (standalone.go)
	cpu      *actor.PID
	events   eventsState // KV events (node_events.go)
	tiers    tiersState  // secondary tiers (node_tiers.go)
	peers    peersState  // peers: P2P tier, control and data planes (node_peers.go)

	closeOnce sync.Once
	closeErr  error
	closing   chan struct{}
}

// Open validates cfg, maps the CPU pool and starts the node's actors.
func Open(ctx context.Context, cfg Config) (*Node, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	slots := int(cfg.PoolBytes / int64(cfg.BlockBytes))
	pool, err := cpu.OpenPool(cfg.PoolPath, slots, cfg.BlockBytes)
	if err != nil {
		return nil, fmt.Errorf("kvtier: open pool: %w", err)
	}
	state, err := cpu.NewState(slots, cfg.Policy, cfg.Clock.Now)
	if err != nil {
		pool.Close()
		return nil, err
	}
	n := &Node{cfg: cfg, pool: pool, closing: make(chan struct{})}
	if err := n.openEndpoint(); err != nil {
		pool.Close()
		return nil, err
	}
	if err := n.openEvents(); err != nil {
		_ = n.closeEndpoint()
		pool.Close()
		return nil, err
	}
	if err := n.openPeers(); err != nil {
		_ = n.closeEndpoint()
		_ = n.closeEvents(ctx)
		pool.Close()
		return nil, err
	}
	if err := n.start(ctx, state); err != nil {
		_ = n.closeTiers(ctx)
		_ = n.closePeers()
		_ = n.closeEndpoint()
		_ = n.closeEvents(ctx)
		pool.Close()
		return nil, err
	}
	n.manager = &embedded{node: n}
	n.registry, n.metrics = newNodeMetrics(n.manager.Stats, cfg.CallTimeout)
	n.registerEndpointMetrics()
	n.registerEventsMetrics()
	n.registerTierMetrics()
	n.registerPeerMetrics()
	cfg.Logger.Info().Str("pool", pool.Path()).Int("slots", slots).Int("block_bytes", cfg.BlockBytes).
		Str("policy", cfg.Policy).Msg("kvtier node open")
	return n, nil
}

func (n *Node) start(ctx context.Context, state *cpu.State) error {
	log := *n.cfg.Logger
	if err := n.openTiers(); err != nil {
		return err
	}
	n.system = actors.NewSystem(log)
	supervision.AttachFaults(n.system, n.cfg.Faults) // chaos tests only; nil: nothing
	cpuPID := actor.NewPID(n.system.Address(), "kvtier/cpu")
	n.cpu = cpuPID
	hub := n.eventsChildren()
	tierKids := n.tierChildren(cpuPID)
	peerKids := n.peerChildren(cpuPID)
	counters, jobSeq := &scheduler.Counters{}, &atomic.Uint64{}
	children := []actors.Child{
		{Name: "cpu", Props: cpu.Props(state, n.pool, n.cfg.Clock.Now, log.With().Str("actor", "cpu").Logger(), n.cpuOptions()...)},
		{Name: "bridge", Props: scheduler.Props(scheduler.Config{
			CPU: cpuPID, Slot: n.pool.Slot, Clock: n.cfg.Clock, LeaseTTL: n.cfg.LeaseTTL,
			Workers: n.cfg.JobWorkers, LoadTimeout: n.cfg.LoadJobTimeout, StoreTimeout: n.cfg.StoreJobTimeout,
			JobSeq: jobSeq, Counters: counters, Restarts: &n.restarts,
			Tiering: n.tiers.tiering,
			Log:     log.With().Str("actor", "bridge").Logger(),
		})},
	}
	children = append(children, n.endpointChildren()...)
	children = append(children, tierKids...)
	children = append(children, peerKids...)
	children = append(hub, children...)
	spawned := make(chan map[string]*actor.PID, 1)
	guardian, err := n.system.Root.SpawnNamed(actors.GuardianProps(children, spawned, &n.restarts, log), "kvtier")
	if err != nil {
		n.system.Shutdown()
		return fmt.Errorf("spawn guardian: %w", err)
	}
	n.guardian = guardian
	select {
	case pids := <-spawned:
		if !pids["cpu"].Equal(cpuPID) {
			n.stopActors(context.Background())
			return fmt.Errorf("cpu tier spawned as %s, wired as %s", pids["cpu"], cpuPID)
		}
		if err := n.checkEvents(pids); err != nil {
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

// Manager returns the engine-facing API.
func (n *Node) Manager() Manager { return n.manager }

// Registry is the node's private Prometheus registry.
func (n *Node) Registry() *prometheus.Registry { return n.registry }

// Pool is the CPU tier's slot memory.
func (n *Node) Pool() *cpu.Pool { return n.pool }

// Close shuts the node down, supervisor-ordered: stop engine intake, drain
// engine jobs until ctx's deadline (reaping the rest), stop the actors,
// unmap and remove the pool. Calls after the first return the first's result.
func (n *Node) Close(ctx context.Context) error {
	n.closeOnce.Do(func() {
		close(n.closing)
		var errs []error
		// Standalone: no engine call may arrive from the socket from now on.
		if err := n.closeEndpoint(); err != nil {
			errs = append(errs, err)
		}
		if _, err := call(ctx, n, func(r messages.Reply[struct{}]) any {
			return &messages.Shutdown{Deadline: n.drainDeadline(ctx), Reply: r}
		}); err != nil {
			errs = append(errs, fmt.Errorf("drain: %w", err))
		}
		if err := n.flushEvents(ctx); err != nil {
			errs = append(errs, err)
		}
		if err := n.stopActors(ctx); err != nil {
			// NB: an actor may still be running and touch slot memory, so the
			// pool stays mapped (leaked) rather than risk a fault.
			errs = append(errs, fmt.Errorf("stop actors (pool left mapped): %w", err))
		} else if err := n.closeTiers(ctx); err != nil {
			// NB: likewise a tier I/O worker may still copy into a slot.
			errs = append(errs, fmt.Errorf("stop tier I/O (pool left mapped): %w", err))
		} else if err := n.closePeers(); err != nil {
			// NB: and a transfer may still be writing into a slot.
			errs = append(errs, fmt.Errorf("stop data plane (pool left mapped): %w", err))
		} else {
			errs = append(errs, n.pool.Close())
		}
		if err := n.closeEvents(ctx); err != nil {
			errs = append(errs, err)
		}
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}

func (n *Node) stopActors(ctx context.Context) error {
	var err error
	if n.guardian != nil {
		err = actors.StopAndWait(ctx, n.system, n.guardian)
	}
	n.system.Shutdown()
	supervision.DetachFaults(n.system)
	return err
}

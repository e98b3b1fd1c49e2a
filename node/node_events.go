package node

// The node's KV events (docs/PROTOCOL.md, "KV events"): the publisher's
// sockets open before the actors start, the hub actor is spawned first
// under the guardian, the CPU tier and the secondary tiers are handed its
// PID when the node spawns them, subscribers to engines' own KV events
// (events.learn_from) feed it what the engines announce, and Close stops
// those, flushes the hub after the bridge drained, then closes the sockets.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/node/metrics"
	"github.com/kvtier/kvtier/tiers"
)

// eventsState is the node's events wiring; zero when events are off.
type eventsState struct {
	pub      *events.Publisher
	hub      *actor.PID // wired before spawn, checked after
	counters events.Counters
	learning sync.WaitGroup     // one subscriber per events.learn_from endpoint
	unlearn  context.CancelFunc // stops them; nil when none runs
}

// openEvents binds the events sockets when configured.
func (n *Node) openEvents() error {
	c := n.cfg.Events
	if !c.Enabled() {
		return nil
	}
	log := n.cfg.Logger.With().Str("component", "events").Logger()
	pub, err := events.Listen(events.PublisherConfig{Endpoint: c.Endpoint, Mode: c.Mode, Replay: c.Replay, Topic: c.Topic,
		BufferBatches: c.BufferBatches, Linger: c.Linger, Log: log})
	if err != nil {
		return fmt.Errorf("kvtier: events: %w", err)
	}
	n.events.pub = pub
	return nil
}

// hubProps builds the KV-event hub.
func (n *Node) hubProps(w wiring) *actor.Props {
	if n.events.pub == nil {
		w.fail(errors.New("events planned but not opened"))
		return nil
	}
	format, _ := events.ParseHashFormat(n.cfg.Events.HashFormat) // validated
	encoding, _ := events.ParseEncoding(n.cfg.Events.Encoding)   // validated
	return events.HubProps(events.HubConfig{
		Format: format, SpecKind: n.cfg.Events.SpecKind, DPRank: int64(n.cfg.Events.DataParallelRank), Sink: n.events.pub,
		BatchWindow: n.cfg.Events.BatchWindow, Encoding: encoding,
		Now: n.cfg.Clock.Now, Counters: &n.events.counters,
		LearnCapacity: n.learnCapacity(), LearnWait: n.cfg.Events.LearnWait,
		Resident: w.to("cpu"), // NB: spawned after the hub: asked only once engines come
		Log:      n.cfg.Logger.With().Str("actor", "events").Logger(),
	})
}

// learnCapacity is the hub's, 0 (learning off) without engines to learn from.
func (n *Node) learnCapacity() int {
	if len(n.cfg.Events.LearnFrom) == 0 {
		return 0
	}
	return n.cfg.Events.LearnCapacity
}

// learnRetry is how long a learning subscriber waits before it dials an
// engine's publisher again (not up yet, restarted, or a bad payload).
const learnRetry = time.Second

// startLearning subscribes to every events.learn_from publisher (or binds
// the address for engines that connect, events.learn_mode): each of their
// batches goes to the hub (events.Learn). A subscriber that fails (the
// engine is not up, or went away; the address is taken) dials (binds) again
// after learnRetry until stopLearning.
func (n *Node) startLearning() {
	if n.events.hub == nil || len(n.cfg.Events.LearnFrom) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.events.unlearn = cancel
	root, hub := n.system.Root, n.events.hub
	deliver := func(d events.Delivery) error {
		root.Send(hub, &events.Learn{Batch: d.Batch, Topic: d.Topic})
		return nil
	}
	for _, ep := range n.cfg.Events.LearnFrom {
		log := n.cfg.Logger.With().Str("component", "events-learn").Str("engine_events", ep).Logger()
		skipped := func(err error) { log.Debug().Err(err).Msg("engine events: skipped") }
		n.events.learning.Go(func() {
			for {
				err := events.Subscribe(ctx, events.SubscriberConfig{Endpoint: ep, Mode: n.cfg.Events.LearnMode,
					ReplayFrom: -1, Skipped: skipped}, deliver)
				if ctx.Err() != nil {
					return
				}
				log.Debug().Err(err).Dur("retry", learnRetry).Msg("engine events: subscription ended")
				select {
				case <-ctx.Done():
					return
				case <-time.After(learnRetry):
				}
			}
		})
	}
}

// stopLearning ends the subscribers and waits for them.
func (n *Node) stopLearning() {
	if n.events.unlearn != nil {
		n.events.unlearn()
		n.events.learning.Wait()
	}
}

// flushEvents closes the hub's open batch once every event sent before
// now is processed (its mailbox is FIFO), so nothing is lost when the
// actors stop.
func (n *Node) flushEvents(ctx context.Context) error {
	_, err := n.FlushEvents(ctx)
	return err
}

// FlushEvents publishes the hub's open batch once every event the tiers
// announced before the call is translated, and returns the sequence number
// the next batch will get (so batches 0..next-1 are published and in the
// replay buffer). Without events it returns 0.
func (n *Node) FlushEvents(ctx context.Context) (next uint64, err error) {
	if n.events.hub == nil {
		return 0, nil
	}
	return callActor(ctx, n, n.events.hub, "kvtier: flush events", func(r messages.Reply[uint64]) any {
		return &events.Flush{Reply: r}
	})
}

// closeEvents sends what the publisher holds and closes its sockets.
func (n *Node) closeEvents(ctx context.Context) error {
	if n.events.pub == nil {
		return nil
	}
	c := &n.events.counters
	n.cfg.Logger.Info().Uint64("batches", c.Batches.Load()).Uint64("events", c.Events.Load()).
		Uint64("placeholders", c.Placeholders.Load()).Uint64("unknown_removals", c.UnknownRemovals.Load()).
		Uint64("held_for_parent", c.HeldForParent.Load()).
		Msg("events hub stopped")
	return n.events.pub.Close(ctx)
}

// EventsEndpoint is the bound PUB address of the node's KV events (a tcp
// port 0 resolved), "" when events are off.
func (n *Node) EventsEndpoint() string {
	if n.events.pub == nil {
		return ""
	}
	return n.events.pub.Endpoint()
}

// EventsReplayEndpoint is the bound replay ROUTER address, "" without one.
func (n *Node) EventsReplayEndpoint() string {
	if n.events.pub == nil {
		return ""
	}
	return n.events.pub.ReplayEndpoint()
}

// EventsCounters are the hub's counters (zero when events are off).
func (n *Node) EventsCounters() *events.Counters { return &n.events.counters }

// Inventory lists, per medium (messages.MediumCPU, messages.MediumStorage),
// the blocks the node's tiers hold readable now: what the node's KV events
// announce as stored and not removed. Each tier answers from its own
// mailbox, so each tier's list is exact at that moment; a medium's list is
// the union of its tiers'. An fs tier answers once it has announced the
// blocks it found at start; an obj tier lists the blocks it vouches for
// (tiers/obj).
func (n *Node) Inventory(ctx context.Context) (map[string][]messages.Key, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.CallTimeout)
		defer cancel()
	}
	pids := []*actor.PID{n.cpu}
	for _, t := range n.tiers.opened {
		if t.kind == tiers.KindFS || t.kind == tiers.KindObj {
			pids = append(pids, n.pidOf("tier-"+t.name))
		}
	}
	sets := map[string]map[messages.Key]struct{}{}
	for _, pid := range pids {
		res, err := callActor(ctx, n, pid, "kvtier: inventory of "+pid.Id, func(r messages.Reply[messages.InventoryResult]) any {
			return &messages.TierInventory{Reply: r}
		})
		if err != nil {
			return nil, err
		}
		set := sets[res.Medium]
		if set == nil {
			set = map[messages.Key]struct{}{}
			sets[res.Medium] = set
		}
		for _, k := range res.Keys {
			set[k] = struct{}{}
		}
	}
	out := map[string][]messages.Key{}
	for medium, set := range sets {
		if len(set) > 0 {
			out[medium] = slices.Collect(maps.Keys(set))
		}
	}
	return out, nil
}

// registerEventsMetrics exposes the hub's counters on the node registry.
func (n *Node) registerEventsMetrics() {
	if n.events.pub == nil {
		return
	}
	metrics.RegisterEvents(n.registry, &n.events.counters, &n.events.pub.Dropped)
}

// EventsHashFormat is how the node's events write block hashes ("int" or
// "bytes"; "" is the default, int).
func (n *Node) EventsHashFormat() string { return n.cfg.Events.HashFormat }

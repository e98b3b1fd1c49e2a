package p2p

import (
	"context"
	"sync"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/supervision"
)

// Tier is the P2P tier actor: a shell that hands each message to its
// State and carries out what it decided, and owns the watcher goroutines,
// waited for when it stops. It is the only code of this package that
// touches the actor system.
type Tier struct {
	state    *State
	out      Out
	running  map[watchKey]func() // the watchers started and not stopped: their cancel funcs
	watchers sync.WaitGroup
}

// Props returns the tier's props. Its state outlives a restart (the
// producer hands the supervisor the same Tier): the peers that are up, the
// rounds held at producers and, above all, the reads in flight, whose
// slots only the sessions' answers may free — a fresh incarnation would
// know none of them, strand those promotions and never hear PeerUp again.
// A panic is injected (chaos) or a bug: the state is as the last completed
// message left it, or as far as the failed one got.
func Props(cfg Config) *actor.Props {
	a := &Tier{state: NewState(cfg.WithDefaults()), running: map[watchKey]func(){}}
	return actor.PropsFromProducer(func() actor.Actor { return a }, actor.WithReceiverMiddleware(supervision.Faults))
}

// Receive hands every message but the lifecycle's to the core; stopped,
// it cancels the event watchers and waits for them: none outlives it.
func (a *Tier) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Stopped:
		for k, cancel := range a.running {
			cancel()
			delete(a.running, k)
		}
		a.watchers.Wait()
		return
	case *actor.Started, *actor.Restarting, *actor.Stopping, *actor.Restart:
		return
	}
	// NB: a handler that panicked left its decisions half made: its
	// messages and deadlines are dropped, but the watchers it started or
	// stopped are carried out, as the core already counts them so.
	a.carryWatches(ctx)
	a.out.Reset()
	a.state.Handle(&a.out, fx.RefOf(ctx.Sender()), ctx.Message())
	fx.Carry(ctx, a.state.cfg.Clock, &a.out.Out)
	a.carryWatches(ctx)
}

// carryWatches stops, then starts, the watchers the core decided to.
func (a *Tier) carryWatches(ctx actor.Context) {
	for _, k := range a.out.Unwatches {
		if cancel := a.running[k]; cancel != nil {
			cancel() // the goroutine exits on its own
			delete(a.running, k)
		}
	}
	for _, w := range a.out.Watches {
		a.running[w.watchKey] = a.watch(ctx, w)
	}
	a.out.Unwatches, a.out.Watches = a.out.Unwatches[:0], a.out.Watches[:0]
}

// watch subscribes to a peer's event stream in a goroutine that sends
// every batch to the tier, until cancel.
func (a *Tier) watch(ctx actor.Context, w watchStart) (cancel func()) {
	self, root := ctx.Self(), ctx.ActorSystem().Root
	node, gen, cfg := w.node, w.gen, w.cfg
	sub, cancel := context.WithCancel(context.Background())
	if cfg.Replay != "" {
		cfg.Replayed = func(delivered int) { root.Send(self, &replayDone{node: node, gen: gen, delivered: delivered}) }
	}
	a.watchers.Add(1)
	go func() {
		defer a.watchers.Done()
		err := events.Subscribe(sub, cfg, func(d events.Delivery) error {
			root.Send(self, &eventBatch{node: node, gen: gen, seq: d.Seq, missed: d.Missed, batch: d.Batch})
			return nil
		})
		if sub.Err() == nil {
			root.Send(self, &watchEnded{node: node, gen: gen, err: err})
		}
	}()
	return cancel
}

package scheduler

import (
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
)

// Props builds the bridge's props. incarnation counts how often the
// producer ran, so a restarted bridge knows it is one.
func Props(cfg Config) *actor.Props {
	var incarnation atomic.Uint64
	carry := new([]messages.Event)
	return actor.PropsFromProducer(func() actor.Actor {
		n := incarnation.Add(1)
		// NB: each incarnation numbers its CPU-tier calls in a range of its
		// own, so an answer to a call of the one before (still in the
		// mailbox) never resumes a new call of another kind.
		return &bridgeActor{b: newBridge(cfg, n, carry)}
	}, actor.WithReceiverMiddleware(supervision.Faults))
}

// bridgeActor is the bridge: a shell that hands each message to its core
// and carries out what the core decided. It is the only code of the bridge
// that touches the actor system.
type bridgeActor struct {
	b   *Bridge
	out fx.Out
}

// Receive maps the lifecycle to the core and hands it everything else.
func (a *bridgeActor) Receive(ctx actor.Context) {
	a.out.Reset() // NB: a handler that panicked left its decisions half made
	switch ctx.Message().(type) {
	case *actor.Started:
		a.b.started(&a.out)
	case *actor.Restarting:
		a.b.failInFlight(&a.out)
	case *actor.Stopping:
		a.b.failHeld(&a.out, messages.ErrClosed)
	case *actor.Stopped, *actor.Restart:
	default:
		a.b.Handle(&a.out, ctx.Message())
	}
	a.shell().Carry(ctx, &a.out)
}

// shell carries the core's Outs out: deadlines on the node's clock,
// checksums on the node's tracked offload goroutines.
func (a *bridgeActor) shell() fx.Shell {
	return fx.Shell{Clock: a.b.cfg.Clock, Go: a.b.cfg.Offload.Go} // NB: a nil Offload runs untracked
}

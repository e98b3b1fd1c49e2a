package tiering

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/supervision"
)

// Actor is the tiering actor: a shell that hands each message to its
// State and carries out what it decided. It is the only code of this
// package that touches the actor system.
type Actor struct {
	state *State
	out   fx.Out
}

// Props builds the tiering actor. Its state outlives a supervisor restart
// (the producer hands back the same instance): tier I/O of its jobs may
// still be running into or out of slots, so the jobs that hold those slots
// must survive to release them when the I/O returns.
func Props(cfg Config) *actor.Props {
	a := &Actor{state: NewState(cfg.WithDefaults())}
	return actor.PropsFromProducer(func() actor.Actor { return a },
		actor.WithReceiverMiddleware(supervision.Faults))
}

// Receive hands every message but the lifecycle's to the core.
func (a *Actor) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Started, *actor.Restarting, *actor.Stopping, *actor.Stopped, *actor.Restart:
		return
	}
	a.out.Reset() // NB: a handler that panicked left its decisions half made
	a.state.Handle(&a.out, ctx.Message())
	fx.Carry(ctx, a.state.cfg.Clock, &a.out)
}

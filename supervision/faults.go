package supervision

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
)

// InjectPanic, sent to an actor spawned with Faults, makes it panic inside
// its receive path as if its own handler had failed, so its supervisor
// decides. Nothing else in the system sends it: fault injection is off
// unless a test or the chaos harness sends one.
type InjectPanic struct {
	Reason string // carried into the panic value and the supervisor's log
}

// Faults is receiver middleware that turns InjectPanic into a panic and,
// when an Injector is attached to the actor's system (inject.go), lets it
// drop, delay, duplicate, reorder or panic deliveries as its rules decide.
// With no injector attached anywhere — always, outside chaos tests — every
// other message passes straight through: one atomic load and nil check,
// then one type switch.
func Faults(next actor.ReceiverFunc) actor.ReceiverFunc {
	return func(ctx actor.ReceiverContext, env *actor.MessageEnvelope) {
		if p := attached.Load(); p != nil { // NB: the one check injection costs when off
			if inj := (*p)[ctx.ActorSystem()]; inj != nil {
				inj.receive(ctx, env, next)
				return
			}
		}
		switch m := env.Message.(type) {
		case *InjectPanic:
			panic(fmt.Sprintf("injected fault: %s", m.Reason))
		case *redelivery:
			// Its injector was detached while it was on its way: deliver it
			// as it was sent (a hold flush carries nothing).
			if m.env != nil {
				next(ctx, m.env)
			}
			return
		}
		next(ctx, env)
	}
}

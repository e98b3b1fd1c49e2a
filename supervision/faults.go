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

// Faults is receiver middleware that turns InjectPanic into a panic. Every
// other message passes straight through (one type assertion).
func Faults(next actor.ReceiverFunc) actor.ReceiverFunc {
	return func(ctx actor.ReceiverContext, env *actor.MessageEnvelope) {
		if p, ok := env.Message.(*InjectPanic); ok {
			panic(fmt.Sprintf("injected fault: %s", p.Reason))
		}
		next(ctx, env)
	}
}

// Package announce connects the tiers that cannot be handed the node's
// event hub when they are built to that hub. The secondary tiers (fs, obj)
// are opened before the node's actor system and hub exist, so their
// configuration cannot carry the hub's PID; instead the node registers its
// hub for its actor system (Register) before any tier actor starts, and a
// tier actor asks for it (Hub) when it starts, then sends its events there
// like the CPU tier does: a plain send, in order, never blocking.
//
// It owns one map from actor system to hub and nothing else.
package announce

import (
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

var hubs sync.Map // *actor.ActorSystem → *actor.PID

// Register makes hub the event hub of system's tiers until the returned
// function is called.
func Register(system *actor.ActorSystem, hub *actor.PID) (unregister func()) {
	hubs.Store(system, hub)
	return func() { hubs.CompareAndDelete(system, hub) }
}

// Hub is the event hub registered for system, nil when none (events off):
// then a tier announces nothing.
func Hub(system *actor.ActorSystem) *actor.PID {
	if system == nil {
		return nil
	}
	if pid, ok := hubs.Load(system); ok {
		return pid.(*actor.PID)
	}
	return nil
}

package actors

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
)

// Child is an actor the guardian spawns and supervises.
type Child struct {
	Name  string       // unique among the guardian's children
	Props *actor.Props // how to make it
}

// Guardian is the root supervisor of a node: it spawns the children in
// order when it starts and restarts any that panics, one for one.
//
// Invariants:
//   - children are spawned under the guardian, never from the root context
//     (root-spawned actors get protoactor's default strategy whatever their
//     props say).
//   - more than MaxRestarts failures within RestartWindow stop the child;
//     its callers then time out on their own deadlines.
type Guardian struct {
	children []Child
	spawned  chan<- map[string]*actor.PID
}

// Supervision limits for a node's actors.
const (
	MaxRestarts   = 10
	RestartWindow = time.Minute
)

// GuardianProps builds the guardian. spawned receives the children's PIDs
// once, after they are all spawned; restarts counts supervised restarts.
func GuardianProps(children []Child, spawned chan<- map[string]*actor.PID, restarts *atomic.Uint64, log zerolog.Logger) *actor.Props {
	decider := func(reason any) actor.Directive {
		restarts.Add(1)
		log.Error().Str("reason", fmt.Sprint(reason)).Msg("actor failed; restarting")
		return actor.RestartDirective
	}
	strategy := actor.NewOneForOneStrategy(MaxRestarts, RestartWindow, decider)
	return actor.PropsFromProducer(func() actor.Actor {
		return &Guardian{children: children, spawned: spawned}
	}, actor.WithSupervisor(strategy))
}

// Receive spawns the children on start; the guardian has no other work.
func (g *Guardian) Receive(ctx actor.Context) {
	if _, ok := ctx.Message().(*actor.Started); !ok || g.spawned == nil {
		return
	}
	pids := make(map[string]*actor.PID, len(g.children))
	for _, c := range g.children {
		pid, err := ctx.SpawnNamed(c.Props, c.Name)
		if err != nil {
			panic(fmt.Sprintf("guardian: spawn %s: %v", c.Name, err))
		}
		pids[c.Name] = pid
	}
	g.spawned <- pids
	g.spawned = nil
}

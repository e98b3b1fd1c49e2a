// Package tiertest runs one tier actor in an actor system of its own for a
// test, with a stand-in for the node's event hub, and asks it what a test
// asks every tier: answers, the events it announced, its inventory.
package tiertest

import (
	"context"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/messages"
)

// Options say how Start runs a tier.
type Options struct {
	// Name names the tier's actor ("": a generated name).
	Name string
	// Timeout bounds the test's waits and the stops at its end.
	Timeout time.Duration
	// Events is the hub's buffer. A hub whose buffer is full waits for
	// the test to read, unless Drop: then it drops the event (for tests
	// that do not read them all).
	Events int
	Drop   bool
	// Medium, Ownership and Locality are what every event (and, but for
	// Locality, every inventory) from the tier must say; "" is unchecked.
	Medium, Ownership, Locality string
	// Close closes the tier once its actor stopped (nil: nothing to close).
	Close func(context.Context) error
}

// Harness is a running tier actor and its stand-in hub.
type Harness struct {
	T      *testing.T
	Ctx    context.Context // ends after Options.Timeout
	System *actor.ActorSystem
	PID    *actor.PID           // the tier
	Events chan *messages.Event // what the tier announced
	opts   Options
}

// hub stands in for the node's event hub: events go to a channel.
type hub struct {
	events chan *messages.Event
	drop   bool
}

func (h *hub) Receive(c actor.Context) {
	e, ok := c.Message().(*messages.Event)
	switch {
	case !ok:
	case h.drop:
		select {
		case h.events <- e:
		default:
		}
	default:
		h.events <- e
	}
}

// Start spawns the hub and the tier's actor from props (given the hub's
// PID). When the test ends it stops the tier, then the hub, closes the
// tier and shuts the system down, failing the test on any error.
func Start(t *testing.T, props func(hub *actor.PID) *actor.Props, o Options) *Harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	system := actors.NewSystem(zerolog.Nop())
	h := &Harness{T: t, Ctx: ctx, System: system, Events: make(chan *messages.Event, o.Events), opts: o}
	sink := &hub{events: h.Events, drop: o.Drop}
	hubPID := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return sink }))
	if o.Name == "" {
		h.PID = system.Root.Spawn(props(hubPID))
	} else {
		pid, err := system.Root.SpawnNamed(props(hubPID), o.Name)
		require.NoError(t, err)
		h.PID = pid
	}
	t.Cleanup(func() {
		require.NoError(t, actors.StopAndWait(ctx, system, h.PID))
		require.NoError(t, actors.StopAndWait(ctx, system, hubPID))
		if o.Close != nil {
			require.NoError(t, o.Close(ctx))
		}
		system.Shutdown()
		cancel()
	})
	return h
}

// Ask asks the tier msg and returns its answer, failing the test on an
// error or a timeout.
func (h *Harness) Ask(msg any) any {
	h.T.Helper()
	r, err := actors.Ask(h.Ctx, h.System, h.PID, msg)
	require.NoError(h.T, err)
	return r
}

// Next is the next event the hub got (every event a tier sends before an
// answer is there once the answer is), checked against the Options.
func (h *Harness) Next() *messages.Event {
	h.T.Helper()
	select {
	case e := <-h.Events:
		h.check("event medium", h.opts.Medium, e.Medium)
		h.check("event ownership", h.opts.Ownership, e.Ownership)
		h.check("event locality", h.opts.Locality, e.Locality)
		return e
	case <-h.Ctx.Done():
		h.T.Fatal("no event")
		return nil
	}
}

// Inventory asks the tier its inventory, checked against the Options.
func (h *Harness) Inventory() []messages.Key {
	h.T.Helper()
	reply := messages.NewReply[messages.InventoryResult]()
	h.System.Root.Send(h.PID, &messages.TierInventory{Reply: reply})
	var r messages.InventoryResult
	select {
	case got := <-reply.C():
		require.NoError(h.T, got.Err)
		r = got.Value
	case <-h.Ctx.Done():
		h.T.Fatal("no inventory")
	}
	h.check("inventory medium", h.opts.Medium, r.Medium)
	h.check("inventory ownership", h.opts.Ownership, r.Ownership)
	return r.Keys
}

func (h *Harness) check(what, want, got string) {
	h.T.Helper()
	if want != "" {
		require.Equal(h.T, want, got, what)
	}
}

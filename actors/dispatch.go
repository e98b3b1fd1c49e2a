package actors

import (
	"context"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/internal/gopool"
)

// WarmDispatcher runs actors' mailboxes on long-lived goroutines instead
// of a new goroutine per mailbox activation (protoactor's default). A new
// goroutine starts on a small stack, and an actor's Receive, below the
// mailbox's and the middleware's frames, grows it every time: on the
// engine's path that stack copy was a fifth of the daemon's CPU per call
// (BenchmarkEndpointLookupRoundTrip's profile). A parked goroutine of the
// pool takes an activation when one is idle; otherwise a new goroutine
// runs it, as before, so a busy pool never delays a mailbox and a Receive
// that blocks (none should) never starves another actor.
type WarmDispatcher struct {
	pool       *gopool.Pool
	throughput int
}

// A node's dispatcher: enough workers for the actors on an engine call's
// path (endpoint, bridge, CPU tier) and a few more to be active at once;
// the mailbox throughput is protoactor's default.
const (
	WarmWorkers = 8
	Throughput  = 300
)

// NewWarmDispatcher starts workers goroutines; throughput is the messages a
// mailbox processes per activation (protoactor's default is 300). Close
// ends the workers.
func NewWarmDispatcher(workers, throughput int) *WarmDispatcher {
	return &WarmDispatcher{pool: gopool.New(workers, 0), throughput: throughput}
}

var _ actor.Dispatcher = (*WarmDispatcher)(nil)

// Schedule implements actor.Dispatcher.
func (d *WarmDispatcher) Schedule(fn func()) {
	if !d.pool.TryRun(fn) {
		go fn()
	}
}

// Throughput implements actor.Dispatcher.
func (d *WarmDispatcher) Throughput() int { return d.throughput }

// Close ends the workers, after the actors using it stopped; a Schedule
// after Close runs on a new goroutine. It waits for a worker's activation
// in progress until ctx ends, no longer: a Receive that never returns (a
// bug) keeps its worker, not the caller.
func (d *WarmDispatcher) Close(ctx context.Context) error {
	if d == nil {
		return nil
	}
	if err := d.pool.Stop(ctx); err != nil {
		return fmt.Errorf("actors: dispatcher workers still busy: %w", err)
	}
	return nil
}

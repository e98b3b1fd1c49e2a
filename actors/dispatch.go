package actors

import (
	"context"
	"fmt"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
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
	work       chan func()
	throughput int
	stop       chan struct{}
	wg         sync.WaitGroup
	once       sync.Once
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
	d := &WarmDispatcher{work: make(chan func()), throughput: throughput, stop: make(chan struct{})}
	d.wg.Add(workers)
	for range workers {
		go d.worker()
	}
	return d
}

var _ actor.Dispatcher = (*WarmDispatcher)(nil)

func (d *WarmDispatcher) worker() {
	defer d.wg.Done()
	for {
		select {
		case fn := <-d.work:
			fn()
		case <-d.stop:
			return
		}
	}
}

// Schedule implements actor.Dispatcher.
func (d *WarmDispatcher) Schedule(fn func()) {
	select {
	case d.work <- fn:
	default:
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
	d.once.Do(func() { close(d.stop) })
	done := make(chan struct{})
	go func() { // NB: ends with the last worker
		d.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("actors: dispatcher workers still busy: %w", ctx.Err())
	}
}

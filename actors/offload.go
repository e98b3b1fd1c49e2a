package actors

import (
	"context"
	"sync"
)

// Offload runs an actor's work that must not block its mailbox — a
// checksum over slot memory — on goroutines the node can wait for: Close
// unmaps the pool only once every goroutine started here has returned, so
// none reads memory that is gone. The work sends its result back to the
// actor as a message; Offload only counts it.
//
// The zero value is ready; a nil *Offload runs work untracked (tests that
// build one actor alone).
type Offload struct {
	mu      sync.Mutex
	running int
	closed  bool
	idle    chan struct{} // closed when running reaches 0 after Close
}

// Go runs f on its own goroutine, tracked. After Close it runs nothing and
// returns false: the actors are stopped by then, so no result is awaited.
func (o *Offload) Go(f func()) bool {
	if o == nil {
		go f()
		return true
	}
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return false
	}
	o.running++
	o.mu.Unlock()
	go func() {
		defer o.done()
		f()
	}()
	return true
}

func (o *Offload) done() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.running--
	if o.closed && o.running == 0 && o.idle != nil {
		close(o.idle)
		o.idle = nil
	}
}

// Close stops new work and waits for the work running, until ctx ends;
// an error means some may still run (and touch what it was given).
func (o *Offload) Close(ctx context.Context) error {
	o.mu.Lock()
	o.closed = true
	if o.running == 0 {
		o.mu.Unlock()
		return nil
	}
	if o.idle == nil {
		o.idle = make(chan struct{})
	}
	idle := o.idle
	o.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

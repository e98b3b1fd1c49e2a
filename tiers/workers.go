package tiers

import (
	"context"
	"fmt"
	"sync"
)

// Workers is a bounded pool of I/O goroutines that runs outside every
// actor: a tier's Receive hands it a closure (the blocking part of a read,
// write or delete) and takes the outcome back as a message the closure
// sends. Submit never blocks: past the queue bound it refuses, and the tier
// sheds the operation (counted) instead of growing memory or stalling its
// mailbox.
//
// Invariants:
//   - at most n closures run at once; at most queue wait.
//   - after Close no closure starts; Close returns once every running one
//     has returned (or its ctx ends), so the node can unmap slot memory the
//     closures read or write only after a successful Close.
type Workers struct {
	mu     sync.Mutex
	jobs   chan func()
	closed bool
	wg     sync.WaitGroup
	done   chan struct{}
}

// NewWorkers starts n goroutines serving a queue of queue closures.
func NewWorkers(n, queue int) *Workers {
	n, queue = max(n, 1), max(queue, 0)
	w := &Workers{jobs: make(chan func(), queue), done: make(chan struct{})}
	w.wg.Add(n)
	for range n {
		go w.loop()
	}
	return w
}

func (w *Workers) loop() {
	defer w.wg.Done()
	for {
		select {
		case f := <-w.jobs:
			f()
		case <-w.done:
			return
		}
	}
}

// Submit queues f; false when the queue is full or the pool closed.
func (w *Workers) Submit(f func()) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	select {
	case w.jobs <- f:
		return true
	default:
		return false
	}
}

// Queued is how many closures wait for a goroutine.
func (w *Workers) Queued() int { return len(w.jobs) }

// Close stops the pool: queued closures are dropped, running ones finish.
// It waits for them until ctx ends.
func (w *Workers) Close(ctx context.Context) error {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.done)
	}
	w.mu.Unlock()
	finished := make(chan struct{})
	go func() { w.wg.Wait(); close(finished) }()
	select {
	case <-finished:
		// Drop what is still queued: nothing will run it.
		for {
			select {
			case <-w.jobs:
			default:
				return nil
			}
		}
	case <-ctx.Done():
		return fmt.Errorf("tier workers still running: %w", ctx.Err())
	}
}

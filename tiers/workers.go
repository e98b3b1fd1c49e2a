package tiers

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvtier/kvtier/internal/gopool"
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
	pool   *gopool.Pool
	closed bool
}

// NewWorkers starts n goroutines serving a queue of queue closures.
func NewWorkers(n, queue int) *Workers {
	return &Workers{pool: gopool.New(n, queue)}
}

// Submit queues f; false when the queue is full or the pool closed.
func (w *Workers) Submit(f func()) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.closed && w.pool.TryRun(f)
}

// Queued is how many closures wait for a goroutine.
func (w *Workers) Queued() int { return w.pool.Queued() }

// Close stops the pool: queued closures are dropped, running ones finish.
// It waits for them until ctx ends.
func (w *Workers) Close(ctx context.Context) error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	if err := w.pool.Stop(ctx); err != nil {
		return fmt.Errorf("tier workers still running: %w", err)
	}
	return nil
}

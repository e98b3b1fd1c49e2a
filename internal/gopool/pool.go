// Package gopool is a fixed set of long-lived goroutines that run the
// closures handed to them: the actors' warm dispatcher and the tiers' I/O
// workers are each one. It owns those goroutines and nothing else: what a
// closure touches, and what happens to a closure the pool refuses, are its
// caller's.
package gopool

import (
	"context"
	"sync"
)

// Pool runs closures on the goroutines New started, until Stop.
//
// Invariants: at most n closures run at once and at most queue wait; a
// closure still queued when Stop begins never starts (one handed to an idle
// goroutine at that moment may).
type Pool struct {
	work chan func()
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

// New starts n goroutines (at least one) serving a queue of queue closures
// (0: a closure is taken only by an idle goroutine).
func New(n, queue int) *Pool {
	p := &Pool{work: make(chan func(), max(queue, 0)), stop: make(chan struct{})}
	n = max(n, 1)
	p.wg.Add(n)
	for range n {
		go p.serve()
	}
	return p
}

func (p *Pool) serve() {
	defer p.wg.Done()
	for {
		select {
		case <-p.stop: // NB: first, so that what is queued when Stop begins never starts
			return
		default:
		}
		select {
		case f := <-p.work:
			f()
		case <-p.stop:
			return
		}
	}
}

// TryRun hands f to the pool without blocking: false when no goroutine is
// idle and the queue is full. After Stop a queued f may never run: callers
// that need to know refuse it themselves once they stopped the pool.
func (p *Pool) TryRun(f func()) bool {
	select {
	case p.work <- f:
		return true
	default:
		return false
	}
}

// Queued is how many closures wait for a goroutine.
func (p *Pool) Queued() int { return len(p.work) }

// Stop ends the goroutines, each once the closure it runs returns, and
// waits for them until ctx ends (a closure that never returns keeps its
// goroutine, not the caller). Closures still queued are dropped. It is
// safe to call more than once.
func (p *Pool) Stop(ctx context.Context) error {
	p.once.Do(func() { close(p.stop) })
	finished := make(chan struct{})
	go func() { // NB: ends with the last goroutine
		p.wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-ctx.Done():
		return ctx.Err()
	}
	for {
		select {
		case <-p.work: // nothing will run it
		default:
			return nil
		}
	}
}

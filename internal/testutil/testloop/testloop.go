// Package testloop runs a test's background workload: a round called over
// and over, until the test halts it or a round fails, and a wait for the
// loop's progress that ends at a deadline instead of a sleep; and Poll, the
// one wait for observable state with no message to wait on. It owns the
// loop's goroutine and its signalling; what a round does, and what it
// counts, belong to the test.
package testloop

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Loop is a running background workload.
type Loop struct {
	tick     chan struct{} // a token after each round (at most one waiting)
	stop     chan struct{} // closed by Halt
	done     chan struct{} // closed when the loop's goroutine returns
	stopOnce sync.Once
	err      error // the round's error that ended the loop; read after done
}

// Start calls round(0, stopping), round(1, stopping), … in a goroutine until
// Halt or until a round returns an error; stopping is closed by Halt, for a
// round that waits. The test's cleanup halts the loop.
func Start(t testing.TB, round func(n int, stopping <-chan struct{}) error) *Loop {
	t.Helper()
	l := &Loop{tick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go l.run(round)
	t.Cleanup(func() { _ = l.Halt() })
	return l
}

func (l *Loop) run(round func(n int, stopping <-chan struct{}) error) {
	defer close(l.done)
	for n := 0; ; n++ {
		select {
		case <-l.stop:
			return
		default:
		}
		if l.err = round(n, l.stop); l.err != nil {
			return
		}
		select {
		case l.tick <- struct{}{}:
		default:
		}
	}
}

// Halt stops the loop after its current round, waits for it, and returns
// the error of the round that ended it (nil when Halt did).
func (l *Loop) Halt() error {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.done
	return l.err
}

// Await waits until count, which the rounds increment, has grown by n. It
// fails the test if the loop ends first (with the round's error) or ctx
// expires first; what names the awaited rounds in that message.
func (l *Loop) Await(t testing.TB, ctx context.Context, count *atomic.Int64, n int64, what string) {
	t.Helper()
	target := count.Load() + n
	for count.Load() < target {
		select {
		case <-l.tick:
		case <-l.done:
			t.Fatalf("loop ended waiting for %s: %v", what, l.err)
		case <-ctx.Done():
			t.Fatalf("loop: no %s: %v", what, ctx.Err())
		}
	}
}

// Poll checks cond every few milliseconds until it holds, failing the test
// after bound: for state that has no message to wait on (a process's
// registration in etcd, a node's counters).
func Poll(t testing.TB, what string, bound time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if !time.Now().Before(deadline) {
			t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(5 * time.Millisecond) // NB: polling observable state, not waiting out a duration
	}
}

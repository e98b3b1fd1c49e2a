package chaos

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/messages"
)

// residency is what a stream of events says the CPU tier holds: stored
// minus removed, reset by a clear. Safe for concurrent use.
type residency struct {
	mu      sync.Mutex
	keys    map[string]struct{}
	events  int
	history map[string][]string // per key, its last few events (for a violation's detail)
}

func newResidency() *residency {
	return &residency{keys: map[string]struct{}{}, history: map[string][]string{}}
}

const (
	historyKept = 6       // events per key
	historyKeys = 1 << 16 // keys with a history, beyond which those not held lose theirs
)

// log appends what happened to hash (REQUIRES: r.mu held).
func (r *residency) log(hash, what string) {
	if len(r.history) >= historyKeys {
		// NB: a soak sees every key of its workload: keep memory bounded,
		// keeping the histories a violation is most likely to need.
		for k := range r.history {
			if _, held := r.keys[k]; !held {
				delete(r.history, k)
			}
		}
	}
	h := append(r.history[hash], what)
	if len(h) > historyKept {
		h = h[len(h)-historyKept:]
	}
	r.history[hash] = h
}

// History is what the stream said about hashes, for a violation's detail.
func (r *residency) History(hexHashes []string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, hx := range hexHashes[:min(len(hexHashes), 3)] {
		raw, _ := hex.DecodeString(hx)
		fmt.Fprintf(&b, " %s: %v;", hx, r.history[string(raw)])
	}
	return b.String()
}

// apply takes one TakeEvents event (the CPU tier's own).
func (r *residency) apply(e *messages.Event) {
	if e.Medium != "" && e.Medium != messages.MediumCPU {
		return
	}
	hashes := make([]string, len(e.Keys))
	for i, k := range e.Keys {
		hashes[i] = k.Hash
	}
	r.change(e.Kind.String(), hashes, func(n int) string { return fmt.Sprintf("#%d", n) })
}

// applyWire takes one published event (hashes in bytes form) of batch seq.
func (r *residency) applyWire(e *events.Event, seq uint64, idx int) {
	if e.Medium != messages.MediumCPU {
		return
	}
	hashes := make([]string, len(e.BlockHashes))
	for i, h := range e.BlockHashes {
		hashes[i] = string(h.Bytes)
	}
	r.change(e.Type, hashes, func(int) string { return fmt.Sprintf("@%d.%d", seq, idx) })
}

// change applies one event of type typ (a wire event's Type, which is its
// EventKind's name) to the model, naming it in its keys' histories by where
// it stood (at: given the count of events taken, this one included).
func (r *residency) change(typ string, hashes []string, at func(n int) string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events++
	switch typ {
	case events.TypeBlockStored:
		where := at(r.events)
		for _, h := range hashes {
			r.keys[h] = struct{}{}
			r.log(h, "stored"+where)
		}
	case events.TypeBlockRemoved:
		where := at(r.events)
		for _, h := range hashes {
			delete(r.keys, h)
			r.log(h, "removed"+where)
		}
	case events.TypeAllBlocksCleared:
		clear(r.keys)
	}
}

// diff compares the model with the blocks the tier holds: what the events
// announce but the tier lacks, and what the tier holds unannounced.
func (r *residency) diff(inventory []messages.Key) (phantom, unannounced []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	held := make(map[string]struct{}, len(inventory))
	for _, k := range inventory {
		held[k.Hash] = struct{}{}
		if _, ok := r.keys[k.Hash]; !ok {
			unannounced = append(unannounced, fmt.Sprintf("%x", k.Hash))
		}
	}
	for h := range r.keys {
		if _, ok := held[h]; !ok {
			phantom = append(phantom, fmt.Sprintf("%x", h))
		}
	}
	slices.Sort(phantom)
	slices.Sort(unannounced)
	return phantom, unannounced
}

// subscriber follows a node's published KV events (replay from 0, then
// live) into a residency model.
type subscriber struct {
	model  *residency
	next   atomic.Uint64 // next sequence number expected
	missed atomic.Uint64 // batches neither received nor replayable
	seen   chan struct{} // signalled (without blocking) on every batch
	cancel context.CancelFunc
	done   chan error
	// stopped makes stop idempotent: a node whose peer-kill restart failed
	// is stopped at its kill and again at the end of the run, and the
	// goroutine's result can be read only once (a second read hung the run).
	stopped sync.Once
	result  error
}

func subscribe(pub, replay string) *subscriber {
	ctx, cancel := context.WithCancel(context.Background())
	s := &subscriber{model: newResidency(), seen: make(chan struct{}, 1), cancel: cancel, done: make(chan error, 1)}
	go func() {
		s.done <- events.Subscribe(ctx, events.SubscriberConfig{Endpoint: pub, Replay: replay, ReplayFrom: 0},
			func(d events.Delivery) error {
				s.missed.Add(d.Missed)
				for i := range d.Batch.Events {
					s.model.applyWire(&d.Batch.Events[i], d.Seq, i)
				}
				s.next.Store(d.Seq + 1)
				select {
				case s.seen <- struct{}{}:
				default:
				}
				return nil
			})
	}()
	return s
}

// waitFor waits until the subscriber has every batch below next, or the
// timeout passes.
func (s *subscriber) waitFor(next uint64, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for s.next.Load() < next {
		select {
		case <-s.seen:
		case err := <-s.done:
			s.done <- err
			return fmt.Errorf("subscriber ended at batch %d of %d: %w", s.next.Load(), next, err)
		case <-t.C:
			return fmt.Errorf("subscriber at batch %d of %d after %v", s.next.Load(), next, timeout)
		}
	}
	return nil
}

// stop ends the subscription and waits for its goroutine; stopping again
// returns the same result at once.
func (s *subscriber) stop() error {
	s.stopped.Do(func() {
		s.cancel()
		if err := <-s.done; !errors.Is(err, context.Canceled) {
			s.result = err
		}
	})
	return s.result
}

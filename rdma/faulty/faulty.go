// Package faulty wraps an rdma.Transport with the data-plane faults that
// cannot be produced on demand for real: bits flipped in a payload after it
// landed, a write that stalls, a write that fails. It is the narrowest seam
// for chaos tests (supervision's rules decide when) and costs nothing when
// no fault is configured. It never changes what the wrapped transport
// does; it only corrupts, delays or fails around it.
package faulty

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/rdma"
)

// Fault is what to do to one call.
type Fault uint8

const (
	None  Fault = iota
	Flip        // Expect: flip one bit of one landed slot before reporting success
	Stall       // Write: never report until Release or Close (the peer sees a hung producer)
	Fail        // Write: report failure instead of the transfer
)

// Decide picks the fault for one call: kind is "expect" or "write"; n is
// the number of slots. nil decides None.
type Decide func(kind string, n int) Fault

// ErrInjected is the error of an injected write failure.
var ErrInjected = errors.New("faulty: injected data-plane failure")

// Transport is an rdma.Transport with injected faults.
type Transport struct {
	rdma.Transport
	decide Decide

	region   atomic.Pointer[rdma.Region]
	mu       sync.Mutex
	stalled  map[uint64]*held // completions held back, released by Release, Close or their stall deadline
	seq      uint64
	stallFor atomic.Int64 // a stalled completion's deadline (ns); 0: until Release or Close

	Flips, Stalls, Fails atomic.Uint64 // faults injected, by kind
}

// Wrap wraps t; decide may be nil (no faults) and replaced with SetDecide.
func Wrap(t rdma.Transport, decide Decide) *Transport {
	return &Transport{Transport: t, decide: decide}
}

// held is a stalled completion.
type held struct {
	done  func()
	timer *time.Timer // nil without a stall deadline
}

// SetStallFor bounds every later stall: a stalled completion is let through
// d after the transfer completed (a write that hangs until its deadline);
// 0 (the default) holds it until Release or Close.
func (f *Transport) SetStallFor(d time.Duration) { f.stallFor.Store(int64(d)) }

// Register records the region (to flip bits in) and registers it below.
func (f *Transport) Register(r rdma.Region) error {
	f.region.Store(&r)
	return f.Transport.Register(r)
}

func (f *Transport) fault(kind string, n int) Fault {
	if f.decide == nil {
		return None
	}
	return f.decide(kind, n)
}

// Expect flips a bit in one landed block when decided, before done.
func (f *Transport) Expect(peer string, tok rdma.Token, dst, lens []int, done func(rdma.Completion)) error {
	if f.fault("expect", len(dst)) != Flip {
		return f.Transport.Expect(peer, tok, dst, lens, done)
	}
	i := len(dst) / 2
	slot, n := dst[i], -1 // n < 0: the whole slot
	if i < len(lens) {
		n = lens[i]
	}
	return f.Transport.Expect(peer, tok, dst, lens, func(c rdma.Completion) {
		if c.Err == nil {
			if r := f.region.Load(); r != nil {
				b := r.Slot(slot)
				if n > 0 && n <= len(b) {
					b = b[:n] // NB: inside the block, so that its checksum sees the flip
				}
				b[len(b)/3] ^= 0x10
				f.Flips.Add(1)
			}
		}
		done(c)
	})
}

// Write stalls or fails when decided. A stalled write really happens; only
// its completion is held back (the producer keeps its pins: a hung write).
func (f *Transport) Write(peer string, tok rdma.Token, src, dst, lens []int, done func(rdma.Completion)) error {
	switch f.fault("write", len(src)) {
	case Fail:
		f.Fails.Add(1)
		go done(rdma.Completion{Token: tok, Peer: peer, Err: ErrInjected})
		return nil
	case Stall:
		f.Stalls.Add(1)
		return f.Transport.Write(peer, tok, src, dst, lens, func(c rdma.Completion) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.stalled == nil {
				f.stalled = map[uint64]*held{}
			}
			f.seq++
			id, h := f.seq, &held{done: func() { done(c) }}
			if d := time.Duration(f.stallFor.Load()); d > 0 {
				h.timer = time.AfterFunc(d, func() { f.release(id) })
			}
			f.stalled[id] = h
		})
	}
	return f.Transport.Write(peer, tok, src, dst, lens, done)
}

// release lets one stalled completion through, unless it already went.
func (f *Transport) release(id uint64) {
	f.mu.Lock()
	h := f.stalled[id]
	delete(f.stalled, id)
	f.mu.Unlock()
	if h != nil {
		h.done()
	}
}

// Stalled is the number of completions held back now.
func (f *Transport) Stalled() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.stalled)
}

// Release lets every stalled completion through, in the order they were
// held.
func (f *Transport) Release() {
	f.mu.Lock()
	ids := make([]uint64, 0, len(f.stalled))
	for id, h := range f.stalled {
		if h.timer != nil {
			h.timer.Stop()
		}
		ids = append(ids, id)
	}
	all := f.stalled
	f.stalled = nil
	f.mu.Unlock()
	slices.Sort(ids)
	for _, id := range ids {
		all[id].done()
	}
}

// Close releases what is stalled, then closes the transport below.
func (f *Transport) Close() error {
	err := f.Transport.Close()
	f.Release()
	return err
}

// Package rdmatest is the conformance suite every rdma.Transport passes:
// the contract written on rdma.Transport, checked byte for byte. It owns
// nothing at run time; a transport's own tests call Run (or RunWith) with
// a factory.
//
// Usage, from a transport package's tests:
//
//	func TestConformance(t *testing.T) {
//		var n atomic.Int64
//		rdmatest.RunWith(t, rdmatest.Options{TwoSided: true}, func(t *testing.T, ra, rb rdma.Region) (a, b rdma.Transport, aID, bID string) {
//			i := n.Add(1)
//			aID, bID = fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i)
//			a, b = newTransport(t, aID), newTransport(t, bID)
//			// Register a on ra and b on rb, then Connect each to the other.
//			...
//			return a, b, aID, bID
//		})
//	}
//
// The suite allocates the regions (Options.Alloc: plain memory by default;
// a transport that needs pinned or mapped memory supplies its own) so
// that it can write source bytes and check every destination byte. The
// factory must register a on ra and b on rb, connect them both ways, and
// return node ids that are unique across calls: some cases build a second
// pair and connect it crosswise to the first to play a wrong peer. The
// suite closes every transport it gets (once each, before the case's
// checks; a factory that also registers Close as a cleanup needs Close
// to be idempotent) and, after closing, checks that every done callback
// of an accepted call ran exactly once, that no refused call's done ran,
// and that no goroutine is left (goleak; Options.IgnoreGoroutines for a
// library's own). A case fails, never hangs, when a completion does not
// come within Options.Timeout.
//
// The cases: exact bytes (random data, shuffled non-contiguous slot
// lists, one slot and the whole pool, both directions, every byte
// compared, untargeted slots untouched), blocks of mixed lengths (each at
// the start of its slot, the rest of the slot untouched, lengths outside
// a slot refused), slots of a second size numbered after the grid
// (Options.SlotSizes), sequential and concurrent
// transfers, src reusable after done, wrong token / wrong peer / wrong
// slots refused with the real expectation intact, duplicate token, Cancel
// before data, done never run on the caller's goroutine, unknown peer,
// out-of-range slots (local, and remote where the transport knows the
// peer's pool), Disconnect and reconnect failing the old epoch, Close
// failing everything and leaving no goroutine.
//
// What a case may assume beyond the contract is an Option: a two-sided
// transport (tcp: the consumer reads every transfer) sets TwoSided, and
// the suite then also checks that a refused transfer fails the producer's
// Write, is counted by the consumer before that Write's done runs, and
// leaves the consumer's slots alone. One-sided RDMA (nixl) cannot promise
// that: the bytes land before the consumer sees the token; the suite
// then checks only that the real expectation is left intact.
package rdmatest

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/rdma"
)

// NewPair builds two transports of the kind under test: a registered on
// ra, b on rb, each Connect'ed to the other with the other's Metadata.
// Node ids must be unique across calls. The suite closes both.
type NewPair func(t *testing.T, ra, rb rdma.Region) (a, b rdma.Transport, aID, bID string)

// Options tune the suite to a transport; zero fields take defaults.
type Options struct {
	SlotBytes int           // bytes per slot; default 3001 (odd, so offset bugs show)
	Slots     int           // slots per region; default 64 (at least 32)
	Timeout   time.Duration // bound on any one completion; default 10s
	// Alloc returns n bytes for a region; default make([]byte, n).
	Alloc func(t *testing.T, n int) []byte
	// TwoSided: the consumer checks each transfer before payload bytes
	// land and acks it, so a refused transfer fails the producer's Write,
	// is counted (Stats.Refused) before that Write's done runs, and never
	// writes the consumer's slots. It also checks each block's length, so
	// a transfer at other lengths than expected is refused.
	TwoSided bool
	// WholeSlots: the transport moves whole slots whatever the blocks'
	// lengths (nixl: its remote slots are pre-registered at a fixed size);
	// a destination slot's bytes past its block's length are then not
	// checked.
	WholeSlots bool
	// SlotSizes: the transport addresses the slots of a pool of several
	// block sizes (Region.Locate), not only its grid.
	SlotSizes bool
	// IgnoreGoroutines are passed to goleak for goroutines the
	// transport's libraries keep across Close.
	IgnoreGoroutines []goleak.Option
}

func (o Options) withDefaults() Options {
	if o.SlotBytes == 0 {
		o.SlotBytes = 3001
	}
	if o.Slots == 0 {
		o.Slots = 64
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Alloc == nil {
		o.Alloc = func(_ *testing.T, n int) []byte { return make([]byte, n) }
	}
	return o
}

// Run runs the suite with default Options.
func Run(t *testing.T, newPair NewPair) { RunWith(t, Options{}, newPair) }

// RunWith runs every case as a subtest, each on fresh transports.
func RunWith(t *testing.T, o Options, newPair NewPair) {
	o = o.withDefaults()
	if o.Slots < 32 {
		t.Fatalf("rdmatest: Options.Slots %d: want at least 32", o.Slots)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.run(newEnv(t, o, newPair))
		})
	}
}

var cases = []struct {
	name string
	run  func(e *env)
}{
	{"KindAndMetadata", testKindAndMetadata},
	{"TransferExact", testTransferExact},
	{"MixedLengths", testMixedLengths},
	{"WrongLengths", testWrongLengths},
	{"BadLengths", testBadLengths},
	{"EdgeSizes", testEdgeSizes},
	{"SeveralSlotSizes", testSeveralSlotSizes},
	{"Sequential", testSequential},
	{"Concurrent", testConcurrent},
	{"SrcReusableAfterDone", testSrcReusable},
	{"WrongToken", testWrongToken},
	{"WrongPeer", testWrongPeer},
	{"WrongSlots", testWrongSlots},
	{"DuplicateToken", testDuplicateToken},
	{"CancelBeforeData", testCancelBeforeData},
	{"CallsDoNotRunDone", testCallsDoNotRunDone},
	{"UnknownPeer", testUnknownPeer},
	{"BadSlots", testBadSlots},
	{"DisconnectFailsPending", testDisconnect},
	{"ReconnectReplaces", testReconnect},
	{"CloseFailsPending", testClose},
}

// node is one transport under test with its region.
type node struct {
	tr     rdma.Transport
	id     string
	region rdma.Region
	close  func() // closes tr once
}

// env is one case's world: a connected pair, and whatever else it builds.
type env struct {
	t       *testing.T
	o       Options
	newPair NewPair
	rng     *rand.Rand
	a, b    *node
	ignore  []goleak.Option // goroutines that were there before the case
	waiters []*waiter
	mu      sync.Mutex // guards waiters
}

// newEnv builds the first pair and arranges the end-of-case checks:
// close everything, then exactly-once dones, then no goroutines left.
func newEnv(t *testing.T, o Options, newPair NewPair) *env {
	ignore := append([]goleak.Option{goleak.IgnoreCurrent()}, o.IgnoreGoroutines...)
	h := fnv.New64a()
	h.Write([]byte(t.Name()))
	e := &env{t: t, o: o, newPair: newPair, ignore: ignore, rng: rand.New(rand.NewPCG(h.Sum64(), 1))}
	t.Cleanup(func() {
		e.checkDones()
		goleak.VerifyNone(t, ignore...)
	})
	e.a, e.b = e.pair()
	return e
}

// pair builds one more pair on fresh regions; the case's cleanup closes it.
func (e *env) pair() (*node, *node) {
	ra, rb := e.region(), e.region()
	a, b, aID, bID := e.newPair(e.t, ra, rb)
	na, nb := e.node(a, aID, ra), e.node(b, bID, rb)
	return na, nb
}

func (e *env) node(tr rdma.Transport, id string, r rdma.Region) *node {
	var once sync.Once
	n := &node{tr: tr, id: id, region: r}
	n.close = func() {
		once.Do(func() {
			if err := tr.Close(); err != nil {
				e.t.Errorf("%s: Close: %v", id, err)
			}
		})
	}
	e.t.Cleanup(n.close) // runs before the checks registered earlier
	return n
}

// region allocates a region and fills it with a recognisable pattern.
func (e *env) region() rdma.Region {
	n := e.o.Slots * e.o.SlotBytes
	r := rdma.Region{Base: e.o.Alloc(e.t, n), SlotBytes: e.o.SlotBytes, Slots: e.o.Slots}
	seed := byte(e.rng.Uint32())
	for i := range r.Base[:n] {
		r.Base[i] = seed + byte(i*7)
	}
	return r
}

// waiter is one done callback under test.
type waiter struct {
	what  string
	ch    chan rdma.Completion
	calls atomic.Int32
	armed bool // the call that took this callback returned nil: done must run once
}

// waiter returns a fresh done callback; arm it once the call accepted it.
func (e *env) waiter(format string, args ...any) *waiter {
	w := &waiter{what: fmt.Sprintf(format, args...), ch: make(chan rdma.Completion, 1)}
	e.mu.Lock()
	e.waiters = append(e.waiters, w)
	e.mu.Unlock()
	return w
}

func (w *waiter) done(c rdma.Completion) {
	if w.calls.Add(1) == 1 {
		w.ch <- c
	}
}

// wait returns w's completion, failing the case if none comes in time.
func (e *env) wait(w *waiter) rdma.Completion {
	e.t.Helper()
	timer := time.NewTimer(e.o.Timeout)
	defer timer.Stop()
	select {
	case c := <-w.ch:
		return c
	case <-timer.C:
		e.t.Fatalf("%s: no completion within %v", w.what, e.o.Timeout)
		return rdma.Completion{}
	}
}

// checkDones runs after every transport is closed: each accepted call's
// done ran exactly once, each refused call's never.
func (e *env) checkDones() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, w := range e.waiters {
		n := w.calls.Load()
		if w.armed && n != 1 {
			e.t.Errorf("%s: done called %d times, want exactly once", w.what, n)
		}
		if !w.armed && n != 0 {
			e.t.Errorf("%s: done called %d times for a refused call, want never", w.what, n)
		}
	}
}

// expect calls Expect on consumer c for a transfer from p and fails the
// case if it is refused.
func (e *env) expect(c, p *node, tok rdma.Token, dst []int) *waiter {
	e.t.Helper()
	w, err := e.tryExpect(c, p.id, tok, dst)
	if err != nil {
		e.t.Fatalf("%s: %v", w.what, err)
	}
	return w
}

func (e *env) tryExpect(c *node, from string, tok rdma.Token, dst []int) (*waiter, error) {
	return e.tryExpectLens(c, from, tok, dst, nil)
}

func (e *env) tryExpectLens(c *node, from string, tok rdma.Token, dst, lens []int) (*waiter, error) {
	w := e.waiter("%s.Expect(%s, %s, %d slots)", c.id, from, tok, len(dst))
	err := c.tr.Expect(from, tok, dst, lens, w.done)
	w.armed = err == nil
	return w, err
}

// write calls Write on producer p into consumer c and fails the case if
// it is refused.
func (e *env) write(p, c *node, tok rdma.Token, src, dst []int) *waiter {
	e.t.Helper()
	w, err := e.tryWrite(p, c.id, tok, src, dst)
	if err != nil {
		e.t.Fatalf("%s: %v", w.what, err)
	}
	return w
}

func (e *env) tryWrite(p *node, to string, tok rdma.Token, src, dst []int) (*waiter, error) {
	return e.tryWriteLens(p, to, tok, src, dst, nil)
}

func (e *env) tryWriteLens(p *node, to string, tok rdma.Token, src, dst, lens []int) (*waiter, error) {
	w := e.waiter("%s.Write(%s, %s, %d slots)", p.id, to, tok, len(src))
	err := p.tr.Write(to, tok, src, dst, lens, w.done)
	w.armed = err == nil
	return w, err
}

// slots picks n distinct slots in random order (so never contiguous in
// general), avoiding those in used.
func (e *env) slots(n int, used ...[]int) []int {
	e.t.Helper()
	var free []int
	for i := range e.o.Slots {
		if !slices.ContainsFunc(used, func(u []int) bool { return slices.Contains(u, i) }) {
			free = append(free, i)
		}
	}
	if len(free) < n {
		e.t.Fatalf("rdmatest: %d slots wanted, %d free", n, len(free))
	}
	e.rng.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
	return free[:n]
}

// randomize fills the given slots of n with fresh random bytes.
func (e *env) randomize(n *node, slots []int) {
	for _, s := range slots {
		b := n.region.Slot(s)
		for i := 0; i < len(b); i += 8 {
			v := e.rng.Uint64()
			for j := 0; j < 8 && i+j < len(b); j++ {
				b[i+j] = byte(v >> (8 * j))
			}
		}
	}
}

// snapshot copies a region, to check later which slots changed.
func snapshot(n *node) []byte { return bytes.Clone(n.region.Base[:n.region.Slots*n.region.SlotBytes]) }

// sameBytes checks every byte of each dst slot of c against the src slot
// of p in the same position.
func (e *env) sameBytes(p *node, src []int, c *node, dst []int) {
	e.t.Helper()
	for i := range src {
		want, got := p.region.Slot(src[i]), c.region.Slot(dst[i])
		if j := firstDiff(want, got); j >= 0 {
			e.t.Fatalf("%s slot %d (from %s slot %d): byte %d is %#x, want %#x",
				c.id, dst[i], p.id, src[i], j, got[j], want[j])
		}
	}
}

// untouched checks that every slot of n outside except still holds what
// before (a snapshot) held.
func (e *env) untouched(n *node, before []byte, except ...[]int) {
	e.t.Helper()
	sb := n.region.SlotBytes
	for s := range n.region.Slots {
		if slices.ContainsFunc(except, func(x []int) bool { return slices.Contains(x, s) }) {
			continue
		}
		if j := firstDiff(before[s*sb:(s+1)*sb], n.region.Slot(s)); j >= 0 {
			e.t.Fatalf("%s slot %d byte %d changed though no accepted transfer targeted it", n.id, s, j)
		}
	}
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// ok checks a successful completion's fields (whole slots).
func (e *env) ok(c rdma.Completion, what string, tok rdma.Token, peer string, slots int) {
	e.t.Helper()
	e.okBytes(c, what, tok, peer, int64(slots*e.o.SlotBytes))
}

// okBytes checks a successful completion of n payload bytes.
func (e *env) okBytes(c rdma.Completion, what string, tok rdma.Token, peer string, n int64) {
	e.t.Helper()
	if c.Err != nil {
		e.t.Fatalf("%s: %v", what, c.Err)
	}
	if c.Token != tok || c.Peer != peer || c.Bytes != n {
		e.t.Fatalf("%s: completion {%s %q %d}, want {%s %q %d}", what, c.Token, c.Peer, c.Bytes, tok, peer, n)
	}
}

// failed checks that a completion failed, with one of the given errors
// when any are given.
func (e *env) failed(c rdma.Completion, what string, want ...error) {
	e.t.Helper()
	if c.Err == nil {
		e.t.Fatalf("%s: succeeded, want an error", what)
	}
	if len(want) > 0 && !slices.ContainsFunc(want, func(w error) bool { return errors.Is(c.Err, w) }) {
		e.t.Fatalf("%s: %v, want one of %v", what, c.Err, want)
	}
}

// transfer moves n random slots from p to c and checks everything.
func (e *env) transfer(p, c *node, n int) {
	e.t.Helper()
	src, dst := e.slots(n), e.slots(n)
	e.randomize(p, src)
	before := snapshot(c)
	tok := rdma.NewToken()
	e.completes(e.expect(c, p, tok, dst), p, c, tok, src, dst)
	e.untouched(c, before, dst)
}

// completes writes p's src slots into c's dst slots under tok, which c
// expects as we, and checks that both ends complete and the bytes landed.
func (e *env) completes(we *waiter, p, c *node, tok rdma.Token, src, dst []int) {
	e.t.Helper()
	ww := e.write(p, c, tok, src, dst)
	e.ok(e.wait(we), we.what, tok, p.id, len(src))
	e.ok(e.wait(ww), ww.what, tok, c.id, len(src))
	e.sameBytes(p, src, c, dst)
}

// refused writes p's src slots into c's dst slots under tok, a transfer
// the consumer c must refuse, and checks it: with TwoSided, the producer's
// Write fails, c has counted it, and c's slots are as before; one-sided,
// the Write's done merely has to come.
func (e *env) refused(p, c *node, tok rdma.Token, src, dst []int) {
	e.t.Helper()
	before, refusedBefore := snapshot(c), c.tr.Stats().Refused
	w := e.write(p, c, tok, src, dst)
	got := e.wait(w)
	if !e.o.TwoSided {
		return
	}
	e.failed(got, w.what, rdma.ErrProtocol, rdma.ErrPeerGone)
	// NB: the slots are read before Stats, not after: the real transfer
	// that follows may write them, and the race detector does not see the
	// socket ordering it after this read. Stats is a call into c that the
	// later transfer's bookkeeping orders after (a lock in tcp).
	e.untouched(c, before)
	if n := c.tr.Stats().Refused; n <= refusedBefore {
		e.t.Fatalf("%s: Stats().Refused = %d after a refused transfer, want > %d", c.id, n, refusedBefore)
	}
}

package rdmatest

import (
	"errors"
	"slices"
	"sync"
	"time"

	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/rdma"
)

func testKindAndMetadata(e *env) {
	for _, n := range []*node{e.a, e.b} {
		if n.tr.Kind() == "" {
			e.t.Errorf("%s: empty Kind", n.id)
		}
		if len(n.tr.Metadata()) == 0 {
			e.t.Errorf("%s: empty Metadata after Register", n.id)
		}
		if s := n.tr.Stats(); s.Kind != n.tr.Kind() || s.PendingExpects != 0 || s.PendingWrites != 0 {
			e.t.Errorf("%s: fresh Stats %+v", n.id, s)
		}
	}
}

// testTransferExact moves random bytes through shuffled, non-contiguous
// slot lists both ways and checks every byte, the completions and the
// counters.
func testTransferExact(e *env) {
	const n = 13
	e.transfer(e.a, e.b, n)
	e.transfer(e.b, e.a, n)
	want := uint64(n * e.o.SlotBytes)
	for _, x := range []*node{e.a, e.b} {
		s := x.tr.Stats()
		if s.BytesSent != want || s.BytesReceived != want || s.WritesOK != 1 || s.ExpectsOK != 1 ||
			s.WritesFailed != 0 || s.ExpectsFailed != 0 || s.Refused != 0 || s.PendingExpects != 0 || s.PendingWrites != 0 {
			e.t.Errorf("%s: Stats %+v after one %d-byte transfer each way", x.id, s, want)
		}
	}
}

func testEdgeSizes(e *env) {
	e.transfer(e.a, e.b, 1)
	e.transfer(e.a, e.b, e.o.Slots) // the whole pool, in a random order
	e.transfer(e.b, e.a, e.o.Slots)
}

func testSequential(e *env) {
	for range 20 {
		e.transfer(e.a, e.b, 3)
	}
}

// plan is one transfer of testConcurrent.
type plan struct {
	p, c     *node
	tok      rdma.Token
	src, dst []int
	we, ww   *waiter
}

// testConcurrent runs 16 transfers at once, 8 each way, on disjoint slots,
// with the Writes issued from concurrent goroutines.
func testConcurrent(e *env) {
	const k, size = 8, 4
	var usedA, usedB []int
	var plans []*plan
	for i := range 2 * k {
		p, c, usedP, usedC := e.a, e.b, &usedA, &usedB
		if i%2 == 1 {
			p, c, usedP, usedC = e.b, e.a, &usedB, &usedA
		}
		pl := &plan{p: p, c: c, tok: rdma.NewToken(), src: e.slots(size, *usedP), dst: e.slots(size, *usedC)}
		*usedP, *usedC = append(*usedP, pl.src...), append(*usedC, pl.dst...)
		e.randomize(p, pl.src)
		pl.we = e.expect(c, p, pl.tok, pl.dst)
		plans = append(plans, pl)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(plans))
	for i, pl := range plans {
		pl.ww = e.waiter("%s.Write(%s, %s)", pl.p.id, pl.c.id, pl.tok)
		pl.ww.armed = true // checked below: a refused Write is reported through errs
		wg.Go(func() { errs[i] = pl.p.tr.Write(pl.c.id, pl.tok, pl.src, pl.dst, nil, pl.ww.done) })
	}
	wg.Wait()
	for i, pl := range plans {
		if errs[i] != nil {
			e.t.Fatalf("%s: %v", pl.ww.what, errs[i])
		}
	}
	for _, pl := range plans {
		e.ok(e.wait(pl.we), pl.we.what, pl.tok, pl.p.id, size)
		e.ok(e.wait(pl.ww), pl.ww.what, pl.tok, pl.c.id, size)
		e.sameBytes(pl.p, pl.src, pl.c, pl.dst)
	}
}

// testSrcReusable overwrites the source slots as soon as the Write's done
// ran: the destination must hold the bytes as they were.
func testSrcReusable(e *env) {
	src, dst := e.slots(5), e.slots(5)
	e.randomize(e.a, src)
	want := snapshot(e.a)
	tok := rdma.NewToken()
	we := e.expect(e.b, e.a, tok, dst)
	ww := e.write(e.a, e.b, tok, src, dst)
	e.ok(e.wait(ww), ww.what, tok, e.b.id, len(src))
	e.randomize(e.a, src)
	e.ok(e.wait(we), we.what, tok, e.a.id, len(src))
	sb := e.o.SlotBytes
	for i := range src {
		if j := firstDiff(want[src[i]*sb:(src[i]+1)*sb], e.b.region.Slot(dst[i])); j >= 0 {
			e.t.Fatalf("%s slot %d byte %d differs from the source as written", e.b.id, dst[i], j)
		}
	}
}

// testWrongToken: bytes under a token nobody expects are refused and the
// real expectation still completes.
func testWrongToken(e *env) {
	src, dst := e.slots(4), e.slots(4)
	e.randomize(e.a, src)
	tok := rdma.NewToken()
	we := e.expect(e.b, e.a, tok, dst)
	e.refused(e.a, e.b, rdma.NewToken(), src, dst)
	e.completes(we, e.a, e.b, tok, src, dst)
}

// testWrongPeer: a third node that knows the token is refused, both when
// the token is expected from a and when a sends a token expected from it.
func testWrongPeer(e *env) {
	c, _ := e.pair()
	if err := e.b.tr.Connect(c.id, c.tr.Metadata()); err != nil {
		e.t.Fatalf("%s.Connect(%s): %v", e.b.id, c.id, err)
	}
	if err := c.tr.Connect(e.b.id, e.b.tr.Metadata()); err != nil {
		e.t.Fatalf("%s.Connect(%s): %v", c.id, e.b.id, err)
	}
	for _, pr := range [][2]*node{{e.a, c}, {c, e.a}} {
		real, impostor := pr[0], pr[1]
		src, dst := e.slots(3), e.slots(3)
		e.randomize(real, src)
		e.randomize(impostor, src)
		tok := rdma.NewToken()
		we := e.expect(e.b, real, tok, dst)
		e.refused(impostor, e.b, tok, src, dst)
		e.completes(we, real, e.b, tok, src, dst)
	}
}

// testWrongSlots: the slot list must be the expected one exactly — same
// slots, same order, same count.
func testWrongSlots(e *env) {
	src, dst := e.slots(4), e.slots(4)
	other, extra := e.slots(1, dst)[0], e.slots(1, src)[0]
	e.randomize(e.a, append(slices.Clone(src), extra))
	tok := rdma.NewToken()
	we := e.expect(e.b, e.a, tok, dst)
	wrong := []struct{ src, dst []int }{
		{src, []int{dst[1], dst[0], dst[2], dst[3]}},
		{src, []int{dst[0], dst[1], dst[2], other}},
		{src[:3], dst[:3]},
		{append(slices.Clone(src), extra), append(slices.Clone(dst), other)},
	}
	for _, w := range wrong {
		e.refused(e.a, e.b, tok, w.src, w.dst)
	}
	e.completes(we, e.a, e.b, tok, src, dst)
}

func testDuplicateToken(e *env) {
	src, dst := e.slots(2), e.slots(2)
	e.randomize(e.a, src)
	tok := rdma.NewToken()
	we := e.expect(e.b, e.a, tok, dst)
	for _, d := range [][]int{dst, e.slots(2, dst)} {
		if _, err := e.tryExpect(e.b, e.a.id, tok, d); !errors.Is(err, rdma.ErrDuplicateToken) {
			e.t.Fatalf("second Expect of %s: %v, want ErrDuplicateToken", tok, err)
		}
	}
	e.completes(we, e.a, e.b, tok, src, dst)
}

// testCancelBeforeData: done(ErrCanceled) once; the token is dead after;
// Cancel of an unknown or finished token is ignored.
func testCancelBeforeData(e *env) {
	src, dst := e.slots(3), e.slots(3)
	tok := rdma.NewToken()
	we := e.expect(e.b, e.a, tok, dst)
	e.b.tr.Cancel(tok)
	got := e.wait(we)
	e.failed(got, we.what, rdma.ErrCanceled)
	if got.Token != tok || got.Peer != e.a.id {
		e.t.Fatalf("%s: completion {%s %q}, want {%s %q}", we.what, got.Token, got.Peer, tok, e.a.id)
	}
	if n := e.b.tr.Stats().PendingExpects; n != 0 {
		e.t.Fatalf("%s: %d pending expects after Cancel", e.b.id, n)
	}
	e.b.tr.Cancel(tok)
	e.b.tr.Cancel(rdma.NewToken())
	e.refused(e.a, e.b, tok, src, dst)

	tok2 := rdma.NewToken()
	we2, ww2 := e.expect(e.b, e.a, tok2, dst), e.write(e.a, e.b, tok2, src, dst)
	e.ok(e.wait(we2), we2.what, tok2, e.a.id, len(src))
	e.ok(e.wait(ww2), ww2.what, tok2, e.b.id, len(src))
	e.b.tr.Cancel(tok2) // finished: no second done (checked at cleanup)
}

// testCallsDoNotRunDone: Cancel and Disconnect return while the done they
// cause is still blocked — done runs on a transport goroutine, never on
// the caller's (an actor would deadlock on its own mailbox otherwise).
func testCallsDoNotRunDone(e *env) {
	for _, call := range []struct {
		name string
		f    func(tok rdma.Token)
	}{
		{"Cancel", func(tok rdma.Token) { e.b.tr.Cancel(tok) }},
		{"Disconnect", func(rdma.Token) { e.b.tr.Disconnect(e.a.id) }},
	} {
		tok, release := rdma.NewToken(), make(chan struct{})
		w := e.waiter("%s.Expect(%s) ended by %s", e.b.id, tok, call.name)
		if err := e.b.tr.Expect(e.a.id, tok, e.slots(1), nil, func(c rdma.Completion) { <-release; w.done(c) }); err != nil {
			e.t.Fatalf("%s: %v", w.what, err)
		}
		w.armed = true
		returned := make(chan struct{})
		go func() { call.f(tok); close(returned) }()
		timer := time.NewTimer(e.o.Timeout)
		select {
		case <-returned:
		case <-timer.C:
			e.t.Errorf("%s did not return while its done callback was blocked: done runs on the caller's goroutine", call.name)
		}
		timer.Stop()
		close(release)
		e.failed(e.wait(w), w.what, rdma.ErrCanceled, rdma.ErrPeerGone)
		<-returned
	}
}

func testUnknownPeer(e *env) {
	if _, err := e.tryWrite(e.a, "rdmatest-nobody", rdma.NewToken(), []int{0}, []int{0}); !errors.Is(err, rdma.ErrPeerUnknown) {
		e.t.Fatalf("Write to an unknown peer: %v, want ErrPeerUnknown", err)
	}
}

// testBadSlots: local indices outside the pool are refused by the call;
// remote ones by the call when the transport knows the peer's pool, else
// by the Write's done.
func testBadSlots(e *env) {
	n, tok := e.o.Slots, rdma.NewToken()
	for _, src := range [][]int{{n}, {-1}, {0, n + 5}} {
		if _, err := e.tryWrite(e.a, e.b.id, tok, src, e.slots(len(src))); !errors.Is(err, rdma.ErrBadSlot) {
			e.t.Errorf("Write from local slots %v: %v, want ErrBadSlot", src, err)
		}
	}
	for _, dst := range [][]int{{n}, {0, -1}} {
		if _, err := e.tryExpect(e.b, e.a.id, tok, dst); !errors.Is(err, rdma.ErrBadSlot) {
			e.t.Errorf("Expect into slots %v: %v, want ErrBadSlot", dst, err)
		}
	}
	if _, err := e.tryWrite(e.a, e.b.id, tok, []int{0, 1}, []int{0}); err == nil {
		e.t.Errorf("Write of 2 src slots into 1 dst slot accepted")
	}
	w, err := e.tryWrite(e.a, e.b.id, tok, []int{0}, []int{n})
	switch {
	case err != nil && !errors.Is(err, rdma.ErrBadSlot):
		e.t.Errorf("Write into remote slot %d: %v, want ErrBadSlot", n, err)
	case err == nil:
		e.failed(e.wait(w), w.what)
	}
	e.transfer(e.a, e.b, 2) // nothing above broke the pair
}

// testDisconnect: Disconnect fails the peer's pending Expects and an
// in-flight Write with ErrPeerGone, and forgets the peer.
func testDisconnect(e *env) {
	var ws []*waiter
	var used []int
	for range 3 {
		dst := e.slots(2, used)
		used = append(used, dst...)
		ws = append(ws, e.expect(e.b, e.a, rdma.NewToken(), dst))
	}
	e.b.tr.Disconnect(e.a.id)
	for _, w := range ws {
		e.failed(e.wait(w), w.what, rdma.ErrPeerGone)
	}
	if s := e.b.tr.Stats(); s.PendingExpects != 0 {
		e.t.Fatalf("%s: %d pending expects after Disconnect", e.b.id, s.PendingExpects)
	}
	if err := e.b.tr.Connect(e.a.id, e.a.tr.Metadata()); err != nil {
		e.t.Fatalf("reconnect: %v", err)
	}
	e.transfer(e.a, e.b, 2)

	src, dst := e.slots(e.o.Slots/2), e.slots(e.o.Slots/2)
	e.randomize(e.a, src)
	tok := rdma.NewToken()
	we := e.expect(e.b, e.a, tok, dst)
	ww := e.write(e.a, e.b, tok, src, dst)
	e.a.tr.Disconnect(e.b.id)
	if c := e.wait(ww); c.Err != nil {
		e.failed(c, ww.what, rdma.ErrPeerGone)
	}
	if _, err := e.tryWrite(e.a, e.b.id, rdma.NewToken(), src, dst); !errors.Is(err, rdma.ErrPeerUnknown) {
		e.t.Fatalf("Write after Disconnect: %v, want ErrPeerUnknown", err)
	}
	// The consumer's side either completed or is still pending for its
	// owner to cancel; it never reports success without every byte.
	e.b.tr.Cancel(tok)
	if c := e.wait(we); c.Err == nil {
		e.sameBytes(e.a, src, e.b, dst)
	} else {
		e.failed(c, we.what, rdma.ErrCanceled, rdma.ErrPeerGone)
	}
}

// testReconnect: a second Connect starts a new epoch: the old one's
// pending Expects fail, and transfers work again both ways, over whatever
// connections the old epoch left behind.
func testReconnect(e *env) {
	e.transfer(e.a, e.b, 2) // leaves the old epoch's connections idle
	we := e.expect(e.b, e.a, rdma.NewToken(), e.slots(2))
	if err := e.b.tr.Connect(e.a.id, e.a.tr.Metadata()); err != nil {
		e.t.Fatalf("second Connect: %v", err)
	}
	e.failed(e.wait(we), we.what, rdma.ErrPeerGone)
	e.transfer(e.a, e.b, 3)
	if err := e.a.tr.Connect(e.b.id, e.b.tr.Metadata()); err != nil {
		e.t.Fatalf("second Connect: %v", err)
	}
	e.transfer(e.a, e.b, 3)
	e.transfer(e.b, e.a, 3)
}

// testClose: Close fails everything pending with ErrClosed, later calls
// fail with ErrClosed, and no goroutine of either transport survives.
func testClose(e *env) {
	var ws []*waiter
	used := []int{}
	for range 3 {
		dst := e.slots(2, used)
		used = append(used, dst...)
		ws = append(ws, e.expect(e.b, e.a, rdma.NewToken(), dst))
	}
	src, dst := e.slots(e.o.Slots/2), e.slots(e.o.Slots/2, used)
	tok := rdma.NewToken()
	we := e.expect(e.b, e.a, tok, dst)
	ww := e.write(e.a, e.b, tok, src, dst)
	e.a.close()
	if c := e.wait(ww); c.Err != nil {
		e.failed(c, ww.what, rdma.ErrClosed)
	}
	e.closedCalls(e.a)
	e.b.close()
	for _, w := range ws {
		e.failed(e.wait(w), w.what, rdma.ErrClosed)
	}
	if c := e.wait(we); c.Err != nil {
		e.failed(c, we.what, rdma.ErrClosed, rdma.ErrPeerGone)
	}
	e.closedCalls(e.b)
	goleak.VerifyNone(e.t, e.ignore...)
}

// closedCalls checks a closed transport's calls.
func (e *env) closedCalls(n *node) {
	tok := rdma.NewToken()
	if _, err := e.tryWrite(n, e.b.id, tok, []int{0}, []int{0}); !errors.Is(err, rdma.ErrClosed) {
		e.t.Errorf("%s: Write after Close: %v, want ErrClosed", n.id, err)
	}
	if _, err := e.tryExpect(n, e.a.id, tok, []int{0}); !errors.Is(err, rdma.ErrClosed) {
		e.t.Errorf("%s: Expect after Close: %v, want ErrClosed", n.id, err)
	}
	if err := n.tr.Connect(e.a.id, e.a.tr.Metadata()); !errors.Is(err, rdma.ErrClosed) {
		e.t.Errorf("%s: Connect after Close: %v, want ErrClosed", n.id, err)
	}
	n.tr.Cancel(tok)
	n.tr.Disconnect(e.a.id)
	_ = n.tr.Stats()
}

// lengths draws n block lengths in 1..SlotBytes, the edges included.
func (e *env) lengths(n int) []int {
	lens := make([]int, n)
	for i := range lens {
		switch i % 4 {
		case 0:
			lens[i] = e.o.SlotBytes
		case 1:
			lens[i] = 1
		default:
			lens[i] = 1 + e.rng.IntN(e.o.SlotBytes)
		}
	}
	e.rng.Shuffle(n, func(i, j int) { lens[i], lens[j] = lens[j], lens[i] })
	return lens
}

// testMixedLengths moves blocks of several lengths, interleaved, both
// ways: each block lands at the start of its slot, byte-exact; the rest of
// the slot (unless the transport moves whole slots) and every other slot
// are untouched; the completions count the blocks' bytes.
func testMixedLengths(e *env) {
	for _, pr := range [][2]*node{{e.a, e.b}, {e.b, e.a}} {
		p, c := pr[0], pr[1]
		const n = 17
		src, dst, lens := e.slots(n), e.slots(n), e.lengths(n)
		e.randomize(p, src)
		before := snapshot(c)
		tok := rdma.NewToken()
		we, err := e.tryExpectLens(c, p.id, tok, dst, lens)
		if err != nil {
			e.t.Fatalf("%s: %v", we.what, err)
		}
		we.armed = true
		ww, err := e.tryWriteLens(p, c.id, tok, src, dst, lens)
		if err != nil {
			e.t.Fatalf("%s: %v", ww.what, err)
		}
		ww.armed = true
		want := rdma.Sum(lens)
		e.okBytes(e.wait(we), we.what, tok, p.id, want)
		e.okBytes(e.wait(ww), ww.what, tok, c.id, want)
		sb := e.o.SlotBytes
		for i := range src {
			got, blk := c.region.Slot(dst[i]), p.region.Slot(src[i])[:lens[i]]
			if j := firstDiff(blk, got[:lens[i]]); j >= 0 {
				e.t.Fatalf("%s slot %d (a block of %d bytes from %s slot %d): byte %d differs", c.id, dst[i], lens[i], p.id, src[i], j)
			}
			if e.o.WholeSlots {
				continue
			}
			if j := firstDiff(before[dst[i]*sb+lens[i]:(dst[i]+1)*sb], got[lens[i]:]); j >= 0 {
				e.t.Fatalf("%s slot %d: byte %d past its block of %d bytes changed", c.id, dst[i], lens[i]+j, lens[i])
			}
		}
		e.untouched(c, before, dst)
	}
}

// testWrongLengths: a transfer whose blocks' lengths are not the expected
// ones is refused (two-sided) and the real expectation still completes.
func testWrongLengths(e *env) {
	src, dst := e.slots(3), e.slots(3)
	e.randomize(e.a, src)
	lens := []int{e.o.SlotBytes / 2, 7, e.o.SlotBytes}
	tok := rdma.NewToken()
	we, err := e.tryExpectLens(e.b, e.a.id, tok, dst, lens)
	if err != nil {
		e.t.Fatalf("%s: %v", we.what, err)
	}
	we.armed = true
	if e.o.TwoSided {
		for _, wrong := range [][]int{{e.o.SlotBytes/2 + 1, 7, e.o.SlotBytes}, {e.o.SlotBytes, e.o.SlotBytes, e.o.SlotBytes}} {
			before, refusedBefore := snapshot(e.b), e.b.tr.Stats().Refused
			w, err := e.tryWriteLens(e.a, e.b.id, tok, src, dst, wrong)
			if err != nil {
				e.t.Fatalf("%s: %v", w.what, err)
			}
			w.armed = true
			e.failed(e.wait(w), w.what, rdma.ErrProtocol, rdma.ErrPeerGone)
			e.untouched(e.b, before)
			if n := e.b.tr.Stats().Refused; n <= refusedBefore {
				e.t.Fatalf("%s: Stats().Refused = %d after a refused transfer, want > %d", e.b.id, n, refusedBefore)
			}
		}
	}
	ww, err := e.tryWriteLens(e.a, e.b.id, tok, src, dst, lens)
	if err != nil {
		e.t.Fatalf("%s: %v", ww.what, err)
	}
	ww.armed = true
	e.okBytes(e.wait(we), we.what, tok, e.a.id, rdma.Sum(lens))
	e.okBytes(e.wait(ww), ww.what, tok, e.b.id, rdma.Sum(lens))
}

// testBadLengths: a length of 0, beyond the slot, or not one per slot is
// refused by the call (ErrBadLength) and its done never runs.
func testBadLengths(e *env) {
	sb := e.o.SlotBytes
	for _, lens := range [][]int{{0, 5}, {5, sb + 1}, {5}, {5, 5, 5}, {-1, 5}} {
		if _, err := e.tryExpectLens(e.b, e.a.id, rdma.NewToken(), e.slots(2), lens); !errors.Is(err, rdma.ErrBadLength) {
			e.t.Errorf("Expect at lengths %v: %v, want ErrBadLength", lens, err)
		}
		if _, err := e.tryWriteLens(e.a, e.b.id, rdma.NewToken(), e.slots(2), e.slots(2), lens); !errors.Is(err, rdma.ErrBadLength) {
			e.t.Errorf("Write at lengths %v: %v, want ErrBadLength", lens, err)
		}
	}
	e.transfer(e.a, e.b, 2) // nothing above broke the pair
}

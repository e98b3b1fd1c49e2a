package rdmatest

import (
	"bytes"
	"errors"

	"github.com/kvtier/kvtier/rdma"
)

// sized is a region whose pool also serves blocks of a second size: its
// grid, then ids first..first+n-1 of slots of size bytes, laid from offset
// 0 of the same memory (as a kvtier pool of two block sizes numbers them),
// then spare ids below the region's IDs that name no slot.
type sized struct {
	rdma.Region
	first, n, size int
}

// sizedSpare is how many ids past the second size's name no slot.
const sizedSpare = 5

// sizedRegion allocates a region of the suite's grid plus a second size,
// 3/2 of a grid slot and odd (so an offset taken from the wrong size
// shows), filled with a recognisable pattern.
func (e *env) sizedRegion() sized {
	r := e.region()
	size := e.o.SlotBytes*3/2 | 1
	s := sized{first: r.Slots, n: len(r.Base) / size, size: size}
	r.Locate = func(i int) (off, n int) {
		if j := i - s.first; j >= 0 && j < s.n {
			return j * size, size
		}
		return 0, 0
	}
	r.IDs, r.MaxSlotBytes = s.first+s.n+sizedSpare, size
	s.Region = r
	return s
}

// ids picks k distinct ids of the second size in random order.
func (s sized) ids(e *env, k int) []int {
	perm := e.rng.Perm(s.n)[:k]
	for i := range perm {
		perm[i] += s.first
	}
	return perm
}

// testSeveralSlotSizes (Options.SlotSizes): two pools that serve blocks of
// a second size, numbered after the grid (Region.Locate), move whole slots
// of that size both ways, byte-exact, every byte outside the destination
// slots untouched; a grid slot's block lands in a larger slot of the other
// size; a block longer than its slot, an id no slot has and one past the
// peer's id bound are refused, and the pair still works after.
func testSeveralSlotSizes(e *env) {
	if !e.o.SlotSizes {
		e.t.Skip("the transport addresses slots of one size only")
	}
	ra, rb := e.sizedRegion(), e.sizedRegion()
	a, b, aID, bID := e.newPair(e.t, ra.Region, rb.Region)
	na, nb := e.node(a, aID, ra.Region), e.node(b, bID, rb.Region)
	sizes := map[*node]sized{na: ra, nb: rb}

	for _, pr := range [][2]*node{{na, nb}, {nb, na}} {
		p, c := pr[0], pr[1]
		src, dst := sizes[p].ids(e, 9), sizes[c].ids(e, 9)
		e.randomize(p, src)
		before := bytes.Clone(c.region.Base)
		tok := rdma.NewToken()
		we, ww := e.expect(c, p, tok, dst), e.write(p, c, tok, src, dst)
		want := int64(len(src) * sizes[p].size)
		e.okBytes(e.wait(we), we.what, tok, p.id, want)
		e.okBytes(e.wait(ww), ww.what, tok, c.id, want)
		e.sameBytes(p, src, c, dst)
		e.outsideUntouched(c, sizes[c], before, dst)
	}

	// A grid slot's block into a larger slot of the second size.
	src, dst, lens := e.slots(3), rb.ids(e, 3), []int{e.o.SlotBytes, e.o.SlotBytes, 1}
	e.randomize(na, src)
	tok := rdma.NewToken()
	we, err := e.tryExpectLens(nb, na.id, tok, dst, lens)
	if err != nil {
		e.t.Fatalf("%s: %v", we.what, err)
	}
	ww, err := e.tryWriteLens(na, nb.id, tok, src, dst, lens)
	if err != nil {
		e.t.Fatalf("%s: %v", ww.what, err)
	}
	e.okBytes(e.wait(we), we.what, tok, na.id, rdma.Sum(lens))
	e.okBytes(e.wait(ww), ww.what, tok, nb.id, rdma.Sum(lens))
	for i := range src {
		if !bytes.Equal(na.region.Slot(src[i])[:lens[i]], nb.region.Block(dst[i], lens[i])) {
			e.t.Fatalf("block %d of %d bytes differs in its larger slot", i, lens[i])
		}
	}

	// Refused, by the call.
	big := rb.size
	if _, err := e.tryExpectLens(nb, na.id, rdma.NewToken(), e.slots(1), []int{big}); !errors.Is(err, rdma.ErrBadLength) {
		e.t.Errorf("Expect of a %d-byte block into a grid slot of %d: %v, want ErrBadLength", big, e.o.SlotBytes, err)
	}
	noSlot := rb.first + rb.n // below IDs, but no slot
	if _, err := e.tryExpect(nb, na.id, rdma.NewToken(), []int{noSlot}); !errors.Is(err, rdma.ErrBadSlot) {
		e.t.Errorf("Expect into id %d, which names no slot: %v, want ErrBadSlot", noSlot, err)
	}
	if _, err := e.tryWrite(na, nb.id, rdma.NewToken(), []int{ra.first + ra.n}, []int{dst[0]}); !errors.Is(err, rdma.ErrBadSlot) {
		e.t.Errorf("Write from id %d, which names no slot: %v, want ErrBadSlot", ra.first+ra.n, err)
	}
	if _, err := e.tryWrite(na, nb.id, rdma.NewToken(), src[:1], []int{rb.IDLimit()}); !errors.Is(err, rdma.ErrBadSlot) {
		e.t.Errorf("Write into id %d, past the peer's ids: %v, want ErrBadSlot", rb.IDLimit(), err)
	}
	if _, err := e.tryWriteLens(na, nb.id, rdma.NewToken(), ra.ids(e, 1), dst[:1], []int{ra.size + 1}); !errors.Is(err, rdma.ErrBadLength) {
		e.t.Errorf("Write of %d bytes from a slot of %d: %v, want ErrBadLength", ra.size+1, ra.size, err)
	}

	// The pair still moves blocks of the second size.
	src, dst = ra.ids(e, 2), rb.ids(e, 2)
	e.randomize(na, src)
	tok = rdma.NewToken()
	e.completesBytes(e.expect(nb, na, tok, dst), na, nb, tok, src, dst, int64(2*ra.size))
}

// outsideUntouched checks that every byte of n's memory outside the dst
// slots (ids of the second size of s) still holds what before held: slots
// of several sizes share the memory, so the check is by byte.
func (e *env) outsideUntouched(n *node, s sized, before []byte, dst []int) {
	e.t.Helper()
	moved := make([]bool, len(n.region.Base))
	for _, id := range dst {
		off := (id - s.first) * s.size
		for i := range s.size {
			moved[off+i] = true
		}
	}
	for i := range before {
		if !moved[i] && before[i] != n.region.Base[i] {
			e.t.Fatalf("%s byte %d changed though no accepted transfer targeted it", n.id, i)
		}
	}
}

// completesBytes is completes for blocks that are whole slots of another
// size than the grid's: n payload bytes in all.
func (e *env) completesBytes(we *waiter, p, c *node, tok rdma.Token, src, dst []int, n int64) {
	e.t.Helper()
	ww := e.write(p, c, tok, src, dst)
	e.okBytes(e.wait(we), we.what, tok, p.id, n)
	e.okBytes(e.wait(ww), ww.what, tok, c.id, n)
	e.sameBytes(p, src, c, dst)
}

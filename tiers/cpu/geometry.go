package cpu

import (
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/messages"
)

// Geometries: one pool, slots of several sizes.
//
// The pool is one region of budget bytes, allocated up front. Every block
// size an engine declares (its geometry) numbers its slots r = 0 ..
// budget/bytes − 1 at bytes [r·bytes, (r+1)·bytes) of that one region, so
// an engine of any size addresses its slots as in a pool of its own (slot
// r at r × its block size) and every page stays where it was mapped,
// registered or pinned: bytes change hands between geometries, memory is
// never returned or remapped. The State's slot ids of a geometry are
// [base, base+n), n = budget/bytes.
//
// A geometry may use a slot only while it holds (commits) the slot's
// bytes, and the committed slots of different geometries never overlap;
// bytes no slot holds are gaps. A geometry that needs a slot takes, in
// order:
//
//  1. a free slot of its own;
//  2. a slot that lies in a gap;
//  3. a slot whose bytes only other geometries' free slots hold (those
//     give them up; what they held beyond it becomes a gap);
//  4. the policy's victim, of whichever geometry: one eviction order
//     across every geometry, so a busy model takes memory from an idle
//     one and an idle one that wakes takes it back the same way. A victim
//     of another geometry is evicted with every block sharing its bytes
//     with the slot taken (at most a slot's worth of collateral, every
//     one of them evictable, or the victim is passed over).
//
// With one geometry every slot is committed from the start and only step
// 1 and the plain eviction run.

// MaxGeometries bounds the block sizes one pool serves at once.
const MaxGeometries = 8

// maxSlotIDs bounds the slot ids of a geometry after the first: sixteen
// times the first's (a block a sixteenth of its size), or 65,536. The
// State keeps a slot's entry and the policy's for every id, so a hello
// declaring a tiny block must not cost memory in proportion to the pool.
func maxSlotIDs(firstSlots int) int64 { return max(16*int64(firstSlots), 1<<16) }

// geometry is one block size's slots.
type geometry struct {
	bytes     int    // bytes per slot
	base, n   int    // its slot ids: [base, base+n)
	committed []bool // per slot (id − base): it holds its bytes
	held      int    // how many of its slots hold their bytes
	free      []int  // committed free slot ids; pop from the end
	evictable int    // its ready slots with no pin and no lease
	ready     int    // its ready slots
}

// span is a gap: bytes [lo, hi) of the region that no slot holds.
type span struct{ lo, hi int64 }

// GeometryOccupancy is one geometry's share of the pool.
type GeometryOccupancy struct {
	BlockBytes int // bytes per slot
	Slots      int // slot ids it may use (as many as the budget holds)
	Committed  int // of those, slots holding their bytes
	Free       int // committed and free
	Ready      int // holding a readable block
}

// addGeometry appends a geometry of blockBytes to the slot space; its
// slots are all committed (the first geometry: the whole region is its)
// or none.
func (s *State) addGeometry(blockBytes int, committed bool) int {
	gi, base := len(s.geo), len(s.slots)
	n := int(s.budget / int64(blockBytes))
	g := geometry{bytes: blockBytes, base: base, n: n, committed: make([]bool, n)}
	s.geo = append(s.geo, g)
	s.slots = append(s.slots, make([]slot, n)...)
	s.gOf = append(s.gOf, slices.Repeat([]uint8{uint8(gi)}, n)...)
	s.canEvict = append(s.canEvict, make([]bool, n)...)
	s.freeAt = append(s.freeAt, slices.Repeat([]int32{-1}, n)...)
	if committed {
		for r := n - 1; r >= 0; r-- { // pop from the end hands out the lowest id first
			s.geo[gi].committed[r] = true
			s.pushFree(base + r)
		}
		s.geo[gi].held = n
		if tail := int64(n) * int64(blockBytes); tail < s.budget {
			s.gaps = append(s.gaps, span{tail, s.budget})
		}
	}
	if gi > 0 {
		growPolicy(s.policy, len(s.slots))
	}
	return gi
}

// AddGeometry makes blockBytes a geometry of the pool, holding no bytes
// yet, and returns its index and its slot ids' base and count; a size the
// State serves already returns its existing geometry. ErrBadConfig: a size
// the budget cannot hold one slot of, or one geometry too many.
func (s *State) AddGeometry(blockBytes int) (gi, base, n int, err error) {
	if gi, ok := s.GeometryOf(blockBytes); ok {
		g := &s.geo[gi]
		return gi, g.base, g.n, nil
	}
	switch {
	case blockBytes <= 0 || int64(blockBytes) > s.budget:
		return 0, 0, 0, fmt.Errorf("%w: blocks of %d bytes in a pool of %d", messages.ErrBadConfig, blockBytes, s.budget)
	case len(s.geo) == MaxGeometries:
		return 0, 0, 0, fmt.Errorf("%w: a pool serves at most %d block sizes", messages.ErrBadConfig, MaxGeometries)
	case int64(len(s.slots))+s.budget/int64(blockBytes) > 1<<31-1 || s.budget/int64(blockBytes) > maxSlotIDs(s.geo[0].n):
		return 0, 0, 0, fmt.Errorf("%w: blocks of %d bytes: too many slots in the pool (at most %d)",
			messages.ErrBadConfig, blockBytes, maxSlotIDs(s.geo[0].n))
	}
	gi = s.addGeometry(blockBytes, false)
	return gi, s.geo[gi].base, s.geo[gi].n, nil
}

// GeometryOf returns the geometry whose slots are blockBytes.
func (s *State) GeometryOf(blockBytes int) (int, bool) {
	for gi := range s.geo {
		if s.geo[gi].bytes == blockBytes {
			return gi, true
		}
	}
	return 0, false
}

// Geometries is how many block sizes the State serves.
func (s *State) Geometries() int { return len(s.geo) }

// Budget is the bytes of the region every geometry's slots share.
func (s *State) Budget() int64 { return s.budget }

// SlotGeometry returns the geometry of slot idx (its bytes, its base).
func (s *State) SlotGeometry(idx int) (blockBytes, base int) {
	g := &s.geo[s.gOf[idx]]
	return g.bytes, g.base
}

// GeometryOccupancy counts each geometry's slots.
func (s *State) GeometryOccupancy() []GeometryOccupancy {
	out := make([]GeometryOccupancy, len(s.geo))
	for gi := range s.geo {
		g := &s.geo[gi]
		out[gi] = GeometryOccupancy{BlockBytes: g.bytes, Slots: g.n, Committed: g.held, Free: len(g.free), Ready: g.ready}
	}
	return out
}

// countEvictable moves slot idx in or out of the evictable counts (and
// its canEvict mark: every change of isEvictable passes through here).
func (s *State) countEvictable(idx, d int) {
	s.canEvict[idx] = d > 0
	s.evictable += d
	s.geo[s.gOf[idx]].evictable += d
}

// bytesOf is the region bytes slot idx holds.
func (s *State) bytesOf(idx int) (lo, hi int64) {
	g := &s.geo[s.gOf[idx]]
	lo = int64(idx-g.base) * int64(g.bytes)
	return lo, lo + int64(g.bytes)
}

// room is how many slots of geometry gi a reservation can count on without
// evicting the protected slots: exact with one geometry; with several, an
// upper bound (bytes are counted as if any geometry's served any other),
// and makeFree says when the slots' alignment leaves fewer.
func (s *State) room(gi int, protected map[int]struct{}) int {
	g := &s.geo[gi]
	own := len(g.free) + g.evictable
	var other int64
	for _, sp := range s.gaps {
		other += sp.hi - sp.lo
	}
	for hi := range s.geo {
		if hi != gi {
			h := &s.geo[hi]
			other += int64(len(h.free)+h.evictable) * int64(h.bytes)
		}
	}
	for idx := range protected {
		if hi := int(s.gOf[idx]); hi == gi {
			own--
		} else {
			other -= int64(s.geo[hi].bytes)
		}
	}
	return own + int(max(0, other)/int64(g.bytes))
}

// makeFree gives geometry gi one more free committed slot, by the steps at
// the top of this file, and returns the keys it evicted for it; false when
// no step can (nothing it evicted is put back).
func (s *State) makeFree(gi int, protected map[int]struct{}, evicted []messages.Key) ([]messages.Key, bool) {
	g := &s.geo[gi]
	if len(g.free) > 0 {
		return evicted, true
	}
	if len(s.geo) == 1 {
		if s.evictable-len(protected) <= 0 {
			return evicted, false
		}
		return append(evicted, s.evictOne(protected)), true
	}
	if r, ok := s.inGap(gi); ok {
		return s.take(gi, r, protected, evicted), true
	}
	if r, ok := s.overFree(gi); ok {
		return s.take(gi, r, protected, evicted), true
	}
	var target int
	v, ok := s.policy.Victim(func(i int) bool {
		if !s.canEvict[i] {
			return false
		}
		if _, keep := protected[i]; keep {
			return false
		}
		if int(s.gOf[i]) == gi {
			return true
		}
		// NB: every policy's last call is on the victim it returns, so target
		// is the victim's when Victim returns.
		r, ok := s.cover(gi, i, protected)
		target = r
		return ok
	})
	if !ok {
		return evicted, false
	}
	if int(s.gOf[v]) == gi {
		evicted = append(evicted, s.slots[v].key)
		s.evict(v)
		return evicted, true
	}
	return s.take(gi, target, protected, evicted), true
}

// evict frees ready, unheld slot v, already out of the policy.
func (s *State) evict(v int) {
	s.countEvictable(v, -1)
	s.freeSlot(v)
	s.Counters.Evictions++
}

// inGap finds a slot of geometry gi that lies in a gap.
func (s *State) inGap(gi int) (int, bool) {
	b := int64(s.geo[gi].bytes)
	for _, sp := range s.gaps {
		r := (sp.lo + b - 1) / b
		if (r+1)*b <= sp.hi && int(r) < s.geo[gi].n {
			return int(r), true
		}
	}
	return 0, false
}

// overFree finds a slot of geometry gi whose bytes only other geometries'
// free slots (and gaps) hold, looking at the most recently freed few.
func (s *State) overFree(gi int) (int, bool) {
	const tries = 64
	b := int64(s.geo[gi].bytes)
	for hi := range s.geo {
		h := &s.geo[hi]
		if hi == gi {
			continue
		}
		for k := len(h.free) - 1; k >= 0 && k >= len(h.free)-tries; k-- {
			lo, _ := s.bytesOf(h.free[k])
			r := int(lo / b)
			if r < s.geo[gi].n && s.onlyOthers(gi, r, func(id int) bool { return s.slots[id].state == slotFree }) {
				return r, true
			}
		}
	}
	return 0, false
}

// cover is the slot of geometry gi that holds victim v's first byte, when
// every other geometry's block sharing its bytes can go with v.
func (s *State) cover(gi, v int, protected map[int]struct{}) (int, bool) {
	lo, _ := s.bytesOf(v)
	r := int(lo / int64(s.geo[gi].bytes))
	if r >= s.geo[gi].n || s.geo[gi].committed[r] {
		return 0, false
	}
	return r, s.onlyOthers(gi, r, func(id int) bool {
		if s.slots[id].state == slotFree {
			return true
		}
		_, keep := protected[id]
		return !keep && s.isEvictable(id)
	})
}

// onlyOthers reports whether every slot of another geometry that holds
// bytes of slot r of geometry gi passes ok.
func (s *State) onlyOthers(gi, r int, ok func(id int) bool) bool {
	pass := true
	s.holders(gi, r, func(id int) bool {
		pass = ok(id)
		return pass
	})
	return pass
}

// holders calls f on every committed slot of another geometry that holds
// bytes of slot r of geometry gi, until f returns false.
func (s *State) holders(gi, r int, f func(id int) bool) {
	b := int64(s.geo[gi].bytes)
	lo, hi := int64(r)*b, int64(r+1)*b
	for hj := range s.geo {
		h := &s.geo[hj]
		if hj == gi {
			continue
		}
		hb := int64(h.bytes)
		for y := lo / hb; y < int64(h.n) && y*hb < hi; y++ {
			if h.committed[y] && !f(h.base+int(y)) {
				return
			}
		}
	}
}

// take commits slot r of geometry gi: every other geometry's slot holding
// its bytes is evicted (if ready) and gives them up, what those held
// beyond slot r becomes a gap, and r joins gi's free slots.
func (s *State) take(gi, r int, protected map[int]struct{}, evicted []messages.Key) []messages.Key {
	b := int64(s.geo[gi].bytes)
	lo, hi := int64(r)*b, int64(r+1)*b
	var held []int
	s.holders(gi, r, func(id int) bool { held = append(held, id); return true })
	for _, id := range held {
		if s.slots[id].state == slotReady {
			if _, keep := protected[id]; keep || !s.isEvictable(id) {
				panic(fmt.Sprintf("cpu: slot %d taken for geometry %d while held", id, gi))
			}
			evicted = append(evicted, s.slots[id].key)
			s.policy.Remove(id)
			s.evict(id)
		}
		s.giveUp(id)
	}
	s.cutGap(lo, hi)
	s.geo[gi].committed[r] = true
	s.geo[gi].held++
	s.pushFree(s.geo[gi].base + r)
	return evicted
}

// giveUp makes free slot id give up its bytes: a gap until taken.
func (s *State) giveUp(id int) {
	s.removeFree(id)
	g := &s.geo[s.gOf[id]]
	g.committed[id-g.base] = false
	g.held--
	lo, hi := s.bytesOf(id)
	s.addGap(lo, hi)
}

// addGap records bytes [lo, hi) as held by no slot.
func (s *State) addGap(lo, hi int64) {
	s.gaps = append(s.gaps, span{lo, hi})
	slices.SortFunc(s.gaps, func(a, b span) int { return int(a.lo - b.lo) })
	merged := s.gaps[:1]
	for _, sp := range s.gaps[1:] {
		if last := &merged[len(merged)-1]; sp.lo <= last.hi {
			last.hi = max(last.hi, sp.hi)
			continue
		}
		merged = append(merged, sp)
	}
	s.gaps = merged
}

// cutGap removes bytes [lo, hi) from the gaps.
func (s *State) cutGap(lo, hi int64) {
	out := s.gaps[:0:0]
	for _, sp := range s.gaps {
		if sp.hi <= lo || sp.lo >= hi {
			out = append(out, sp)
			continue
		}
		if sp.lo < lo {
			out = append(out, span{sp.lo, lo})
		}
		if sp.hi > hi {
			out = append(out, span{hi, sp.hi})
		}
	}
	s.gaps = out
}

// popFree takes a free committed slot of geometry gi (there is one).
func (s *State) popFree(gi int) int {
	g := &s.geo[gi]
	idx := g.free[len(g.free)-1]
	g.free = g.free[:len(g.free)-1]
	s.freeAt[idx] = -1
	return idx
}

// pushFree returns slot idx to its geometry's free slots.
func (s *State) pushFree(idx int) {
	g := &s.geo[s.gOf[idx]]
	s.freeAt[idx] = int32(len(g.free))
	g.free = append(g.free, idx)
}

// removeFree takes free slot idx out of its geometry's free slots.
func (s *State) removeFree(idx int) {
	g := &s.geo[s.gOf[idx]]
	at, last := s.freeAt[idx], g.free[len(g.free)-1]
	g.free[at], s.freeAt[last] = last, at
	g.free = g.free[:len(g.free)-1]
	s.freeAt[idx] = -1
}

// freeSlots is how many committed free slots every geometry has together.
func (s *State) freeSlots() int {
	n := 0
	for gi := range s.geo {
		n += len(s.geo[gi].free)
	}
	return n
}

// committedSlots is how many slots hold their bytes.
func (s *State) committedSlots() int {
	n := 0
	for gi := range s.geo {
		n += s.geo[gi].held
	}
	return n
}

// checkGeometries verifies the geometries' free lists, that committed
// slots never share a byte and, with the gaps, cover the region exactly.
func (s *State) checkGeometries(bad func(string, ...any)) []bool {
	inFree := make([]bool, len(s.slots))
	var spans []span
	for gi := range s.geo {
		g := &s.geo[gi]
		if len(g.committed) != g.n || g.base+g.n > len(s.slots) {
			bad("geometry %d: %d slots from %d, %d committed flags", gi, g.n, g.base, len(g.committed))
			continue
		}
		evictable, ready, held := 0, 0, 0
		for r := range g.n {
			idx := g.base + r
			if int(s.gOf[idx]) != gi {
				bad("slot %d of geometry %d is marked %d", idx, gi, s.gOf[idx])
			}
			if s.isEvictable(idx) {
				evictable++
			}
			if s.slots[idx].state == slotReady {
				ready++
			}
			if g.committed[r] {
				held++
				lo, hi := s.bytesOf(idx)
				spans = append(spans, span{lo, hi})
			} else if s.slots[idx].state != slotFree {
				bad("slot %d in use but holds no bytes", idx)
			}
		}
		if evictable != g.evictable || ready != g.ready || held != g.held {
			bad("geometry %d counts %d evictable, %d ready, %d held; has %d, %d, %d", gi, g.evictable, g.ready, g.held,
				evictable, ready, held)
		}
		for k, idx := range g.free {
			if idx < g.base || idx >= g.base+g.n || !g.committed[idx-g.base] || s.freeAt[idx] != int32(k) {
				bad("slot %d listed free in geometry %d at %d (committed, position wrong)", idx, gi, k)
				continue
			}
			if inFree[idx] {
				bad("slot %d free twice", idx)
			}
			inFree[idx] = true
		}
	}
	for idx := range s.slots {
		g := &s.geo[s.gOf[idx]]
		if !g.committed[idx-g.base] {
			inFree[idx] = s.slots[idx].state == slotFree // NB: a slot holding no bytes is free, never listed
			if s.freeAt[idx] != -1 {
				bad("slot %d holds no bytes but has a free-list position", idx)
			}
		}
	}
	spans = append(spans, s.gaps...)
	slices.SortFunc(spans, func(a, b span) int { return int(a.lo - b.lo) })
	at := int64(0)
	for _, sp := range spans {
		if sp.lo != at {
			bad("region bytes from %d: next span at %d (shared or unaccounted)", at, sp.lo)
			break
		}
		at = sp.hi
	}
	if at != s.budget {
		bad("region covered to %d of %d", at, s.budget)
	}
	return inFree
}

// growPolicy widens p to n slots.
func growPolicy(p Policy, n int) {
	switch p := p.(type) {
	case *lru:
		p.l.grow(n)
	case *arc:
		p.t1.grow(n)
		p.t2.grow(n)
		p.key = slices.Grow(p.key, n-len(p.key))[:n]
		// NB: c stays the first geometry's slots: ARC's target sizes are in
		// blocks, and no other count of blocks fits the budget better.
	case *prefix:
		p.grow(n)
	default:
		panic(fmt.Sprintf("cpu: policy %T cannot grow", p))
	}
}

func (l *list) grow(n int) {
	add := n - len(l.in)
	l.prev = append(l.prev, make([]int32, add)...)
	l.next = append(l.next, make([]int32, add)...)
	l.in = append(l.in, make([]bool, add)...)
}

func (p *prefix) grow(n int) {
	add := n - len(p.stamp)
	p.all.grow(n)
	p.stamp = append(p.stamp, make([]uint64, add)...)
	p.key = append(p.key, make([]messages.Key, add)...)
	p.parent = append(p.parent, make([]messages.Key, add)...)
	p.hasParent = append(p.hasParent, make([]bool, add)...)
	p.leaves.stamp = p.stamp
	for range add {
		p.leaves.pos = append(p.leaves.pos, none)
	}
}

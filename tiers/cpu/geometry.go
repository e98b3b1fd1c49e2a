package cpu

import (
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/messages"
)

// Geometries: one pool budget, slots of several sizes.
//
// Every block size an engine declares (its geometry) has slots of its own:
// the ids [base, base+n) of the State's one slot space, where n is as many
// slots of that size as the whole budget holds. Only some of them have
// memory behind them (committed); the others are spare. What all
// geometries commit together never passes the budget, so a geometry grows
// by taking bytes from the others, in this order:
//
//  1. a free slot of its own;
//  2. a spare slot, while the budget has room for one more;
//  3. another geometry's free slot, given up (made spare: its pages are
//     returned, see TakeReleased) so the budget has room;
//  4. the policy's victim, of whichever geometry: one eviction order
//     across every geometry, so a busy model takes memory from an idle one
//     and an idle one that wakes takes it back the same way.
//
// Bytes are fungible (a slot given up returns its pages to the
// shared-memory filesystem and a slot committed takes new ones), so
// geometries never fragment the budget. With one geometry every slot is
// committed from the start and steps 2 and 3 never run.

// MaxGeometries bounds the block sizes one pool serves at once.
const MaxGeometries = 8

// geometry is one block size's slots.
type geometry struct {
	bytes     int   // bytes per slot
	base, n   int   // its slot ids: [base, base+n)
	free      []int // committed free slots; pop from the end
	spare     []int // uncommitted slot ids; pop from the end
	evictable int   // its ready slots with no pin and no lease
}

// GeometryOccupancy is one geometry's share of the pool.
type GeometryOccupancy struct {
	BlockBytes int // bytes per slot
	Slots      int // slot ids it may use (as many as the budget holds)
	Committed  int // of those, slots with memory behind them
	Free       int // committed and free
	Ready      int // holding a readable block
}

// addGeometry appends a geometry of n slots of blockBytes to the slot
// space, committed (its memory allocated already) or spare.
func (s *State) addGeometry(blockBytes, n int, committed bool) int {
	gi, base := len(s.geo), len(s.slots)
	g := geometry{bytes: blockBytes, base: base, n: n}
	ids := make([]int, n)
	for i := range ids {
		ids[i] = base + n - 1 - i // pop from the end hands out the lowest id first
	}
	if committed {
		g.free = ids
		s.used += int64(n) * int64(blockBytes)
	} else {
		g.spare = ids
	}
	s.geo = append(s.geo, g)
	s.slots = append(s.slots, make([]slot, n)...)
	s.gOf = append(s.gOf, slices.Repeat([]uint8{uint8(gi)}, n)...)
	if gi > 0 {
		growPolicy(s.policy, len(s.slots))
	}
	return gi
}

// AddGeometry makes blockBytes a geometry of the pool, its slots all spare,
// and returns its index and its slot ids' base and count; a size the State
// serves already returns its existing geometry. ErrBadConfig: a size the
// budget cannot hold one slot of, or one geometry too many.
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
	}
	n = int(min(s.budget/int64(blockBytes), (1<<31-1)-int64(len(s.slots))))
	gi = s.addGeometry(blockBytes, n, false)
	return gi, s.geo[gi].base, n, nil
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

// SlotGeometry returns the geometry of slot idx (its bytes, its base).
func (s *State) SlotGeometry(idx int) (blockBytes, base int) {
	g := &s.geo[s.gOf[idx]]
	return g.bytes, g.base
}

// TakeReleased returns the slots given up for another geometry since the
// last call: the owner returns their pages (Pool.Release) before it acts
// on anything else the State decided, so a slot committed again starts
// from fresh pages and the budget is never passed in memory either.
func (s *State) TakeReleased() []int {
	r := s.released
	s.released = nil
	return r
}

// GeometryOccupancy counts each geometry's slots.
func (s *State) GeometryOccupancy() []GeometryOccupancy {
	out := make([]GeometryOccupancy, len(s.geo))
	for gi := range s.geo {
		g := &s.geo[gi]
		out[gi] = GeometryOccupancy{BlockBytes: g.bytes, Slots: g.n, Committed: g.n - len(g.spare), Free: len(g.free)}
	}
	for idx := range s.slots {
		if s.slots[idx].state == slotReady {
			out[s.gOf[idx]].Ready++
		}
	}
	return out
}

// countEvictable moves slot idx in or out of the evictable counts.
func (s *State) countEvictable(idx, d int) {
	s.evictable += d
	s.geo[s.gOf[idx]].evictable += d
}

// room is how many slots of geometry gi a reservation could have, not
// evicting the protected slots.
func (s *State) room(gi int, protected map[int]struct{}) int {
	g := &s.geo[gi]
	own := len(g.free) + g.evictable
	avail := s.budget - s.used
	for hi := range s.geo {
		if hi != gi {
			h := &s.geo[hi]
			avail += int64(len(h.free)+h.evictable) * int64(h.bytes)
		}
	}
	for idx := range protected {
		if hi := int(s.gOf[idx]); hi == gi {
			own--
		} else {
			avail -= int64(s.geo[hi].bytes)
		}
	}
	grow := 0
	if avail > 0 {
		grow = int(min(avail/int64(g.bytes), int64(len(g.spare))))
	}
	return own + grow
}

// makeFree gives geometry gi one more free committed slot (room said there
// is one), by the steps at the top of this file, and returns the keys it
// evicted for it.
func (s *State) makeFree(gi int, protected map[int]struct{}, evicted []messages.Key) []messages.Key {
	g := &s.geo[gi]
	for len(g.free) == 0 {
		switch {
		case len(g.spare) > 0 && s.used+int64(g.bytes) <= s.budget:
			idx := g.spare[len(g.spare)-1]
			g.spare = g.spare[:len(g.spare)-1]
			g.free = append(g.free, idx)
			s.used += int64(g.bytes)
		case s.giveUpFree(gi):
		default:
			evicted = append(evicted, s.evictOne(protected))
		}
	}
	return evicted
}

// giveUpFree makes one free slot of another geometry than gi spare, if
// there is one, and reports whether it did.
func (s *State) giveUpFree(gi int) bool {
	for hi := range s.geo {
		h := &s.geo[hi]
		if hi == gi || len(h.free) == 0 {
			continue
		}
		idx := h.free[len(h.free)-1]
		h.free = h.free[:len(h.free)-1]
		h.spare = append(h.spare, idx)
		s.used -= int64(h.bytes)
		s.released = append(s.released, idx)
		return true
	}
	return false
}

// popFree takes a free committed slot of geometry gi (there is one).
func (s *State) popFree(gi int) int {
	g := &s.geo[gi]
	idx := g.free[len(g.free)-1]
	g.free = g.free[:len(g.free)-1]
	return idx
}

// pushFree returns slot idx to its geometry's free slots.
func (s *State) pushFree(idx int) {
	g := &s.geo[s.gOf[idx]]
	g.free = append(g.free, idx)
}

// freeSlots is how many committed free slots every geometry has together.
func (s *State) freeSlots() int {
	n := 0
	for gi := range s.geo {
		n += len(s.geo[gi].free)
	}
	return n
}

// checkGeometries verifies the geometries' lists and the budget.
func (s *State) checkGeometries(bad func(string, ...any)) []bool {
	inFree := make([]bool, len(s.slots))
	used := int64(0)
	for gi := range s.geo {
		g := &s.geo[gi]
		evictable := 0
		for idx := g.base; idx < g.base+g.n; idx++ {
			if int(s.gOf[idx]) != gi {
				bad("slot %d of geometry %d is marked %d", idx, gi, s.gOf[idx])
			}
			if s.isEvictable(idx) {
				evictable++
			}
		}
		if evictable != g.evictable {
			bad("geometry %d counts %d evictable, has %d", gi, g.evictable, evictable)
		}
		for _, list := range [][]int{g.free, g.spare} {
			for _, idx := range list {
				if idx < g.base || idx >= g.base+g.n {
					bad("slot %d listed free in geometry %d", idx, gi)
					continue
				}
				if inFree[idx] {
					bad("slot %d free twice", idx)
				}
				inFree[idx] = true
			}
		}
		used += int64(g.n-len(g.spare)) * int64(g.bytes)
	}
	if used != s.used || used > s.budget {
		bad("%d bytes committed, %d counted, budget %d", used, s.used, s.budget)
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
		p.c = n
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

// spareSlots is how many slot ids of every geometry have no memory behind them.
func (s *State) spareSlots() int {
	n := 0
	for gi := range s.geo {
		n += len(s.geo[gi].spare)
	}
	return n
}

// Budget is the bytes every geometry's committed slots may take together.
func (s *State) Budget() int64 { return s.budget }

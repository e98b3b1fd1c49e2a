package cpu

import (
	"container/heap"
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/messages"
)

// prefix keeps the tier prefix-closed where it can: a lookup stops at its
// first MISS, so a block whose parent is gone can never be hit, and evicting
// a chain's head before its tail (what LRU does to a chain whose head is
// the least recently touched) leaves the tail as dead weight. prefix evicts,
// among the evictable slots none of whose children it holds (leaves), the
// least recently used; only when no leaf is evictable (all pinned, leased
// or protected by the call) does it fall back to the least recently used
// evictable slot of all. Evicting a leaf can make its parent a leaf, so an
// old chain is peeled from its deepest block up.
//
// A slot's parent comes from its provenance (State.makeReady calls
// SetParent); a slot whose parent is unknown is a root. With no parent
// known anywhere the order is exactly LRU's (the model test runs both).
//
// Invariants (check):
//   - all holds every slot of the policy; leaves ⊆ all.
//   - for a slot s with at[key[s]] = s: s ∈ leaves ⇔ kids[key[s]] = 0.
//     (A second slot of the same key — one Clear unindexed while pinned,
//     freed at its last unpin — keeps the standing it had; at names the
//     latest.)
//   - kids[k] = #slots in all with a parent k; no zero entries.
//   - leaves is a min-heap on stamp; pos[s] is s's index in it, or none.
type prefix struct {
	all       list // every slot in LRU order: the fallback
	stamp     []uint64
	clock     uint64
	key       []messages.Key
	parent    []messages.Key
	hasParent []bool
	leaves    leafHeap
	at        map[messages.Key]int32 // key → the slot holding it
	kids      map[messages.Key]int32 // key → slots held whose parent it is
	skipped   []int32                // Victim's scratch: unevictable leaves popped
}

func newPrefix(n int) *prefix {
	p := &prefix{all: newList(n), stamp: make([]uint64, n), key: make([]messages.Key, n),
		parent: make([]messages.Key, n), hasParent: make([]bool, n),
		at: make(map[messages.Key]int32, n), kids: make(map[messages.Key]int32, n)}
	p.leaves = leafHeap{stamp: p.stamp, pos: make([]int32, n)}
	for i := range p.leaves.pos {
		p.leaves.pos[i] = none
	}
	return p
}

// chainPolicy is a Policy that ranks by the prefix chain: the State tells
// it each ready slot's parent.
type chainPolicy interface {
	// SetParent records that slot's block follows parent in its chain.
	SetParent(slot int, parent messages.Key)
}

func (p *prefix) bump(slot int) { p.clock++; p.stamp[slot] = p.clock }

func (p *prefix) Insert(slot int, key messages.Key) {
	p.bump(slot)
	p.all.pushFront(slot)
	p.key[slot], p.hasParent[slot] = key, false
	p.at[key] = int32(slot)
	if p.kids[key] == 0 {
		heap.Push(&p.leaves, int32(slot))
	}
}

func (p *prefix) SetParent(slot int, parent messages.Key) {
	if !p.all.in[slot] || parent == p.key[slot] {
		return
	}
	if p.hasParent[slot] {
		p.unlinkParent(slot)
	}
	p.parent[slot], p.hasParent[slot] = parent, true
	p.kids[parent]++
	if p.kids[parent] == 1 {
		if ps, ok := p.at[parent]; ok && p.leaves.pos[ps] != none {
			heap.Remove(&p.leaves, int(p.leaves.pos[ps]))
		}
	}
}

// unlinkParent drops slot's edge to its parent; the parent becomes a leaf
// when it was its last child held.
func (p *prefix) unlinkParent(slot int) {
	par := p.parent[slot]
	p.hasParent[slot] = false
	p.parent[slot] = messages.Key{}
	if p.kids[par]--; p.kids[par] > 0 {
		return
	}
	delete(p.kids, par)
	if ps, ok := p.at[par]; ok && p.leaves.pos[ps] == none {
		heap.Push(&p.leaves, ps)
	}
}

func (p *prefix) Access(slot int) {
	if !p.all.in[slot] {
		return
	}
	p.bump(slot)
	p.all.remove(slot)
	p.all.pushFront(slot)
	if i := p.leaves.pos[slot]; i != none {
		heap.Fix(&p.leaves, int(i))
	}
}

func (p *prefix) Remove(slot int) {
	if p.all.in[slot] {
		p.drop(slot)
	}
}

// drop takes slot out of every structure.
func (p *prefix) drop(slot int) {
	p.all.remove(slot)
	if i := p.leaves.pos[slot]; i != none {
		heap.Remove(&p.leaves, int(i))
	}
	if k := p.key[slot]; p.at[k] == int32(slot) {
		delete(p.at, k)
	}
	if p.hasParent[slot] {
		p.unlinkParent(slot)
	}
	p.key[slot] = messages.Key{}
}

func (p *prefix) Len() int { return p.all.size }

func (p *prefix) Victim(evictable func(int) bool) (int, bool) {
	// NB: the leaves popped as unevictable go back after the search; they
	// are the pinned and leased ones, usually few and hot.
	victim, found := 0, false
	for p.leaves.Len() > 0 {
		s := p.leaves.slots[0]
		if evictable(int(s)) {
			victim, found = int(s), true
			break
		}
		heap.Pop(&p.leaves)
		p.skipped = append(p.skipped, s)
	}
	for _, s := range p.skipped {
		heap.Push(&p.leaves, s)
	}
	p.skipped = p.skipped[:0]
	if !found {
		victim, found = p.all.lastEvictable(evictable)
	}
	if found {
		p.drop(victim)
	}
	return victim, found
}

// isLeaf reports whether slot is ranked among the leaves (tests).
func (p *prefix) isLeaf(slot int) bool { return p.leaves.pos[slot] != none }

// check verifies the invariants above by a full scan (tests).
func (p *prefix) check() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	kids := map[messages.Key]int32{}
	n := 0
	for s := p.all.head; s != none; s = p.all.next[s] {
		n++
		if p.hasParent[s] {
			kids[p.parent[s]]++
		}
	}
	if n != p.all.size {
		bad("list walks %d slots, size %d", n, p.all.size)
	}
	if len(kids) != len(p.kids) {
		bad("%d parents with children, %d counted", len(kids), len(p.kids))
	}
	for k, c := range kids {
		if p.kids[k] != c {
			bad("key %v has %d children held, %d counted", k, c, p.kids[k])
		}
	}
	for k, s := range p.at {
		if !p.all.in[s] || p.key[s] != k {
			bad("at[%v] = %d, not a slot of the policy with that key", k, s)
		}
		if leaf := p.leaves.pos[s] != none; leaf != (kids[k] == 0) {
			bad("slot %d of %v: leaf %v with %d children", s, k, leaf, kids[k])
		}
	}
	for i, s := range p.leaves.slots {
		if p.leaves.pos[s] != int32(i) || !p.all.in[s] {
			bad("leaf %d at %d: pos %d, in policy %v", s, i, p.leaves.pos[s], p.all.in[s])
		}
		if i > 0 && p.stamp[p.leaves.slots[(i-1)/2]] > p.stamp[s] {
			bad("leaf heap out of order at %d", i)
		}
	}
	return errors.Join(errs...)
}

// leafHeap is a min-heap of slots on their recency stamp, indexed by slot
// (pos) so that a slot's rank can be fixed or removed in O(log n).
type leafHeap struct {
	slots []int32
	stamp []uint64 // shared with prefix
	pos   []int32  // slot → index in slots, or none
}

func (h *leafHeap) Len() int           { return len(h.slots) }
func (h *leafHeap) Less(i, j int) bool { return h.stamp[h.slots[i]] < h.stamp[h.slots[j]] }
func (h *leafHeap) Swap(i, j int) {
	h.slots[i], h.slots[j] = h.slots[j], h.slots[i]
	h.pos[h.slots[i]], h.pos[h.slots[j]] = int32(i), int32(j)
}
func (h *leafHeap) Push(x any) {
	s := x.(int32)
	h.pos[s] = int32(len(h.slots))
	h.slots = append(h.slots, s)
}
func (h *leafHeap) Pop() any {
	s := h.slots[len(h.slots)-1]
	h.slots = h.slots[:len(h.slots)-1]
	h.pos[s] = none
	return s
}

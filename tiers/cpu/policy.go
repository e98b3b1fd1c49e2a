package cpu

import (
	"fmt"

	"github.com/kvtier/kvtier/messages"
)

// Policy orders ready slots for eviction. It holds every ready slot, pinned
// or leased ones included, so that recency survives a pin; Victim skips the
// ones the State says it may not evict.
type Policy interface {
	// Insert adds a slot that just became ready with key.
	Insert(slot int, key messages.Key)
	// Access records a use of a ready slot.
	Access(slot int)
	// Remove drops a slot that left the ready state for another reason than
	// eviction (reset, failed verification).
	Remove(slot int)
	// Victim picks, removes and returns the slot to evict among those for
	// which evictable is true; false when there is none.
	Victim(evictable func(slot int) bool) (int, bool)
	// Len is how many slots the policy holds (for invariant checks).
	Len() int
}

// Policies are the names NewPolicy knows: "lru" (vLLM's order, the
// default), "arc", and "prefix" (a chain's deepest blocks first; prefix.go).
var Policies = []string{"lru", "arc", "prefix"}

// NewPolicy returns the named policy for a pool of n slots.
func NewPolicy(name string, n int) (Policy, error) {
	switch name {
	case "", "lru":
		return newLRU(n), nil
	case "arc":
		return newARC(n), nil
	case "prefix":
		return newPrefix(n), nil
	}
	return nil, fmt.Errorf("%w: unknown eviction policy %q", messages.ErrBadConfig, name)
}

// ValidPolicy reports (ErrBadConfig) a name NewPolicy does not know.
func ValidPolicy(name string) error {
	_, err := NewPolicy(name, 1)
	return err
}

// list is an intrusive doubly linked list over slot indices: O(1) insert,
// move and remove with no allocation. Head is most recent, tail least.
type list struct {
	prev, next []int32
	in         []bool
	head, tail int32
	size       int
}

const none = -1

func newList(n int) list {
	l := list{prev: make([]int32, n), next: make([]int32, n), in: make([]bool, n), head: none, tail: none}
	return l
}

func (l *list) pushFront(s int) {
	i := int32(s)
	l.prev[i], l.next[i] = none, l.head
	if l.head != none {
		l.prev[l.head] = i
	}
	l.head = i
	if l.tail == none {
		l.tail = i
	}
	l.in[s] = true
	l.size++
}

func (l *list) remove(s int) {
	i := int32(s)
	if p := l.prev[i]; p != none {
		l.next[p] = l.next[i]
	} else {
		l.head = l.next[i]
	}
	if n := l.next[i]; n != none {
		l.prev[n] = l.prev[i]
	} else {
		l.tail = l.prev[i]
	}
	l.in[s] = false
	l.size--
}

// lastEvictable walks from the cold end and returns the first evictable slot.
// NB: pinned and leased slots are usually hot, so the walk is short.
func (l *list) lastEvictable(evictable func(int) bool) (int, bool) {
	for i := l.tail; i != none; i = l.prev[i] {
		if evictable(int(i)) {
			return int(i), true
		}
	}
	return 0, false
}

// lru evicts the least recently inserted or accessed slot.
type lru struct{ l list }

func newLRU(n int) *lru { return &lru{l: newList(n)} }

func (p *lru) Insert(slot int, _ messages.Key) { p.l.pushFront(slot) }
func (p *lru) Access(slot int) {
	if p.l.in[slot] {
		p.l.remove(slot)
		p.l.pushFront(slot)
	}
}
func (p *lru) Remove(slot int) {
	if p.l.in[slot] {
		p.l.remove(slot)
	}
}
func (p *lru) Len() int { return p.l.size }

func (p *lru) Victim(evictable func(int) bool) (int, bool) {
	s, ok := p.l.lastEvictable(evictable)
	if ok {
		p.l.remove(s)
	}
	return s, ok
}

package obj

import (
	"container/list"

	"github.com/kvtier/kvtier/messages"
)

// keySet is a bounded set of keys known to be stored (written, found or
// read by this tier), least recently used dropped first. It saves the HEAD
// of a block this tier holds; it is a hint, not an index: a key it forgot is
// HEADed, a key it remembers that is gone fails its read (and is forgotten).
//
// Invariant: len(m) == l.Len() ≤ max.
type keySet struct {
	max int
	m   map[messages.Key]*list.Element
	l   *list.List // of messages.Key, most recent at the front
}

func newKeySet(n int) *keySet {
	return &keySet{max: max(n, 1), m: map[messages.Key]*list.Element{}, l: list.New()}
}

func (s *keySet) has(k messages.Key) bool {
	e, ok := s.m[k]
	if ok {
		s.l.MoveToFront(e)
	}
	return ok
}

func (s *keySet) add(k messages.Key) {
	if e, ok := s.m[k]; ok {
		s.l.MoveToFront(e)
		return
	}
	s.m[k] = s.l.PushFront(k)
	if s.l.Len() > s.max {
		old := s.l.Remove(s.l.Back()).(messages.Key)
		delete(s.m, old)
	}
}

func (s *keySet) remove(k messages.Key) {
	if e, ok := s.m[k]; ok {
		s.l.Remove(e)
		delete(s.m, k)
	}
}

func (s *keySet) len() int { return s.l.Len() }

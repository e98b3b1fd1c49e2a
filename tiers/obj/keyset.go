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

// add remembers k (most recent); it returns the key it forgot to stay
// within bounds, if any.
func (s *keySet) add(k messages.Key) (forgot messages.Key, ok bool) {
	if e, found := s.m[k]; found {
		s.l.MoveToFront(e)
		return messages.Key{}, false
	}
	s.m[k] = s.l.PushFront(k)
	if s.l.Len() > s.max {
		old := s.l.Remove(s.l.Back()).(messages.Key)
		delete(s.m, old)
		return old, true
	}
	return messages.Key{}, false
}

// contains reports whether k is in the set, without touching its recency.
func (s *keySet) contains(k messages.Key) bool {
	_, ok := s.m[k]
	return ok
}

// keys lists the set, most recent first.
func (s *keySet) keys() []messages.Key {
	out := make([]messages.Key, 0, s.l.Len())
	for e := s.l.Front(); e != nil; e = e.Next() {
		out = append(out, e.Value.(messages.Key))
	}
	return out
}

// remove forgets k; it reports whether k was there.
func (s *keySet) remove(k messages.Key) bool {
	if e, ok := s.m[k]; ok {
		s.l.Remove(e)
		delete(s.m, k)
		return true
	}
	return false
}

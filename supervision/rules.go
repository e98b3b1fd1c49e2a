package supervision

import "sync"

// Rules is an ordered set of fault rules of type R (a func a fault-injecting
// wrapper consults before each call), safe for concurrent use. The zero
// value is empty and ready; an empty set costs one lock per check.
type Rules[R any] struct {
	mu      sync.Mutex
	entries []ruleEntry[R]
	next    uint64
}

type ruleEntry[R any] struct {
	id   uint64
	rule R
}

// Inject adds a rule after the others; the returned func removes it.
func (s *Rules[R]) Inject(r R) (remove func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	id := s.next
	s.entries = append(s.entries, ruleEntry[R]{id: id, rule: r})
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, e := range s.entries {
			if e.id == id {
				s.entries = append(s.entries[:i], s.entries[i+1:]...)
				return
			}
		}
	}
}

// Active returns the rules in the order they were added. The caller runs
// them without the lock held, so a rule may block (a stalled device).
func (s *Rules[R]) Active() []R {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]R, len(s.entries))
	for i, e := range s.entries {
		out[i] = e.rule
	}
	return out
}

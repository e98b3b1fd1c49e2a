package cpu

import "github.com/kvtier/kvtier/messages"

// ReadyKeys lists every readable key: the tier's inventory, the set its
// stored-minus-removed events describe. Write-pending keys are not listed.
// O(slots): for inventory checks, never on a hot path.
func (s *State) ReadyKeys() []messages.Key {
	out := make([]messages.Key, 0, s.ready)
	for i := range s.slots {
		if s.slots[i].state == slotReady {
			out = append(out, s.slots[i].key)
		}
	}
	return out
}

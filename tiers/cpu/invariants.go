package cpu

import (
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/messages"
)

// CheckInvariants verifies every invariant listed at the top of state.go by
// a full scan. It costs O(slots + leases + pins): for tests, and for the actor
// after a restart, never for the hot path.
func (s *State) CheckInvariants() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	inFree := s.checkGeometries(bad)
	pinSum := make([]int32, len(s.slots))
	for _, m := range s.pins {
		for idx, n := range m.all() {
			if n <= 0 {
				bad("slot %d has a non-positive pin entry", idx)
			}
			pinSum[idx] += n
		}
	}
	leaseSum := make([]int32, len(s.slots))
	nLeases := 0
	for h, hl := range s.leases {
		if len(hl.until) == 0 {
			bad("holder %v kept with no lease", h)
		}
		for idx := range hl.until {
			leaseSum[int(idx)]++
			nLeases++
		}
	}
	if nLeases != s.nLeases {
		bad("%d leases counted, %d held", s.nLeases, nLeases)
	}
	evictable, pinned, leased, ready, ranked, credited := 0, 0, 0, 0, 0, 0
	for idx := range s.slots {
		sl := &s.slots[idx]
		if (sl.state == slotFree) != inFree[idx] {
			bad("slot %d state %d, in free list %v", idx, sl.state, inFree[idx])
		}
		switch {
		case sl.state == slotFree:
		case IsCreditKey(sl.key):
			credited++
			if sl.key != creditPlaceholder || sl.state != slotWritePending {
				bad("credited slot %d holds %v in state %d", idx, sl.key, sl.state)
			}
		default:
			if got, ok := s.index[sl.key]; !ok || got != idx {
				bad("slot %d key %v not indexed to it", idx, sl.key)
			}
		}
		if sl.pins != pinSum[idx] || sl.leases != leaseSum[idx] {
			bad("slot %d pins %d/%d leases %d/%d", idx, sl.pins, pinSum[idx], sl.leases, leaseSum[idx])
		}
		if sl.state != slotReady && (sl.pins > 0 || sl.leases > 0) {
			bad("slot %d not ready but pinned or leased", idx)
		}
		if sl.state == slotWritePending {
			if !s.reserved[sl.writer].has(idx) {
				bad("slot %d write-pending but not reserved by %v", idx, sl.writer)
			}
		}
		if s.isEvictable(idx) {
			evictable++
		}
		if s.canEvict[idx] != s.isEvictable(idx) {
			bad("slot %d evictable %v, marked %v", idx, s.isEvictable(idx), s.canEvict[idx])
		}
		if sl.state == slotReady {
			ready++
		}
		if sl.state == slotWritePending && sl.touched {
			ranked++
		}
		if sl.state != slotWritePending && sl.state != slotReady && sl.touched {
			bad("slot %d free but ranked", idx)
		}
		if sl.pins > 0 {
			pinned++
		}
		if sl.leases > 0 {
			leased++
		}
	}
	for owner := range s.reserved {
		if _, ok := s.creditors[owner]; owner.Origin == messages.OriginCredit && !ok {
			bad("credit owner %v holds slots but is not among the creditors", owner)
		}
	}
	if len(s.index) != s.committedSlots()-s.freeSlots()-credited {
		bad("index has %d keys, %d slots in use, %d of them credited", len(s.index), s.committedSlots()-s.freeSlots(), credited)
	}
	if n := s.policy.Len(); n != ready+ranked {
		bad("policy holds %d slots, %d ready and %d touched while written", n, ready, ranked)
	}
	if c, ok := s.policy.(interface{ check() error }); ok {
		if err := c.check(); err != nil {
			bad("policy: %w", err)
		}
	}
	if ready != s.ready {
		bad("ready count %d, %d slots ready", s.ready, ready)
	}
	if evictable != s.evictable || pinned != s.pinnedSlots || leased != s.leasedSlots {
		bad("counts evictable %d/%d pinned %d/%d leased %d/%d",
			evictable, s.evictable, pinned, s.pinnedSlots, leased, s.leasedSlots)
	}
	return errors.Join(errs...)
}

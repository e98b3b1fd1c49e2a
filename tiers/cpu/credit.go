package cpu

import (
	"fmt"

	"github.com/kvtier/kvtier/messages"
)

// Slot credit: slots reserved for an engine session's stores before it asks
// for them, so its scheduler can hand a store its slots without a round
// trip (docs/PROTOCOL.md, "Slot credit").
//
// A credited slot is write-pending under a placeholder key no lookup can
// name and the index does not hold, reserved by the credit's owner
// (OriginCredit): it is never evicted, never looked up and never given to
// anyone else. (The index once held a placeholder per slot, each its own
// string: a grant and a bind paid three map writes per slot for them.) Bind moves a credited
// slot to a store job's write of a real key; a key the tier already holds
// leaves its slot in the credit (the engine's copy into it is wasted, never
// readable). ReleaseCredit frees what is left once no copy can be running.

// creditNS is the namespace of the placeholder keys of credited slots: a
// NUL byte, which no layout namespace (hex) contains.
const creditNS messages.Namespace = "\x00credit"

// creditPlaceholder is every credited slot's key.
var creditPlaceholder = messages.Key{Namespace: creditNS}

// IsCreditKey reports the placeholder key of a credited slot. Its hash is
// empty, which no valid key's is (messages.Key.Validate), so no engine's
// key is taken for it, whatever its namespace.
func IsCreditKey(k messages.Key) bool { return k.Hash == "" && k.Namespace == creditNS }

// CreditLimit is the most credit, in slots, that every session together
// may hold in a pool of slots shared by sessions engines holding credit.
// Credited slots are taken from the cache those engines share and sit
// empty until a store binds them, so the bound tightens as engines share
// the pool: a sixteenth of it for one engine, a sixty-fourth for two, a
// 256th for four, and never less than one engine's default credit (64
// slots). One engine's credit costs only its own cache, and a sixteenth
// left the manager bench's engine (20,000 slots) no store to wait on (an
// eighth was the bound before). Between engines kept on their sessions an
// eighth left them recomputing up to 0.35 % more than vLLM's partitioned
// CPU tiers; bounded so, they recompute no more in any case of the share
// bench (docs/PERFORMANCE.md, "Credit bounded by the engines sharing the
// pool"). An engine short of credit waits on one grant a step, then on its
// stores.
func CreditLimit(slots, sessions int) int {
	sessions = max(1, sessions)
	return max(slots/(16*sessions*sessions), 64)
}

// creditedBytes is the bytes every session's credit holds together.
func (s *State) creditedBytes() int64 {
	n := int64(0)
	for owner, slots := range s.reserved {
		if owner.Origin != messages.OriginCredit {
			continue
		}
		if len(s.geo) == 1 { // NB: the common case, without a walk of every credited slot
			n += int64(slots.len()) * int64(s.geo[0].bytes)
			continue
		}
		for idx := range slots.all() {
			n += int64(s.geo[s.gOf[idx]].bytes)
		}
	}
	return n
}

// Grant reserves up to n slots as owner's credit, free slots first, then
// evicting in policy order. It grants fewer when the rest are pinned,
// leased or write-pending, or when every session's credit together would
// pass CreditLimit.
func (s *State) Grant(owner messages.JobRef, n int) (slots []int, evicted []messages.Key) {
	return s.GrantIn(0, owner, n)
}

// GrantIn is Grant of slots of geometry gi. The limit is CreditLimit of the
// slots the budget holds of gi, counted in bytes over every geometry's
// credit (with one geometry: CreditLimit slots).
func (s *State) GrantIn(gi int, owner messages.JobRef, n int) (slots []int, evicted []messages.Key) {
	s.expireLeases()
	s.creditors[owner] = struct{}{}
	b := int64(s.geo[gi].bytes)
	limit := int64(CreditLimit(s.geo[gi].n, len(s.creditors))) * b
	n = min(n, s.room(gi, nil), int(max(0, limit-s.creditedBytes())/b))
	slots = make([]int, 0, n)
	for range n {
		var ok bool
		if evicted, ok = s.makeFree(gi, nil, evicted); !ok {
			break // NB: fewer, as when the rest are held
		}
		slots = append(slots, s.allocate(gi, creditPlaceholder, owner))
	}
	return slots, evicted
}

// Bind moves owner's credited slots to job's writes: slot i becomes key i's
// write-pending slot when the tier holds no key i (bound[i]); otherwise the
// slot stays in the credit. Every slot must be owner's credit and named
// once, and keys and slots must pair up: otherwise ErrBadRequest, and
// nothing changes.
func (s *State) Bind(owner, job messages.JobRef, keys []messages.Key, slots []int) ([]bool, error) {
	if err := s.checkCredit(owner, keys, slots); err != nil {
		return nil, err
	}
	bound := make([]bool, len(keys))
	mine := s.reserved[owner]
	for i, k := range keys {
		if _, held := s.index[k]; held {
			continue // another write or block has it: the duplicate is the daemon's to settle
		}
		idx := slots[i]
		sl := &s.slots[idx]
		sl.key, sl.writer = k, job
		s.index[k] = idx
		if s.obs != nil {
			s.obs.Writing(k)
		}
		mine.add(idx, -1)
		setOf(s.reserved, job).add(idx, 1)
		bound[i] = true
	}
	if mine.len() == 0 {
		delete(s.reserved, owner)
	}
	return bound, nil
}

func (s *State) checkCredit(owner messages.JobRef, keys []messages.Key, slots []int) error {
	if len(keys) != len(slots) {
		return fmt.Errorf("%w: %d keys, %d slots", messages.ErrBadRequest, len(keys), len(slots))
	}
	mine := s.reserved[owner]
	s.named.next(len(s.slots))
	for _, idx := range slots {
		if !mine.has(idx) || idx < 0 || idx >= len(s.slots) || !IsCreditKey(s.slots[idx].key) {
			return fmt.Errorf("%w: slot %d is not this session's credit", messages.ErrBadRequest, idx)
		}
		if s.named.twice(idx) {
			return fmt.Errorf("%w: slot %d named twice", messages.ErrBadRequest, idx)
		}
	}
	return nil
}

// Credit is how many slots owner holds as credit.
func (s *State) Credit(owner messages.JobRef) int { return s.reserved[owner].len() }

// ReleaseCredit frees owner's credited slots (nothing was ever readable in
// them) and returns how many; owner's session is over, and no longer
// counts among those sharing CreditLimit.
func (s *State) ReleaseCredit(owner messages.JobRef) int {
	n := 0
	for idx := range s.reserved[owner].all() {
		s.freeSlot(idx)
		n++
	}
	delete(s.reserved, owner)
	delete(s.creditors, owner)
	return n
}

// SlotsOf returns the slot of each key answered HIT in status (0 for the
// others): an engine that loads from its leased HITs before its pin lands.
func (s *State) SlotsOf(keys []messages.Key, status []messages.LookupStatus) []int {
	out := make([]int, len(keys))
	for i, k := range keys {
		if i < len(status) && status[i] == messages.Hit {
			out[i] = s.index[k]
		}
	}
	return out
}

package cpu

import (
	"container/heap"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/kvtier/kvtier/messages"
)

// Invariants of State (checked by CheckInvariants in tests and after a restart):
//   - index[k] = s  ⇔  slots[s].state ≠ free, slots[s].key = k and k is not
//     the credit placeholder (a credited slot is found by its owner's
//     reservation, never by key).
//   - each geometry's free list holds exactly its free slots that hold
//     their bytes (committed), each once; a slot that holds none is free.
//   - committed slots never share a byte of the region, and with the gaps
//     cover it exactly (geometry.go).
//   - slots[s].pins = Σ over jobs of pins[job][s]; pins > 0 only when ready.
//   - slots[s].leases = number of live lease entries on s; leases > 0 only when ready.
//   - a write-pending slot appears in reservations[slots[s].writer].
//   - the policy holds exactly the ready slots.
//   - evictable = #ready slots with no pin and no lease; only those are evicted.
// A HIT leased to a holder is never evicted before the lease ends: that is
// the guarantee PrepareLoad relies on (docs/DESIGN.md §4.1).

type slotState uint8

const (
	slotFree slotState = iota
	slotWritePending
	slotReady
)

type slot struct {
	key      messages.Key
	state    slotState
	pins     int32
	leases   int32
	writer   messages.JobRef // valid while write-pending
	checksum uint32          // valid while ready
	prov     provRef         // valid while ready: its provenance
	touched  bool            // while write-pending: touched, so ranked in the policy already
}

// holderLeases are one holder's live leases: slot → expiry. A holder is one
// request (or peer round), so the map is small and its key is a plain int:
// a HIT costs one index lookup and one small-map insert.
type holderLeases struct {
	until map[int32]int64 // slot → expiry in Unix nanoseconds
}

// Counters are the State's monotonic counters.
type Counters struct {
	Lookups, Hits, HitsPending, Misses uint64
	Stores, StoresFailed, Evictions    uint64
	Full, LeasesExpired                uint64
}

// State is the CPU tier's decision logic: index, slot states, pins, leases
// and eviction. It is not safe for concurrent use: exactly one actor owns it.
type State struct {
	now      func() time.Time
	slots    []slot
	geo      []geometry // the block sizes served; geometry 0 is the pool's first
	gOf      []uint8    // slot → its geometry
	canEvict []bool     // slot → isEvictable, kept by countEvictable: the victim walks read it, not the slots
	freeAt   []int32    // slot → its position in its geometry's free list, or -1
	gaps     []span     // region bytes no slot holds, sorted, merged
	budget   int64      // bytes of the region every geometry's slots share
	index    map[messages.Key]int
	policy   Policy
	chain    chainPolicy                       // the policy, when it ranks by the prefix chain; else nil
	leases   map[messages.Holder]*holderLeases // live leases by holder
	nLeases  int                               // live leases in all
	expiry   expiryHeap                        // one entry per leasing call: when to look at that holder again
	pins     map[messages.JobRef]*slotSet
	reserved map[messages.JobRef]*slotSet
	// creditors are the sessions granted credit and not yet released: the
	// engines CreditLimit is shared by.
	creditors map[messages.JobRef]struct{}
	// cleared maps a slot Clear unindexed while it was pinned to the key it
	// held, so its readers can still unpin it by that key; the slot is freed
	// at its last unpin.
	cleared map[int]messages.Key

	obs Observer // told when a key becomes readable or stops being so; nil: nobody

	named       marks           // the slots a call named so far (CommitProv, Bind): scratch
	spare       []*holderLeases // cleared lease maps kept for reuse (bounded)
	evictable   int
	ready       int
	pinnedSlots int
	leasedSlots int
	Counters    Counters
}

// NewState builds an empty State of n slots of one size with the named
// policy; now is the clock leases expire against. It must never step
// (supervision.Steady, not a wall clock's Now): a forward step would end
// leases early, a backward one would keep them past their TTL.
func NewState(n int, policy string, now func() time.Time) (*State, error) {
	return NewBudgetState(int64(n), 1, policy, now)
}

// NewBudgetState builds an empty State whose slots of every geometry share
// budget bytes; its first geometry has slots of blockBytes, every one of
// them committed (the pool allocates that region up front).
func NewBudgetState(budget int64, blockBytes int, policy string, now func() time.Time) (*State, error) {
	if blockBytes <= 0 || budget < int64(blockBytes) || budget/int64(blockBytes) > math.MaxInt32 {
		return nil, fmt.Errorf("%w: a budget of %d bytes in slots of %d", messages.ErrBadConfig, budget, blockBytes)
	}
	n := int(budget / int64(blockBytes))
	p, err := NewPolicy(policy, n)
	if err != nil {
		return nil, err
	}
	s := &State{
		now: now, budget: budget,
		index: make(map[messages.Key]int, n), policy: p,
		leases:    map[messages.Holder]*holderLeases{},
		pins:      map[messages.JobRef]*slotSet{},
		reserved:  map[messages.JobRef]*slotSet{},
		creditors: map[messages.JobRef]struct{}{},
	}
	s.chain, _ = p.(chainPolicy)
	s.addGeometry(blockBytes, true)
	return s, nil
}

// Observer hears every key that begins to be written into the tier, every
// key that becomes readable in it and every written or readable key that
// leaves it (evicted, dropped, cleared, freed, its write abandoned), in
// order, inside the owning actor: the residency index engines read, where
// a key being written tells an engine to ask (and wait a step) rather than
// recompute it.
type Observer interface {
	Writing(k messages.Key)
	Readable(k messages.Key)
	Gone(k messages.Key)
}

// observable reports whether k is a block's key, not a placeholder of a
// credited or quarantined slot.
func observable(k messages.Key) bool { return !IsCreditKey(k) && !IsQuarantineKey(k) }

// SetObserver installs o (nil: none). It hears only changes made from now on.
func (s *State) SetObserver(o Observer) { s.obs = o }

// Slots is the pool size: the slot ids of every geometry.
func (s *State) Slots() int { return len(s.slots) }

// LookupAndLease answers each key and leases every HIT to holder for ttl (a
// repeated lookup by the same holder extends its lease). With prefix, the scan
// stops at the first key that is not a HIT; later keys answer MISS and are
// neither counted nor leased.
func (s *State) LookupAndLease(holder messages.Holder, keys []messages.Key, prefix bool, ttl time.Duration) []messages.LookupStatus {
	now := s.expireLeases()
	until := now.Add(ttl)
	out := make([]messages.LookupStatus, len(keys))
	var hl *holderLeases
	untilNs := until.UnixNano()
	for i, k := range keys {
		s.Counters.Lookups++
		idx, found := s.index[k]
		st := messages.Miss
		if found {
			st = messages.Hit
			if s.slots[idx].state == slotWritePending {
				st = messages.HitPending
			}
		}
		out[i] = st
		switch st {
		case messages.Hit:
			s.Counters.Hits++
			if hl == nil {
				hl = s.holderLeases(holder, len(keys)-i)
			}
			s.lease(hl, idx, untilNs)
		case messages.HitPending:
			s.Counters.HitsPending++
		default:
			s.Counters.Misses++
		}
		if prefix && st != messages.Hit {
			break
		}
	}
	if hl != nil {
		heap.Push(&s.expiry, expiryEntry{at: until, holder: holder})
	}
	return out
}

// holderLeases returns h's leases, creating them sized for hint more.
func (s *State) holderLeases(h messages.Holder, hint int) *holderLeases {
	hl := s.leases[h]
	if hl == nil && len(s.spare) > 0 {
		hl = s.spare[len(s.spare)-1]
		s.spare = s.spare[:len(s.spare)-1]
		s.leases[h] = hl
	}
	if hl == nil {
		hl = &holderLeases{until: make(map[int32]int64, hint)}
		s.leases[h] = hl
	}
	return hl
}

func (s *State) lookupOne(k messages.Key) messages.LookupStatus {
	i, ok := s.index[k]
	switch {
	case !ok:
		return messages.Miss
	case s.slots[i].state == slotWritePending:
		return messages.HitPending
	}
	return messages.Hit
}

// Status answers keys without leasing or counting anything.
func (s *State) Status(keys []messages.Key) []messages.LookupStatus {
	out := make([]messages.LookupStatus, len(keys))
	for i, k := range keys {
		out[i] = s.lookupOne(k)
	}
	return out
}

// LeaseToPin pins every key for job, consuming holder's leases on them. It is
// all-or-nothing: if any key is not ready it returns ErrUnknownKey and
// changes nothing. It returns the slot of each key, in order.
func (s *State) LeaseToPin(holder messages.Holder, job messages.JobRef, keys []messages.Key) ([]int, error) {
	return s.leaseToPin(holder, job, keys, true)
}

// LeaseToPinKeepRank is LeaseToPin without making the keys most recently
// used: vLLM's LRU re-ranks a loaded block when its request finishes (the
// engine's touch), not when its load is planned.
func (s *State) LeaseToPinKeepRank(holder messages.Holder, job messages.JobRef, keys []messages.Key) ([]int, error) {
	return s.leaseToPin(holder, job, keys, false)
}

func (s *State) leaseToPin(holder messages.Holder, job messages.JobRef, keys []messages.Key, rank bool) ([]int, error) {
	s.expireLeases()
	out := make([]int, len(keys))
	for i, k := range keys {
		idx, ok := s.index[k]
		if !ok || s.slots[idx].state != slotReady {
			return nil, fmt.Errorf("%w: %v", messages.ErrUnknownKey, k)
		}
		out[i] = idx
	}
	hl := s.leases[holder]
	for _, idx := range out {
		if hl != nil {
			s.unlease(holder, hl, idx)
		}
		s.pin(job, idx)
		if rank {
			s.policy.Access(idx)
		}
	}
	return out, nil
}

// Touch marks keys recently used, in order (the last most recent). A key
// still being written is ranked too — vLLM touches a request's blocks (at
// on_request_finished) before their stores complete, and its LRU keeps a
// block being written where its touch put it: the policy holds it from the
// touch on (never a victim while it is written), and its commit leaves its
// rank alone. Unknown keys are ignored.
func (s *State) Touch(keys []messages.Key) {
	for _, k := range keys {
		idx, ok := s.index[k]
		switch {
		case !ok:
		case s.slots[idx].state == slotReady || s.slots[idx].touched:
			s.policy.Access(idx)
		case IsQuarantineKey(k):
		default:
			s.slots[idx].touched = true
			s.policy.Insert(idx, k)
		}
	}
}

// Unpin releases job's pins on keys. All-or-nothing: a key job has not pinned
// returns ErrNotLoading and nothing is unpinned.
func (s *State) Unpin(job messages.JobRef, keys []messages.Key) error {
	held := s.pins[job]
	var want slotSet
	for _, k := range keys {
		idx, ok := s.index[k]
		if !ok || held.count(idx) <= want.count(idx) {
			// A block Clear unindexed under its reader: unpinned by its key.
			if idx, ok = s.clearedPin(held, &want, k); !ok {
				return fmt.Errorf("%w: %v", messages.ErrNotLoading, k)
			}
		}
		want.add(idx, 1)
	}
	for idx, n := range want.all() {
		for range n {
			s.unpin(job, idx)
		}
	}
	return nil
}

// clearedPin finds a slot of held that Clear unindexed from k and that
// has a pin left beyond want. O(held): only on Unpin's miss path.
func (s *State) clearedPin(held, want *slotSet, k messages.Key) (int, bool) {
	if len(s.cleared) == 0 {
		return 0, false
	}
	for idx, n := range held.all() {
		if ck, ok := s.cleared[idx]; ok && ck == k && n > want.count(idx) {
			return idx, true
		}
	}
	return 0, false
}

// ReserveResult is what Reserve decided.
type ReserveResult struct {
	ToStore []messages.Key // keys that were absent, now write-pending for the job
	Slots   []int          // slot of each ToStore key
	Evicted []messages.Key // keys evicted to make room
}

// Reserve makes every absent key write-pending for job, evicting in policy
// order. Keys already present (ready or pending) and repeats are skipped. It
// is all-or-nothing: ErrFull when there is not room for all, and then
// nothing is evicted or reserved.
func (s *State) Reserve(job messages.JobRef, keys []messages.Key) (ReserveResult, error) {
	return s.ReserveIn(0, job, keys)
}

// ReserveIn is Reserve into slots of geometry gi.
func (s *State) ReserveIn(gi int, job messages.JobRef, keys []messages.Key) (ReserveResult, error) {
	s.expireLeases()
	var res ReserveResult
	seen := make(map[messages.Key]struct{}, len(keys))
	// NB: a key of this call that is already present is reported as present
	// (not to store), so it must not be evicted to make room for the others.
	var protected map[int]struct{}
	for _, k := range keys {
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		idx, present := s.index[k]
		switch {
		case !present:
			res.ToStore = append(res.ToStore, k)
		case s.isEvictable(idx):
			if protected == nil {
				protected = map[int]struct{}{}
			}
			protected[idx] = struct{}{}
		}
	}
	need, room := len(res.ToStore), s.room(gi, protected)
	if need > room {
		s.Counters.Full++
		return ReserveResult{}, fmt.Errorf("%w: need %d slots of %d bytes, room for %d",
			messages.ErrFull, need, s.geo[gi].bytes, room)
	}
	res.Slots = make([]int, need)
	for i, k := range res.ToStore {
		var ok bool
		if res.Evicted, ok = s.makeFree(gi, protected, res.Evicted); !ok {
			// NB: with several geometries room is a bound: the slots' places
			// left fewer. What this call reserved is freed again; what it
			// evicted is gone (and reported).
			for _, idx := range res.Slots[:i] {
				s.unreserve(job, idx)
			}
			s.Counters.Full++
			return ReserveResult{Evicted: res.Evicted}, fmt.Errorf("%w: need %d slots of %d bytes, found %d",
				messages.ErrFull, need, s.geo[gi].bytes, i)
		}
		res.Slots[i] = s.allocate(gi, k, job)
	}
	return res, nil
}

// Commit ends job's writes of keys. With ok they become ready, with the given
// checksums (one per key); without, their slots are freed. All-or-nothing: a
// key job is not writing returns ErrNotPending and changes nothing.
func (s *State) Commit(job messages.JobRef, keys []messages.Key, ok bool, checksums []uint32) error {
	return s.CommitProv(job, keys, ok, checksums, ProvSource{})
}

// CommitProv is Commit, retaining with each key that becomes ready the
// provenance src gives it.
func (s *State) CommitProv(job messages.JobRef, keys []messages.Key, ok bool, checksums []uint32, src ProvSource) error {
	return s.CommitAt(job, keys, nil, ok, checksums, src)
}

// CommitAt is CommitProv with, in slots, the slot the writer was given for
// each key (nil: unknown). A slot that holds its key spares a lookup in
// the index; one that does not is looked up as if unnamed, so a wrong
// slot changes nothing but the cost.
func (s *State) CommitAt(job messages.JobRef, keys []messages.Key, slots []int, ok bool, checksums []uint32, src ProvSource) error {
	if ok && len(checksums) != len(keys) {
		return fmt.Errorf("commit: %d checksums for %d keys", len(checksums), len(keys))
	}
	if len(slots) != len(keys) {
		slots = nil
	}
	mine := s.reserved[job]
	idxs := make([]int, len(keys))
	s.named.next(len(s.slots))
	for i, k := range keys {
		idx, found := s.slotOf(k, slots, i)
		if !found || !mine.has(idx) || s.slots[idx].state != slotWritePending || s.named.twice(idx) {
			return fmt.Errorf("%w: %v", messages.ErrNotPending, k)
		}
		idxs[i] = idx
	}
	for i, idx := range idxs {
		mine.add(idx, -1)
		if ok {
			s.slots[idx].prov = src.ref(i) // NB: before makeReady, which ranks by its parent
			s.makeReady(idx, checksums[i])
		} else {
			s.freeSlot(idx)
			s.Counters.StoresFailed++
		}
	}
	if mine.len() == 0 {
		delete(s.reserved, job)
	}
	return nil
}

// slotOf is key i of a call, k's slot: slots[i] when the call named it
// and it holds k (a slot holding a key is the one the index names for it),
// else the index's.
func (s *State) slotOf(k messages.Key, slots []int, i int) (int, bool) {
	if slots != nil {
		if idx := slots[i]; idx >= 0 && idx < len(s.slots) && s.slots[idx].key == k {
			return idx, true
		}
	}
	idx, ok := s.index[k]
	return idx, ok
}

// Pending returns the keys job still has write-pending.
func (s *State) Pending(job messages.JobRef) []messages.Key {
	var out []messages.Key
	for idx := range s.reserved[job].all() {
		out = append(out, s.slots[idx].key)
	}
	return out
}

// ReleaseJob drops every pin job holds and frees every slot it is still
// writing (a failed store: never readable). It returns the keys freed.
func (s *State) ReleaseJob(job messages.JobRef) (aborted []messages.Key) {
	for idx, n := range s.pins[job].all() {
		for range n {
			s.unpin(job, idx)
		}
	}
	for idx := range s.reserved[job].all() {
		aborted = append(aborted, s.slots[idx].key)
		s.freeSlot(idx)
		s.Counters.StoresFailed++
	}
	delete(s.reserved, job)
	return aborted
}

// ReleaseOrigin releases every lease, pin and reservation taken for origin
// (the bridge's, after it restarts with no memory of its requests and jobs).
// It returns the keys whose writes it freed.
// OrphanOrigin ends o's leases now and returns o's jobs (pins and
// write-pending slots), left in place for the caller to release once
// nothing can still copy through them (ReleaseOrigin's quarantine).
//
// A write-pending slot's key is unindexed at once (re-indexed under a
// quarantine key no lookup can name): its write will never commit, so
// lookups answer MISS, not HIT_PENDING, while the slot stays out of use.
// aborted are those keys.
func (s *State) OrphanOrigin(o messages.Origin) (jobs []messages.JobRef, aborted []messages.Key) {
	for h := range s.leases {
		if h.Origin == o {
			s.ReleaseHolder(h)
		}
	}
	seen := map[messages.JobRef]bool{}
	for j := range s.pins {
		if j.Origin == o && !seen[j] {
			seen[j] = true
			jobs = append(jobs, j)
		}
	}
	for j := range s.reserved {
		if j.Origin != o {
			continue
		}
		if !seen[j] {
			seen[j] = true
			jobs = append(jobs, j)
		}
		aborted = append(aborted, s.OrphanJob(j)...)
	}
	return jobs, aborted
}

// OrphanJob unindexes job's write-pending slots (re-indexed under
// quarantine keys no lookup can name: their writes will never commit, so
// lookups answer MISS) and leaves its pins and slots in place for
// ReleaseJob, once nothing can still copy through them. aborted are the
// keys whose writes it ended.
func (s *State) OrphanJob(job messages.JobRef) (aborted []messages.Key) {
	for idx := range s.reserved[job].all() {
		sl := &s.slots[idx]
		if IsQuarantineKey(sl.key) {
			continue
		}
		aborted = append(aborted, sl.key)
		if s.obs != nil && observable(sl.key) {
			s.obs.Gone(sl.key)
		}
		delete(s.index, sl.key)
		sl.key = quarantineKey(idx)
		s.index[sl.key] = idx
	}
	return aborted
}

// quarantineNS is the namespace of the keys quarantined slots are indexed
// under: a NUL byte, which no layout namespace (hex) contains.
const quarantineNS messages.Namespace = "\x00quarantine"

func quarantineKey(idx int) messages.Key {
	return messages.Key{Namespace: quarantineNS, Hash: strconv.Itoa(idx)}
}

// IsQuarantineKey reports a key OrphanOrigin put on a quarantined slot.
func IsQuarantineKey(k messages.Key) bool { return k.Namespace == quarantineNS }

func (s *State) ReleaseOrigin(o messages.Origin) (aborted []messages.Key) {
	for h := range s.leases {
		if h.Origin == o {
			s.ReleaseHolder(h)
		}
	}
	for j := range s.pins {
		if j.Origin == o {
			aborted = append(aborted, s.ReleaseJob(j)...)
		}
	}
	for j := range s.reserved {
		if j.Origin == o {
			aborted = append(aborted, s.ReleaseJob(j)...)
		}
	}
	return aborted
}

// ReleaseHolder ends every lease holder has.
func (s *State) ReleaseHolder(h messages.Holder) {
	hl := s.leases[h]
	if hl == nil {
		return
	}
	// NB: the holder's map goes as a whole; only the slots' counts are
	// adjusted one by one.
	for idx := range hl.until {
		s.slotUnleased(int(idx))
	}
	s.nLeases -= len(hl.until)
	delete(s.leases, h)
	s.recycle(hl)
}

// maxSpare bounds the lease maps kept for reuse: enough for the requests of
// a few engine steps, so a steady stream of lookups allocates no maps.
const maxSpare = 64

// recycle keeps an emptied lease map (clear keeps its buckets) for the next
// holder.
func (s *State) recycle(hl *holderLeases) {
	if len(s.spare) < maxSpare {
		clear(hl.until)
		s.spare = append(s.spare, hl)
	}
}

// Clear frees every ready slot that is not pinned, dropping leases on them,
// and returns the keys removed. Pinned and write-pending slots stay: their
// jobs still own them.
//
// A pinned block (a load, a cascade or a peer fetch is reading it) cannot
// be freed under its reader: it is unindexed at once (announced removed,
// re-indexed under a quarantine key no lookup can name) and freed at its
// last unpin, so nothing is served from a cleared cache — after a weight
// update the old KV must never come back.
func (s *State) Clear() []messages.Key {
	var removed []messages.Key
	for idx := range s.slots {
		sl := &s.slots[idx]
		if sl.state != slotReady || IsQuarantineKey(sl.key) {
			continue
		}
		if sl.pins > 0 {
			s.unleaseAll(idx)
			removed = append(removed, sl.key)
			if s.cleared == nil {
				s.cleared = map[int]messages.Key{}
			}
			s.cleared[idx] = sl.key
			if s.obs != nil {
				s.obs.Gone(sl.key)
			}
			delete(s.index, sl.key)
			sl.key = quarantineKey(idx)
			s.index[sl.key] = idx
			continue
		}
		s.unleaseAll(idx)
		removed = append(removed, sl.key)
		s.policy.Remove(idx)
		s.countEvictable(idx, -1)
		s.freeSlot(idx)
	}
	return removed
}

// unleaseAll ends every lease on slot idx. O(holders): for Clear and Drop only.
func (s *State) unleaseAll(idx int) {
	if s.slots[idx].leases == 0 {
		return
	}
	for h, hl := range s.leases {
		if _, ok := hl.until[int32(idx)]; ok {
			s.unlease(h, hl, idx)
		}
	}
}

// Checksum returns the slot and checksum of a ready key.
func (s *State) Checksum(k messages.Key) (slotIdx int, sum uint32, err error) {
	idx, ok := s.index[k]
	if !ok || s.slots[idx].state != slotReady {
		return 0, 0, fmt.Errorf("%w: %v", messages.ErrUnknownKey, k)
	}
	return idx, s.slots[idx].checksum, nil
}

// Drop removes a ready, unpinned key whose bytes failed verification; its
// leases end with it. It reports whether the key was dropped.
func (s *State) Drop(k messages.Key) bool {
	idx, ok := s.index[k]
	if !ok || s.slots[idx].state != slotReady || s.slots[idx].pins > 0 {
		return false
	}
	s.unleaseAll(idx)
	s.policy.Remove(idx)
	s.countEvictable(idx, -1)
	s.freeSlot(idx)
	return true
}

// Occupancy is a snapshot of the pool's gauges.
type Occupancy struct {
	Slots, Free, WritePending, Ready, Pinned, Leased, Leases int
	Credit                                                   int // reserved ahead for engines' stores (not in WritePending)
}

// Occupancy counts slots by state, after expiring due leases.
func (s *State) Occupancy() Occupancy {
	s.expireLeases()
	credit := 0
	for owner, slots := range s.reserved {
		if owner.Origin == messages.OriginCredit {
			credit += slots.len()
		}
	}
	return Occupancy{
		Slots: s.committedSlots(), Free: s.freeSlots(), Ready: s.ready,
		WritePending: s.committedSlots() - s.freeSlots() - s.ready - credit, Credit: credit,
		Pinned: s.pinnedSlots, Leased: s.leasedSlots, Leases: s.nLeases,
	}
}

// NextLeaseExpiry is when the earliest live lease expires (false when there
// is none). Stale heap entries (holder gone, or its leases extended) are
// dropped or re-pushed at the holder's real earliest expiry on the way.
func (s *State) NextLeaseExpiry() (time.Time, bool) {
	for len(s.expiry) > 0 {
		e := s.expiry[0]
		hl, live := s.leases[e.holder]
		if !live {
			heap.Pop(&s.expiry)
			continue
		}
		first := hl.earliest()
		if first == e.at.UnixNano() {
			return e.at, true
		}
		heap.Pop(&s.expiry)
		if first > e.at.UnixNano() {
			heap.Push(&s.expiry, expiryEntry{at: time.Unix(0, first), holder: e.holder})
		}
	}
	return time.Time{}, false
}

func (hl *holderLeases) earliest() int64 {
	first := int64(math.MaxInt64)
	for _, at := range hl.until {
		first = min(first, at)
	}
	return first
}

// ExpireLeases ends every lease due by now.
func (s *State) ExpireLeases() { s.expireLeases() }

// expireLeases pops every due entry and ends that holder's due leases. Each
// entry was pushed by one leasing call, so the work is O(the leases that
// call could have made), amortised over the calls.
func (s *State) expireLeases() time.Time {
	now := s.now()
	for len(s.expiry) > 0 && !s.expiry[0].at.After(now) {
		e := heap.Pop(&s.expiry).(expiryEntry)
		hl := s.leases[e.holder]
		if hl == nil {
			continue
		}
		nowNs := now.UnixNano()
		for idx, at := range hl.until {
			if at <= nowNs {
				s.unlease(e.holder, hl, int(idx))
				s.Counters.LeasesExpired++
			}
		}
	}
	return now
}

func (s *State) lease(hl *holderLeases, idx int, until int64) {
	prev, held := hl.until[int32(idx)]
	if !held {
		s.becomesHeld(idx, func(sl *slot) { sl.leases++ })
		if s.slots[idx].leases == 1 {
			s.leasedSlots++
		}
		s.nLeases++
	} else if prev > until {
		return // a repeated lookup extends a lease, never shortens it
	}
	hl.until[int32(idx)] = until
}

func (s *State) unlease(h messages.Holder, hl *holderLeases, idx int) {
	if _, held := hl.until[int32(idx)]; !held {
		return
	}
	delete(hl.until, int32(idx))
	if len(hl.until) == 0 {
		delete(s.leases, h)
		s.recycle(hl)
	}
	s.nLeases--
	s.slotUnleased(idx)
}

func (s *State) slotUnleased(idx int) {
	sl := &s.slots[idx]
	sl.leases--
	if sl.leases == 0 {
		s.leasedSlots--
	}
	s.maybeEvictable(idx)
	s.freeIfClearedAndIdle(idx)
}

// freeIfClearedAndIdle frees a slot Clear unindexed while it was held, once
// its last pin and lease are gone.
func (s *State) freeIfClearedAndIdle(idx int) {
	sl := &s.slots[idx]
	if sl.pins == 0 && sl.leases == 0 && sl.state == slotReady && IsQuarantineKey(sl.key) {
		delete(s.cleared, idx)
		s.policy.Remove(idx)
		s.countEvictable(idx, -1)
		s.freeSlot(idx)
	}
}

func (s *State) pin(job messages.JobRef, idx int) {
	s.becomesHeld(idx, func(sl *slot) { sl.pins++ })
	if s.slots[idx].pins == 1 {
		s.pinnedSlots++
	}
	setOf(s.pins, job).add(idx, 1)
}

func (s *State) unpin(job messages.JobRef, idx int) {
	if m := s.pins[job]; m.add(idx, -1) == 0 && m.len() == 0 {
		delete(s.pins, job)
	}
	sl := &s.slots[idx]
	sl.pins--
	if sl.pins == 0 {
		s.pinnedSlots--
	}
	s.maybeEvictable(idx)
	s.freeIfClearedAndIdle(idx) // cleared while pinned: its last reader may be done
}

// becomesHeld applies a pin or lease increment, keeping evictable exact.
func (s *State) becomesHeld(idx int, inc func(*slot)) {
	sl := &s.slots[idx]
	if sl.pins == 0 && sl.leases == 0 {
		s.countEvictable(idx, -1)
	}
	inc(sl)
}

func (s *State) maybeEvictable(idx int) {
	if sl := &s.slots[idx]; sl.state == slotReady && sl.pins == 0 && sl.leases == 0 {
		s.countEvictable(idx, 1)
	}
}

func (s *State) isEvictable(idx int) bool {
	sl := &s.slots[idx]
	return sl.state == slotReady && sl.pins == 0 && sl.leases == 0
}

func (s *State) evictOne(protected map[int]struct{}) messages.Key {
	idx, ok := s.policy.Victim(func(i int) bool {
		if !s.canEvict[i] { // NB: the walk from the cold end passes every held slot there
			return false
		}
		_, keep := protected[i]
		return !keep
	})
	if !ok {
		panic("cpu: evictable count says a victim exists but the policy found none")
	}
	k := s.slots[idx].key
	s.countEvictable(idx, -1)
	s.freeSlot(idx)
	s.Counters.Evictions++
	return k
}

// unreserve frees slot idx that job reserved in a call that failed.
func (s *State) unreserve(job messages.JobRef, idx int) {
	if m := s.reserved[job]; m.add(idx, -1) == 0 && m.len() == 0 {
		delete(s.reserved, job)
	}
	s.freeSlot(idx)
}

func (s *State) allocate(gi int, k messages.Key, job messages.JobRef) int {
	idx := s.popFree(gi)
	s.slots[idx] = slot{key: k, state: slotWritePending, writer: job}
	if !IsCreditKey(k) {
		s.index[k] = idx
	}
	if s.obs != nil && observable(k) {
		s.obs.Writing(k)
	}
	setOf(s.reserved, job).add(idx, 1)
	return idx
}

func (s *State) makeReady(idx int, sum uint32) {
	sl := &s.slots[idx]
	sl.state, sl.checksum, sl.writer = slotReady, sum, messages.JobRef{}
	if !sl.touched { // NB: a block touched while written keeps its rank
		s.policy.Insert(idx, sl.key)
	}
	if s.chain != nil {
		if h, ok := sl.prov.parentHash(); ok {
			s.chain.SetParent(idx, messages.Key{Namespace: sl.key.Namespace, Hash: h, Group: sl.key.Group})
		}
	}
	sl.touched = false
	s.countEvictable(idx, 1)
	s.ready++
	s.geo[s.gOf[idx]].ready++
	s.Counters.Stores++
	if s.obs != nil {
		s.obs.Readable(sl.key)
	}
}

// freeSlot returns a non-free slot to the free list. The caller has already
// removed it from the policy and the evictable count if it was ready.
func (s *State) freeSlot(idx int) {
	if s.slots[idx].touched {
		s.policy.Remove(idx) // a write that never committed leaves its rank
	}
	if sl := &s.slots[idx]; sl.state == slotReady || sl.state == slotWritePending {
		if sl.state == slotReady {
			s.ready--
			s.geo[s.gOf[idx]].ready--
		}
		if s.obs != nil && observable(sl.key) {
			s.obs.Gone(sl.key)
		}
	}
	if k := s.slots[idx].key; !IsCreditKey(k) {
		delete(s.index, k)
	}
	s.slots[idx] = slot{}
	s.pushFree(idx)
}

type expiryEntry struct {
	at     time.Time
	holder messages.Holder
}

type expiryHeap []expiryEntry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiryEntry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// marks tells whether a call named a slot before, without a set per call:
// a slot is marked with the call's generation.
type marks struct {
	gen uint32
	at  []uint32 // slot → the generation that last marked it
}

// next starts a call over n slots.
func (m *marks) next(n int) {
	if len(m.at) != n {
		m.at = make([]uint32, n)
	}
	m.gen++
	if m.gen == 0 { // NB: wrapped: a stale mark could read as this call's
		clear(m.at)
		m.gen = 1
	}
}

// twice marks idx and reports whether this call had marked it already.
func (m *marks) twice(idx int) bool {
	if m.at[idx] == m.gen {
		return true
	}
	m.at[idx] = m.gen
	return false
}

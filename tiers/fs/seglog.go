package fs

import (
	"cmp"
	"container/list"
	"fmt"
	"maps"
	"slices"

	"github.com/kvtier/kvtier/messages"
)

// segLog is the segment layout's decision logic: the segments, where each
// block lives in them (segment, offset, length), their bytes and recency,
// which to evict to stay under the byte capacity, and which segments are
// due a seal or a removal. It does no I/O and reads no clock; one actor
// owns it (it survives the actor's restarts in Tier).
//
// The unit of eviction is a whole segment: the least recently used one
// (a block read or written makes its segment most recent) goes, with every
// block in it. A block file of the files layout found at start is a unit
// of its own (id 0, one block), read through and evicted like a segment.
//
// Life of a segment: active (reservations go to its end) → full (rolled
// over: sealed at target bytes; writes into it may still be in flight) →
// settled (no write in flight: evictable; a footer is due) → sealed
// (footer on disk). Evicted, or emptied (its last live block dropped once
// settled), it is gone: its bytes are no longer accounted and its file is
// removed — after its footer write, if one is in flight.
//
// Invariants:
//   - used = Σ size over the segments not gone; with a capacity,
//     used ≤ capacity after every beginWrite.
//   - a segment's size ≥ the bytes its file holds on disk once sealed:
//     header, footer, every entry and block reserved in it and its footer
//     entry, and a filesystem block of rounding for each of its two
//     regions (the entry region's unused rest is a hole).
//   - lru holds exactly the settled segments not gone, most recent first.
//   - entries holds every key being written or readable; a readable key's
//     record is in its segment's live set, a written one's segment has it
//     counted in inflight.
//   - at most one segment is active; entries and blocks are reserved at the
//     ends of its two regions only, so a record's bytes are written by
//     exactly one write; only version 2 segments are ever active.
type segLog struct {
	capacity  int64 // 0 = unbounded
	target    int64 // bytes a segment is sealed at
	used      int64
	nextID    uint64
	active    *segment
	entries   map[messages.Key]*record
	lru       *list.List // of *segment, settled and not gone
	ready     int
	sealDue   []*segment
	removeDue []*segment
	obs       Observer // told when a key becomes readable or stops being so; nil: nobody
}

func (x *segLog) readable(k messages.Key) {
	if x.obs != nil {
		x.obs.Readable(k)
	}
}

func (x *segLog) gone(k messages.Key) {
	if x.obs != nil {
		x.obs.Gone(k)
	}
}

type segment struct {
	id       uint64       // 0: a block file of the files layout, holding key
	key      messages.Key // id 0: its block
	full     bool         // no longer active
	sealed   bool         // footer on disk (a block file: always)
	sealing  bool         // footer write in flight
	due      bool         // in sealDue
	gone     bool         // evicted or emptied
	dataBase int64        // written here (version 2): the data region's start
	headed   bool         // written here: a write that carried the segment header landed
	entries  int64        // written here: the next entry's offset
	end      int64        // written here: the next block's offset; found: where the records end
	size     int64        // bytes accounted
	inflight int          // writes reserved and not done
	live     map[messages.Key]*record
	elem     *list.Element
}

// record is a block's place in a segment: its entry (header, provenance)
// of size bytes at off and its block at data (version 2); or (version 1, a
// block file) the stored block (header, provenance, bytes) of size bytes
// at off, data 0.
type record struct {
	seg             *segment
	off, size, data int64
	ready           bool
}

// newSegLog makes an empty log. Segments are sealed at segmentBytes or, with
// a capacity, at an eighth of it if less, so evicting one frees at most an
// eighth of the tier; a segment always takes one record, however large.
// Ids start at nextID.
func newSegLog(capacity, segmentBytes int64, nextID uint64) *segLog {
	target := segmentBytes
	if capacity > 0 {
		target = min(target, capacity/8)
	}
	return &segLog{capacity: capacity, target: target, nextID: max(nextID, 1),
		entries: map[messages.Key]*record{}, lru: list.New()}
}

// addFound adds a unit found at start (a sealed segment, or a block file
// with id 0) holding recs, as the most recent so far: add oldest first.
// Keys already known are left where they are.
func (x *segLog) addFound(s *segment, recs []segRec) {
	s.full, s.sealed, s.live = true, true, map[messages.Key]*record{}
	for _, r := range recs {
		if x.entries[r.key] != nil {
			continue
		}
		rec := &record{seg: s, off: r.off, size: r.size, data: r.data, ready: true}
		s.live[r.key], x.entries[r.key] = rec, rec
		x.ready++
		x.readable(r.key)
	}
	x.used += s.size
	s.elem = x.lru.PushFront(s)
	x.nextID = max(x.nextID, s.id+1)
}

func (x *segLog) has(k messages.Key) bool {
	r := x.entries[k]
	return r != nil && r.ready
}

// touch makes readable k's segment the most recent.
func (x *segLog) touch(k messages.Key) {
	if r := x.entries[k]; r != nil && r.ready && r.seg.elem != nil {
		x.lru.MoveToFront(r.seg.elem)
	}
}

// segWrite is a write beginWrite reserved: k's record, and the segments it
// evicted whose files it removes before it writes.
type segWrite struct {
	key     messages.Key
	rec     *record
	header  bool // the write puts the segment header too: none landed yet
	evicted []messages.Key
	removes []*segment
}

// beginWrite reserves room for k's record in the active segment (rolling
// over to a new one when it is full): entry bytes at the end of its entry
// region, block bytes at the end of its data region. It evicts least
// recently used segments as the capacity needs; the evicted segments' keys
// are unreadable from now. ErrTierFull when even evicting every settled
// segment would not make room; errExists, errBusy as Index.BeginWrite.
func (x *segLog) beginWrite(k messages.Key, entry, block int64) (*segWrite, error) {
	if r := x.entries[k]; r != nil {
		if r.ready {
			return nil, errExists
		}
		return nil, errBusy
	}
	cost := entry + block + segEntrySize
	if a := x.active; a != nil && !a.empty() && (a.size+cost+a.pad(block) > x.target || a.entries+entry > a.dataBase) {
		x.roll()
	}
	var pad int64
	if x.active != nil {
		pad = x.active.pad(block)
		cost += pad
	}
	need := cost
	if x.active == nil {
		need += segOverhead
	}
	w := &segWrite{key: k}
	if x.capacity > 0 {
		if err := checkRoom(x.lru, func(el *list.Element) int64 { return el.Value.(*segment).size }, x.used, need, x.capacity); err != nil {
			return nil, err
		}
		for x.used+need > x.capacity {
			s := x.lru.Back().Value.(*segment)
			w.evicted = append(w.evicted, x.evict(s)...)
			if !s.sealing {
				w.removes = append(w.removes, s)
			}
		}
	}
	if x.active == nil {
		base := entriesFor(x.target, block, entry)
		x.active = &segment{id: x.nextID, dataBase: base, entries: segHeaderSize, end: base, size: segOverhead,
			live: map[messages.Key]*record{}}
		x.nextID++
		x.used += segOverhead
	}
	a := x.active
	// NB: every write carries the segment header until one that did
	// landed: a first write that failed would leave the file without one.
	w.rec, w.header = &record{seg: a, off: a.entries, size: entry, data: a.end + pad}, !a.headed
	a.entries += entry
	a.end += pad + block
	a.size += cost
	a.inflight++
	x.used += cost
	x.entries[k] = w.rec
	return w, nil
}

// pad is the room left unused before a block of block bytes reserved
// next in s: blocks of several sizes share a segment, and one that is whole
// filesystem blocks starts at a filesystem block's start (a write of whole,
// aligned pages is the fast one, segformat.go), the others back to back.
// Blocks of one size a multiple of segPage never pad, so a segment of them
// is laid out as one of a single size always was.
func (s *segment) pad(block int64) int64 {
	if block%segPage != 0 {
		return 0
	}
	return (segPage - (s.end-s.dataBase)%segPage) % segPage
}

// endWrite ends w: its block readable with ok; without, forgotten (its
// bytes stay accounted in the segment, dead).
func (x *segLog) endWrite(w *segWrite, ok bool) {
	r, s := w.rec, w.rec.seg
	s.inflight--
	if ok {
		s.headed = s.headed || w.header
		r.ready = true
		s.live[w.key] = r
		x.ready++
		x.readable(w.key)
	} else {
		delete(x.entries, w.key)
	}
	x.settle(s)
}

// abortWrite undoes a write that never ran: forgotten as a failed one, and
// the files of the segments it evicted left to a removal chore.
func (x *segLog) abortWrite(w *segWrite) {
	x.endWrite(w, false)
	x.removeDue = append(x.removeDue, w.removes...)
}

// roll makes the active segment full.
func (x *segLog) roll() {
	a := x.active
	x.active, a.full = nil, true
	x.settle(a)
}

// settle makes a full segment whose writes are all done evictable and due
// its seal; an empty one goes.
func (x *segLog) settle(s *segment) {
	if !s.full || s.inflight > 0 || s.gone || s.elem != nil {
		return
	}
	if len(s.live) == 0 {
		x.discard(s, true)
		return
	}
	s.elem = x.lru.PushFront(s)
	if !s.sealed && !s.due {
		s.due = true
		x.sealDue = append(x.sealDue, s)
	}
}

// evict makes settled s gone and returns the keys it held, in offset order.
func (x *segLog) evict(s *segment) []messages.Key {
	keys := s.keys()
	for _, k := range keys {
		delete(x.entries, k)
		x.gone(k)
	}
	x.ready -= len(keys)
	s.live = nil
	x.lru.Remove(s.elem)
	s.elem, s.gone = nil, true
	x.used -= s.size
	return keys
}

// discard makes settled (or settling) s, holding no live block, gone; its
// file is to be removed — after its seal, if one is in flight. It reports
// whether the removal is due now (it is then queued unless the caller
// takes it).
func (x *segLog) discard(s *segment, queue bool) bool {
	if s.elem != nil {
		x.lru.Remove(s.elem)
		s.elem = nil
	}
	s.gone = true
	x.used -= s.size
	if s.sealing {
		return false
	}
	if queue {
		x.removeDue = append(x.removeDue, s)
	}
	return true
}

// drop makes readable k unreadable — when at is set, only if k is still the
// record at (a failed read invalidates the copy it read, never a newer
// one). It reports whether k was. Its bytes stay in the segment, dead; a
// settled segment left with no live block goes, and is returned when its
// file is for the caller to remove now (else nil: a chore removes it).
func (x *segLog) drop(k messages.Key, at *record) (bool, *segment) {
	r := x.entries[k]
	if r == nil || !r.ready || (at != nil && r != at) {
		return false, nil
	}
	delete(x.entries, k)
	x.ready--
	x.gone(k)
	s := r.seg
	delete(s.live, k)
	if len(s.live) == 0 && s.elem != nil && x.discard(s, false) {
		return true, s
	}
	return true, nil
}

// requeueRemoval hands back the removal of a segment drop returned that
// could not start.
func (x *segLog) requeueRemoval(s *segment) { x.removeDue = append(x.removeDue, s) }

// segChore is I/O a segment is due: its footer (seal), or its file's
// removal.
type segChore struct {
	seg  *segment
	seal bool
	offs []int64 // seal: the live records' entry offsets
}

// chores returns the I/O due now, marking seals in flight. Each is
// answered by choreDone, or handed back by requeue if it could not start.
func (x *segLog) chores() []segChore {
	if len(x.sealDue) == 0 && len(x.removeDue) == 0 {
		return nil
	}
	var out []segChore
	for _, s := range x.sealDue {
		s.due = false
		if s.gone || s.sealed {
			continue
		}
		s.sealing = true
		out = append(out, segChore{seg: s, seal: true, offs: s.offsets()})
	}
	for _, s := range x.removeDue {
		out = append(out, segChore{seg: s})
	}
	x.sealDue, x.removeDue = nil, nil
	return out
}

// requeue hands back a chore that could not start.
func (x *segLog) requeue(c segChore) {
	s := c.seg
	if !c.seal {
		x.removeDue = append(x.removeDue, s)
		return
	}
	s.sealing = false
	if s.gone {
		x.removeDue = append(x.removeDue, s)
		return
	}
	s.due = true
	x.sealDue = append(x.sealDue, s)
}

// choreDone records a chore's outcome. A failed seal is not retried (the
// segment is read as it is; the start-up scan verifies and seals an
// unsealed one); a failed removal leaves the file to the start-up scan.
func (x *segLog) choreDone(c segChore, err error) {
	if !c.seal {
		return
	}
	s := c.seg
	s.sealing = false
	s.sealed = err == nil
	if s.gone {
		x.removeDue = append(x.removeDue, s)
	}
}

// closing is the I/O that leaves the disk as the log knows it, for a tier
// whose actor stopped and whose workers are done: every segment written to
// and not sealed is sealed with its live records (a write whose outcome
// never came back is left out: it was never announced stored), one with
// none removed, and the removals due done. The log is not used after.
func (x *segLog) closing() []segChore {
	if a := x.active; a != nil {
		x.active, a.full = nil, true
	}
	segs := map[*segment]bool{}
	for el := x.lru.Front(); el != nil; el = el.Next() {
		segs[el.Value.(*segment)] = true
	}
	for _, r := range x.entries {
		segs[r.seg] = true
	}
	out := make([]segChore, 0, len(x.removeDue))
	for _, s := range x.removeDue {
		out = append(out, segChore{seg: s})
	}
	x.removeDue, x.sealDue = nil, nil
	for s := range segs {
		switch {
		case s.id == 0 || s.sealed || s.gone || s.empty():
		case len(s.live) == 0:
			out = append(out, segChore{seg: s})
		default:
			out = append(out, segChore{seg: s, seal: true, offs: s.offsets()})
		}
		s.sealed = true
	}
	return out
}

// empty reports whether nothing was ever reserved in s, one being written.
func (s *segment) empty() bool { return s.entries == segHeaderSize }

// minSize is what s takes on disk at most once sealed (a segment being
// written), as the invariants have it.
func (s *segment) minSize() int64 {
	return segOverhead + s.entries - segHeaderSize + s.end - s.dataBase + int64(len(s.live))*segEntrySize
}

// keys are s's live keys in offset order.
func (s *segment) keys() []messages.Key {
	keys := slices.Collect(maps.Keys(s.live))
	slices.SortFunc(keys, func(a, b messages.Key) int { return cmp.Compare(s.live[a].off, s.live[b].off) })
	return keys
}

// offsets are s's live records' offsets, ascending.
func (s *segment) offsets() []int64 {
	offs := make([]int64, 0, len(s.live))
	for _, r := range s.live {
		offs = append(offs, r.off)
	}
	slices.Sort(offs)
	return offs
}

// readyKeys lists the readable keys, least recently used segment first.
// O(blocks): for inventories, never on a hot path.
func (x *segLog) readyKeys() []messages.Key {
	out := make([]messages.Key, 0, x.ready)
	for el := x.lru.Back(); el != nil; el = el.Prev() {
		out = append(out, el.Value.(*segment).keys()...)
	}
	for k, r := range x.entries {
		if r.ready && r.seg.elem == nil {
			out = append(out, k)
		}
	}
	return out
}

// checkInvariants verifies the invariants above by a full scan (tests).
func (x *segLog) checkInvariants() error {
	segs := map[*segment]bool{}
	if x.active != nil {
		segs[x.active] = true
		if x.active.full || x.active.gone || x.active.elem != nil {
			return fmt.Errorf("active segment %d is full, gone or evictable", x.active.id)
		}
	}
	inLRU := 0
	for el := x.lru.Front(); el != nil; el = el.Next() {
		s := el.Value.(*segment)
		segs[s] = true
		inLRU++
		if s.gone || !s.full || s.inflight > 0 || s.elem != el {
			return fmt.Errorf("segment %d in lru: gone %v, full %v, %d writes in flight", s.id, s.gone, s.full, s.inflight)
		}
	}
	ready := 0
	writing := map[*segment]int{}
	for k, r := range x.entries {
		if r.seg.gone {
			return fmt.Errorf("%v in gone segment %d", k, r.seg.id)
		}
		segs[r.seg] = true
		if r.ready {
			ready++
			if r.seg.live[k] != r {
				return fmt.Errorf("ready %v not live in segment %d", k, r.seg.id)
			}
		} else {
			writing[r.seg]++
		}
	}
	var used int64
	for s := range segs {
		used += s.size
		if s.dataBase != 0 && s.size < s.minSize() {
			return fmt.Errorf("segment %d: %d bytes accounted, %d reserved", s.id, s.size, s.minSize())
		}
		if writing[s] != s.inflight {
			return fmt.Errorf("segment %d: %d writes in flight, %d keys writing", s.id, s.inflight, writing[s])
		}
		if s != x.active && s.elem == nil && s.inflight == 0 {
			return fmt.Errorf("segment %d settled but not evictable", s.id)
		}
	}
	switch {
	case used != x.used:
		return fmt.Errorf("used %d, segments sum to %d", x.used, used)
	case ready != x.ready:
		return fmt.Errorf("%d ready entries, counted %d", ready, x.ready)
	case inLRU != x.lru.Len():
		return fmt.Errorf("lru of %d, walked %d", x.lru.Len(), inLRU)
	case x.capacity > 0 && x.used > x.capacity:
		return fmt.Errorf("used %d over capacity %d", x.used, x.capacity)
	}
	return nil
}

package residency

import (
	"sync/atomic"
	"unsafe"
)

// Entry states. The values are part of the file format.
const (
	StateNone      uint8 = 0 // not in the index
	StateCPU       uint8 = 1 // held in CPU memory, readable
	StateSecondary uint8 = 2 // held in a secondary tier
	StateWriting   uint8 = 3 // being written into CPU memory: ask the daemon, do not recompute
)

// table is the read side of one region: its entry words and bucket mask.
type table struct {
	words []uint64 // Invariant: len == entriesPerBucket*(mask+1); aliases the index memory
	mask  uint64   // nbuckets-1
}

// newTable views mem (8-byte aligned, nbuckets*64 bytes) as entry words.
func newTable(mem []byte, nbuckets uint64) table {
	words := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(mem))), nbuckets*entriesPerBucket)
	return table{words: words, mask: nbuckets - 1}
}

// buckets returns the first word index of fp's two buckets. With one bucket
// both are the same, and callers scan it once.
func (t *table) buckets(fp uint64) (int, int) {
	b1 := fp & t.mask
	b2 := (fp >> 32) & t.mask
	if b2 == b1 && t.mask != 0 {
		b2 = b1 ^ 1
	}
	return int(b1) * entriesPerBucket, int(b2) * entriesPerBucket
}

// lookup is the state of fp's entry, StateNone if it has none.
func (t *table) lookup(fp uint64) uint8 {
	key := fp &^ stateMask
	if key == 0 {
		return StateNone // not a fingerprint; and it must not match empty entries
	}
	b1, b2 := t.buckets(fp)
	if s, ok := t.match(b1, key); ok || b2 == b1 {
		return s
	}
	s, _ := t.match(b2, key)
	return s
}

// match scans one bucket for key.
func (t *table) match(base int, key uint64) (uint8, bool) {
	for i := base; i < base+entriesPerBucket; i++ {
		if v := atomic.LoadUint64(&t.words[i]); v&^stateMask == key {
			return uint8(v & stateMask), true
		}
	}
	return StateNone, false
}

// Region is the write side of one region of the index.
//
// Exactly one goroutine may call its mutating methods (the CPU-tier actor);
// Lookup, Published and Overflow may run anywhere, as may readers in other
// processes. REQUIRES: no method after the owning File is closed (the memory
// is unmapped).
type Region struct {
	table
	published *uint64 // Invariant: number of non-zero entries; only the writer stores
	overflow  *uint64 // cumulative dropped publishes; only the writer stores
}

// NewRegion is a Region for capacity keys in ordinary memory, with no file:
// for tests and for in-process use.
func NewRegion(capacity int) (*Region, error) {
	n, err := bucketsFor(capacity)
	if err != nil {
		return nil, err
	}
	words := make([]uint64, n*entriesPerBucket+2) // entries, then the two counters
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
	return &Region{
		table:     newTable(mem, n),
		published: &words[len(words)-2],
		overflow:  &words[len(words)-1],
	}, nil
}

// Lookup is the state of fp in this region, StateNone if absent.
func (r *Region) Lookup(fp uint64) uint8 { return r.lookup(fp) }

// Published is the number of entries currently set.
func (r *Region) Published() uint64 { return atomic.LoadUint64(r.published) }

// Overflow is the number of publishes dropped because both of the key's
// buckets were full, since the region was made.
func (r *Region) Overflow() uint64 { return atomic.LoadUint64(r.overflow) }

// Publish sets fp's state (1..3). An existing entry is overwritten in place;
// a new one goes to the emptier of fp's two buckets. It reports false, and
// counts an overflow, when both are full — the key is then simply not
// advertised. It also reports false, counting nothing, for a state outside
// 1..3 or an fp that is not a fingerprint (high 62 bits zero).
func (r *Region) Publish(fp uint64, state uint8) bool {
	key := fp &^ stateMask
	if key == 0 || state == StateNone || state > StateWriting {
		return false
	}
	slot, fresh := r.slotFor(fp, key)
	switch {
	case slot < 0:
		bump(r.overflow, 1)
		return false
	case fresh:
		bump(r.published, 1)
	}
	atomic.StoreUint64(&r.words[slot], key|uint64(state))
	return true
}

// slotFor is the word index for key: its existing entry (fresh false), else
// the first empty entry of the bucket with fewer occupied entries, b1 on a
// tie (fresh true), else -1 when both buckets are full.
func (r *Region) slotFor(fp, key uint64) (slot int, fresh bool) {
	b1, b2 := r.buckets(fp)
	m1, free1, used1 := r.scan(b1, key)
	if m1 >= 0 {
		return m1, false
	}
	if b2 == b1 {
		return free1, true
	}
	m2, free2, used2 := r.scan(b2, key)
	switch {
	case m2 >= 0:
		return m2, false
	case used2 < used1: // fewer occupied, so b2 has an empty entry
		return free2, true
	}
	return free1, true // NB: -1 only if used1 == used2 == 8: both full
}

// Withdraw removes fp's entry, if any.
func (r *Region) Withdraw(fp uint64) {
	key := fp &^ stateMask
	if key == 0 {
		return
	}
	b1, b2 := r.buckets(fp)
	m, _, _ := r.scan(b1, key)
	if m < 0 && b2 != b1 {
		m, _, _ = r.scan(b2, key)
	}
	if m >= 0 {
		atomic.StoreUint64(&r.words[m], 0)
		bump(r.published, ^uint64(0))
	}
}

// Clear empties the region (the tier dropped everything). Overflow is kept:
// it is cumulative.
func (r *Region) Clear() {
	for i := range r.words {
		if atomic.LoadUint64(&r.words[i]) != 0 {
			atomic.StoreUint64(&r.words[i], 0)
		}
	}
	atomic.StoreUint64(r.published, 0)
}

// scan finds key in the bucket at word base and returns its index (-1 if
// absent), the first empty index (-1 if full) and the occupied count.
func (r *Region) scan(base int, key uint64) (match, free, used int) {
	match, free = -1, -1
	for i := base; i < base+entriesPerBucket; i++ {
		v := atomic.LoadUint64(&r.words[i])
		switch {
		case v == 0:
			if free < 0 {
				free = i
			}
		case v&^stateMask == key:
			return i, free, used
		default:
			used++
		}
	}
	return match, free, used
}

// bump adds delta to a counter only this writer stores to: a load and a
// store, no read-modify-write instruction needed.
func bump(p *uint64, delta uint64) {
	atomic.StoreUint64(p, atomic.LoadUint64(p)+delta)
}

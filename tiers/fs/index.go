package fs

import (
	"container/list"
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/messages"
)

// Index is the fs tier's decision logic: which blocks exist, their sizes,
// their recency, and what to evict to stay under the byte capacity. It does
// no I/O and reads no clock; one actor owns it.
//
// Invariants:
//   - used = Σ size over ready and writing entries (a deleting entry's room
//     is given back when its delete starts); with a capacity, used ≤ capacity.
//   - lru holds exactly the ready entries, most recent at the front.
//   - only ready entries are found by Lookup, evicted, or read.
//   - a key being written or deleted cannot begin another write, so a file
//     path has at most one writer or remover at a time.
type Index struct {
	capacity int64 // 0 = unbounded
	used     int64
	entries  map[messages.Key]*entry
	lru      *list.List // of *entry, ready only
	obs      Observer   // told when a key becomes readable or stops being so; nil: nobody
}

// Observer hears every key that becomes readable in the tier and every
// readable key that stops being so, in order, from the Index's one owner:
// the residency index engines read (tiers/cpu/residency).
type Observer interface {
	Readable(k messages.Key)
	Gone(k messages.Key)
}

// SetObserver installs o (nil: none). It hears only changes made from now on.
func (x *Index) SetObserver(o Observer) { x.obs = o }

type entryState uint8

const (
	stateReady entryState = iota + 1
	stateWriting
	stateDeleting
)

type entry struct {
	key   messages.Key
	size  int64
	state entryState
	elem  *list.Element
}

// errBusy: the key has a write or delete in flight.
var errBusy = errors.New("fs tier: key busy")

// errExists: the key is already stored.
var errExists = errors.New("fs tier: key already stored")

// NewIndex makes an empty index with a byte capacity (0 = unbounded).
func NewIndex(capacity int64) *Index {
	return &Index{capacity: capacity, entries: map[messages.Key]*entry{}, lru: list.New()}
}

// Has reports whether k is readable.
func (x *Index) Has(k messages.Key) bool {
	e := x.entries[k]
	return e != nil && e.state == stateReady
}

// Touch marks a readable key most recently used.
func (x *Index) Touch(k messages.Key) {
	if e := x.entries[k]; e != nil && e.state == stateReady {
		x.lru.MoveToFront(e.elem)
	}
}

// Add records a block found on disk (start-up scan), as least recent so
// far: scan in oldest-first order. A known key is left alone.
func (x *Index) Add(k messages.Key, size int64) bool {
	if x.entries[k] != nil {
		return false
	}
	e := &entry{key: k, size: size, state: stateReady}
	e.elem = x.lru.PushFront(e)
	x.entries[k] = e
	x.used += size
	if x.obs != nil {
		x.obs.Readable(k)
	}
	return true
}

// BeginWrite reserves size bytes for k, evicting least recently used ready
// blocks as needed; the evicted keys are now deleting (remove their files,
// then EndDelete). ErrTierFull when even evicting every ready block would
// not make room (nothing changes then).
func (x *Index) BeginWrite(k messages.Key, size int64) (evicted []messages.Key, err error) {
	if e := x.entries[k]; e != nil {
		if e.state == stateReady {
			return nil, errExists
		}
		return nil, errBusy
	}
	if x.capacity > 0 {
		if err := checkRoom(x.lru, func(el *list.Element) int64 { return el.Value.(*entry).size }, x.used, size, x.capacity); err != nil {
			return nil, err
		}
		for x.used+size > x.capacity {
			v := x.lru.Back().Value.(*entry)
			x.startDelete(v)
			evicted = append(evicted, v.key)
		}
	}
	x.entries[k] = &entry{key: k, size: size, state: stateWriting}
	x.used += size
	return evicted, nil
}

// EndWrite ends k's write: readable with ok, forgotten without.
func (x *Index) EndWrite(k messages.Key, ok bool) {
	e := x.entries[k]
	if e == nil || e.state != stateWriting {
		return
	}
	if !ok {
		delete(x.entries, k)
		x.used -= e.size
		return
	}
	e.state = stateReady
	e.elem = x.lru.PushFront(e)
	if x.obs != nil {
		x.obs.Readable(k)
	}
}

// StartDelete makes a readable k unreadable at once (its file is to be
// removed, then EndDelete). It reports whether k was readable.
func (x *Index) StartDelete(k messages.Key) bool {
	e := x.entries[k]
	if e == nil || e.state != stateReady {
		return false
	}
	x.startDelete(e)
	return true
}

func (x *Index) startDelete(e *entry) {
	x.lru.Remove(e.elem)
	e.elem, e.state = nil, stateDeleting
	x.used -= e.size
	if x.obs != nil {
		x.obs.Gone(e.key)
	}
}

// EndDelete forgets a deleting key (its file is gone, or could not be
// removed and is left for the next start-up scan to validate).
func (x *Index) EndDelete(k messages.Key) {
	if e := x.entries[k]; e != nil && e.state == stateDeleting {
		delete(x.entries, k)
	}
}

// ReadyKeys lists the readable keys, least recently used first. O(blocks):
// for inventories, never on a hot path.
func (x *Index) ReadyKeys() []messages.Key {
	out := make([]messages.Key, 0, x.lru.Len())
	for el := x.lru.Back(); el != nil; el = el.Prev() {
		out = append(out, el.Value.(*entry).key)
	}
	return out
}

// Blocks is how many blocks are readable.
func (x *Index) Blocks() int { return x.lru.Len() }

// Used is the bytes accounted (readable or being written).
func (x *Index) Used() int64 { return x.used }

// Capacity is the byte capacity (0 = unbounded).
func (x *Index) Capacity() int64 { return x.capacity }

// CheckInvariants verifies the invariants above by a full scan (tests).
func (x *Index) CheckInvariants() error {
	var used int64
	ready := 0
	for k, e := range x.entries {
		if e.key != k {
			return fmt.Errorf("entry for %v holds key %v", k, e.key)
		}
		if e.state != stateDeleting {
			used += e.size
		}
		if e.state == stateReady {
			ready++
			if e.elem == nil {
				return fmt.Errorf("ready %v not in lru", k)
			}
		} else if e.elem != nil {
			return fmt.Errorf("non-ready %v in lru", k)
		}
	}
	if used != x.used {
		return fmt.Errorf("used %d, entries sum to %d", x.used, used)
	}
	if ready != x.lru.Len() {
		return fmt.Errorf("%d ready entries, lru holds %d", ready, x.lru.Len())
	}
	if x.capacity > 0 && x.used > x.capacity {
		return fmt.Errorf("used %d over capacity %d", x.used, x.capacity)
	}
	return nil
}

// checkRoom fails with ErrTierFull a write of need bytes that would not
// fit in capacity even once every evictable unit on lru (least recent at
// the back, each size bytes) is gone; nil when it fits.
func checkRoom(lru *list.List, size func(*list.Element) int64, used, need, capacity int64) error {
	if need > capacity {
		return fmt.Errorf("%w: block of %d bytes over capacity %d", messages.ErrTierFull, need, capacity)
	}
	var freeable int64
	for el := lru.Back(); el != nil && used-freeable+need > capacity; el = el.Prev() {
		freeable += size(el)
	}
	if used-freeable+need > capacity {
		return fmt.Errorf("%w: %d of %d bytes in use, none evictable", messages.ErrTierFull, used, capacity)
	}
	return nil
}

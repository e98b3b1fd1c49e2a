package cpu

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvtier/kvtier/messages"
)

// Region is one geometry's view of the pool: the same file as every other
// geometry's, cut into Slots slots of BlockBytes, slot i at i × BlockBytes,
// so an engine of that geometry maps the pool and addresses its slots as
// in a pool of its own. Its slot ids in the tier's one slot space are
// Base + i. Which of its slots it may use the CPU tier decides (State):
// the geometries' slots in use never share a byte.
type Region struct {
	Index      int    // the geometry's number, in the order the pool made them
	BlockBytes int    // bytes per slot
	Base       int    // its first slot id
	Slots      int    // slot ids it has (as many as the pool holds)
	Path       string // the pool file ("" for a memfd)
}

// regions is the pool's geometries after the first, grown under mu and
// read without it (Slot is called from every copy path).
type regions struct {
	mu   sync.Mutex
	list atomic.Pointer[[]Region]
}

// Budget is the bytes of the pool every geometry's slots share.
func (p *Pool) Budget() int64 { return int64(p.slots) * int64(p.blockBytes) }

// Geometry returns the region of slots of blockBytes, making it when the
// pool has none yet. ErrBadConfig: a slot larger than the pool, or more
// than MaxGeometries sizes.
func (p *Pool) Geometry(blockBytes int) (Region, error) {
	if r, ok := p.Region(blockBytes); ok {
		return r, nil
	}
	p.extra.mu.Lock()
	defer p.extra.mu.Unlock()
	have := p.regions()
	for _, r := range have {
		if r.BlockBytes == blockBytes {
			return r, nil
		}
	}
	if blockBytes <= 0 || int64(blockBytes) > p.Budget() {
		return Region{}, fmt.Errorf("%w: blocks of %d bytes in a pool of %d", messages.ErrBadConfig, blockBytes, p.Budget())
	}
	if len(have)+1 >= MaxGeometries {
		return Region{}, fmt.Errorf("%w: a pool serves at most %d block sizes", messages.ErrBadConfig, MaxGeometries)
	}
	base := p.slots
	if len(have) > 0 {
		last := have[len(have)-1]
		base = last.Base + last.Slots
	}
	n := p.Budget() / int64(blockBytes)
	if int64(base)+n > 1<<31-1 || n > maxSlotIDs(p.slots) {
		return Region{}, fmt.Errorf("%w: blocks of %d bytes: too many slots in the pool (at most %d)",
			messages.ErrBadConfig, blockBytes, maxSlotIDs(p.slots))
	}
	r := Region{Index: len(have) + 1, BlockBytes: blockBytes, Base: base, Slots: int(n), Path: p.path}
	grown := append(append([]Region(nil), have...), r)
	p.extra.list.Store(&grown)
	return r, nil
}

// Region returns the region of slots of exactly blockBytes, if the pool
// has one.
func (p *Pool) Region(blockBytes int) (Region, bool) {
	for _, r := range p.Regions() {
		if r.BlockBytes == blockBytes {
			return r, true
		}
	}
	return Region{}, false
}

func (p *Pool) regions() []Region {
	if l := p.extra.list.Load(); l != nil {
		return *l
	}
	return nil
}

// Geometries is how many block sizes the pool serves (no allocation:
// asked on every engine lookup).
func (p *Pool) Geometries() int { return 1 + len(p.regions()) }

// Regions lists every geometry's region, the first geometry's first.
func (p *Pool) Regions() []Region {
	return append([]Region{{BlockBytes: p.blockBytes, Slots: p.slots, Path: p.path}}, p.regions()...)
}

// slotOf returns slot id i's bytes: in the first geometry's slots, or in
// another geometry's, at its own offset in the same memory.
func (p *Pool) slotOf(i int) []byte {
	off, n := i*p.blockBytes, p.blockBytes
	if i >= p.slots {
		if off, n = p.Locate(i); n == 0 {
			panic(fmt.Sprintf("cpu: slot %d is in no region of the pool", i))
		}
	}
	return p.mem[off : off+n : off+n]
}

// Locate places slot id i of a geometry after the first: its offset in
// Memory and its bytes; size 0 for an id no geometry has (yet). For a
// data plane that registers Memory once and is handed slot ids of every
// size (rdma.Region.Locate).
func (p *Pool) Locate(i int) (off, size int) {
	for _, r := range p.regions() {
		if i >= r.Base && i < r.Base+r.Slots {
			return (i - r.Base) * r.BlockBytes, r.BlockBytes
		}
	}
	return 0, 0
}

// LargestSlot is the bytes of the largest slot of every size the pool
// serves now.
func (p *Pool) LargestSlot() int {
	n := p.blockBytes
	for _, r := range p.regions() {
		n = max(n, r.BlockBytes)
	}
	return n
}

// SlotIDLimit bounds every slot id the pool may ever number, whatever
// sizes it comes to serve.
func (p *Pool) SlotIDLimit() int {
	return int(min(int64(p.slots)+(MaxGeometries-1)*maxSlotIDs(p.slots), 1<<31-1))
}

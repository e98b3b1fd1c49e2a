package cpu

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/messages"
)

// Region is one geometry's slots in the pool: a shared-memory file of its
// own, so an engine of that geometry maps it and addresses slot i of it at
// i × BlockBytes, as with one geometry. Its slot ids in the tier's one slot
// space are Base + i.
type Region struct {
	Index      int    // the geometry's number, in the order the pool made them
	BlockBytes int    // bytes per slot
	Base       int    // its first slot id
	Slots      int    // slot ids it has (as many as the whole budget holds)
	Path       string // its file ("" for a memfd)

	mem  []byte
	file *os.File
}

// regions is the pool's geometries after the first, grown under Pool.mu
// and read without it (Slot is called from every copy path).
type regions struct {
	mu   sync.Mutex
	list atomic.Pointer[[]*Region]
}

// Budget is the bytes every geometry's committed slots may take together:
// the first geometry's whole region.
func (p *Pool) Budget() int64 { return int64(p.slots) * int64(p.blockBytes) }

// Geometry returns the region of slots of blockBytes, making it when the
// pool has none yet. A new region's file is sparse: the CPU tier commits
// its slots as the budget allows (State), and gives the pages of a slot it
// takes back to the filesystem (Release). ErrBadConfig: a slot larger than
// the budget, or more than MaxGeometries sizes.
func (p *Pool) Geometry(blockBytes int) (Region, error) {
	if blockBytes == p.blockBytes {
		return p.first(), nil
	}
	p.extra.mu.Lock()
	defer p.extra.mu.Unlock()
	if p.closed.Load() {
		return Region{}, ErrPoolClosed
	}
	have := p.regions()
	for _, r := range have {
		if r.BlockBytes == blockBytes {
			return *r, nil
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
	n := int(min(p.Budget()/int64(blockBytes), math.MaxInt32-int64(base)))
	r, err := p.openRegion(len(have)+1, blockBytes, base, n)
	if err != nil {
		return Region{}, err
	}
	grown := append(append([]*Region(nil), have...), r)
	p.extra.list.Store(&grown)
	return *r, nil
}

func (p *Pool) openRegion(index, blockBytes, base, n int) (*Region, error) {
	path := ""
	if p.path != "" {
		path = p.path + "." + strconv.Itoa(blockBytes)
	}
	f, err := createRegion(path)
	if err != nil {
		return nil, err
	}
	size := int64(n) * int64(blockBytes)
	if err := f.Truncate(size); err != nil { // NB: sparse: pages come as slots are written
		f.Close()
		removeRegionFile(path)
		return nil, fmt.Errorf("size pool region %s: %w", path, err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		removeRegionFile(path)
		return nil, fmt.Errorf("mmap pool region %s: %w", path, err)
	}
	return &Region{Index: index, BlockBytes: blockBytes, Base: base, Slots: n, Path: path, mem: mem, file: f}, nil
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

// first is the first geometry's region: the pool file itself.
func (p *Pool) first() Region {
	return Region{BlockBytes: p.blockBytes, Slots: p.slots, Path: p.path, mem: p.mem, file: p.file}
}

func (p *Pool) regions() []*Region {
	if l := p.extra.list.Load(); l != nil {
		return *l
	}
	return nil
}

// Regions lists every geometry's region, the first geometry's first.
func (p *Pool) Regions() []Region {
	out := []Region{p.first()}
	for _, r := range p.regions() {
		out = append(out, *r)
	}
	return out
}

// regionOf returns the region of slot id i (of a geometry after the first).
func (p *Pool) regionOf(i int) *Region {
	for _, r := range p.regions() {
		if i >= r.Base && i < r.Base+r.Slots {
			return r
		}
	}
	panic(fmt.Sprintf("cpu: slot %d is in no region of the pool", i))
}

// slotOf returns slot id i's bytes in its region.
func (p *Pool) slotOf(i int) []byte {
	if i < p.slots {
		off := i * p.blockBytes
		return p.mem[off : off+p.blockBytes : off+p.blockBytes]
	}
	r := p.regionOf(i)
	off := (i - r.Base) * r.BlockBytes
	return r.mem[off : off+r.BlockBytes : off+r.BlockBytes]
}

// Release returns slot id i's pages to the shared-memory filesystem: the CPU
// tier gave its bytes of the budget to another geometry (State.TakeReleased).
// Nobody holds the slot (it was free), and it is not handed out again
// before this returns.
func (p *Pool) Release(i int) error {
	f, off, n := p.file, int64(i)*int64(p.blockBytes), int64(p.blockBytes)
	if i >= p.slots {
		r := p.regionOf(i)
		f, off, n = r.file, int64(i-r.Base)*int64(r.BlockBytes), int64(r.BlockBytes)
	}
	if f == nil {
		return ErrPoolClosed
	}
	err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	if errors.Is(err, unix.EOPNOTSUPP) {
		clear(p.slotOf(i)) // NB: a filesystem that cannot punch: the bytes stay, zeroed
		return nil
	}
	return err
}

// closeRegions unmaps and removes every geometry's region after the first.
func (p *Pool) closeRegions() error {
	p.extra.mu.Lock()
	defer p.extra.mu.Unlock()
	var errs []error
	for _, r := range p.regions() {
		errs = append(errs, unix.Munmap(r.mem), r.file.Close())
		removeRegionFile(r.Path)
	}
	p.extra.list.Store(nil)
	return errors.Join(errs...)
}

func removeRegionFile(path string) {
	if path != "" {
		_ = os.Remove(path)
	}
}

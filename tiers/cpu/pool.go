package cpu

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/messages"
)

// ErrPoolTooLarge: the shared-memory filesystem has no room for the pool.
var ErrPoolTooLarge = errors.New("kvtier: pool larger than its shared-memory filesystem allows")

// ErrPoolInUse: another live process holds the pool file.
var ErrPoolInUse = errors.New("kvtier: pool file in use by another process")

// Pool is the CPU tier's slot memory: one shared-memory region, mmap'ed
// read-write and shared, cut into equal slots. An out-of-process engine maps
// the same file and copies GPU↔slot in place.
//
// The pages are allocated up front (fallocate), so a pool that does not fit
// fails at Open with ErrPoolTooLarge instead of a SIGBUS on first touch.
type Pool struct {
	path       string // "" for a memfd
	file       *os.File
	mem        []byte // Invariant: set once by OpenPool; never reassigned (Close races readers)
	closed     atomic.Bool
	blockBytes int
	slots      int
	extra      regions // geometries after the first (pool_geometry.go)
}

// OpenPool creates the pool. With path "" the region is an anonymous memfd;
// otherwise it is the file at path (created or truncated, locked against a
// second live owner, removed by Close).
func OpenPool(path string, slots, blockBytes int) (*Pool, error) {
	if slots <= 0 || blockBytes <= 0 {
		return nil, fmt.Errorf("%w: pool of %d slots of %d bytes", messages.ErrBadConfig, slots, blockBytes)
	}
	if int64(slots) > math.MaxInt64/int64(blockBytes) {
		return nil, fmt.Errorf("%w: pool of %d slots of %d bytes overflows", messages.ErrBadConfig, slots, blockBytes)
	}
	size := int64(slots) * int64(blockBytes)
	f, err := createRegion(path)
	if err != nil {
		return nil, err
	}
	p := &Pool{path: path, file: f, blockBytes: blockBytes, slots: slots}
	if err := p.allocate(size); err != nil {
		p.discard()
		return nil, err
	}
	return p, nil
}

func createRegion(path string) (*os.File, error) {
	if path == "" {
		fd, err := unix.MemfdCreate("kvtier-pool", unix.MFD_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("memfd_create: %w", err)
		}
		return os.NewFile(uintptr(fd), "memfd:kvtier-pool"), nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("pool dir: %w", err)
	}
	// A file left at path (a daemon killed before it could remove it) is
	// replaced, never reused: a fresh inode, so that a worker still mapping
	// the old pool can tell the new one apart (its PoolRef names device,
	// inode and size), and no page of the old file is truncated under its
	// mapping. A live daemon's pool is refused: it holds its file's lock.
	if old, err := os.OpenFile(path, os.O_RDWR, 0); err == nil {
		defer old.Close() // NB: after the rename: the lock is held until the new file is in place
		if err := unix.Flock(int(old.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrPoolInUse, path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("open pool %s: %w", path, err)
	}
	tmp := fmt.Sprintf("%s.new-%d", path, os.Getpid())
	_ = os.Remove(tmp) // NB: left by a killed daemon that had this pid
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create pool %s: %w", tmp, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("lock pool %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("place pool %s: %w", path, err)
	}
	return f, nil
}

func (p *Pool) allocate(size int64) error {
	fd := int(p.file.Fd())
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err == nil {
		if avail := int64(st.Bavail) * int64(st.Bsize); st.Blocks > 0 && size > avail {
			return fmt.Errorf("%w: %d bytes wanted, %d available", ErrPoolTooLarge, size, avail)
		}
	}
	if err := unix.Fallocate(fd, 0, 0, size); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return fmt.Errorf("%w: fallocate %d bytes: %w", ErrPoolTooLarge, size, err)
		}
		if !errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("fallocate pool: %w", err)
		}
		if err := p.file.Truncate(size); err != nil {
			return fmt.Errorf("size pool: %w", err)
		}
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap pool: %w", err)
	}
	p.mem = mem
	return nil
}

// Slot returns the bytes of slot i, aliasing the shared region.
//
// Contract: a slot slice is valid until Close; whoever holds one (an
// embedded engine, a transport) must stop using it before the node closes.
// Asking for a slot of a closed pool panics with ErrPoolClosed (not a bounds
// error), so a caller that breaks the contract sees why.
func (p *Pool) Slot(i int) []byte {
	if p.closed.Load() {
		panic(fmt.Errorf("%w: slot %d asked for after Close", ErrPoolClosed, i))
	}
	return p.slotOf(i)
}

// ErrPoolClosed is what Slot panics with once the pool is closed.
var ErrPoolClosed = errors.New("cpu: the pool is closed (slot slices are valid only until Node.Close)")

// Memory is the whole mapped region (Slots × BlockBytes), for a data-plane
// transport that registers the pool once.
func (p *Pool) Memory() []byte { return p.mem }

// BlockBytes is the size of one slot of the first geometry.
func (p *Pool) BlockBytes() int { return p.blockBytes }

// Slots is the number of slots of the first geometry.
func (p *Pool) Slots() int { return p.slots }

// Path is the pool file ("" for a memfd).
func (p *Pool) Path() string { return p.path }

// Close unmaps the region, closes it and removes the pool file.
func (p *Pool) Close() error {
	var errs []error
	if !p.closed.Swap(true) && p.mem != nil {
		errs = append(errs, unix.Munmap(p.mem))
	}
	errs = append(errs, p.discard())
	return errors.Join(errs...)
}

func (p *Pool) discard() error {
	if p.file == nil {
		return nil
	}
	var errs []error
	if p.path != "" {
		if err := os.Remove(p.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, p.file.Close())
	p.file = nil
	return errors.Join(errs...)
}

package residency

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// File is the writer's side of an index: a shared mapping, read-write, that
// it formats at Create and removes at Close.
type File struct {
	path       string   // "" for a memfd
	file       *os.File // kept open: Close checks it is still the inode at path
	mem        []byte   // Invariant: set once by Create; unmapped by Close
	generation uint64
	regions    []*Region
	closed     atomic.Bool
}

// Create makes a new index with one region per capacity (1..4 regions, each
// sized for that many keys). With path "" it is an anonymous memfd (share it
// by Fd); otherwise a fresh file at path, mode 0600: any file already there
// is removed first, so readers of a previous daemon's index keep a dead
// table and never see this one half-built.
func Create(path string, capacities []int) (*File, error) {
	spans, size, err := plan(capacities)
	if err != nil {
		return nil, err
	}
	f, err := createFresh(path)
	if err != nil {
		return nil, err
	}
	x := &File{path: path, file: f}
	if err := x.build(spans, size); err != nil {
		x.discard()
		return nil, err
	}
	return x, nil
}

// createFresh opens a new inode: a memfd, or path after removing what was
// there (O_EXCL then proves nobody raced a file in between).
func createFresh(path string) (*os.File, error) {
	if path == "" {
		fd, err := unix.MemfdCreate("kvtier-residency", unix.MFD_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("residency memfd_create: %w", err)
		}
		return os.NewFile(uintptr(fd), "memfd:kvtier-residency"), nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("residency dir: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("residency remove stale %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("residency create %s: %w", path, err)
	}
	return f, nil
}

// build sizes, maps and formats the file.
func (x *File) build(spans []span, size int) error {
	if err := x.file.Truncate(int64(size)); err != nil {
		return fmt.Errorf("residency truncate: %w", err)
	}
	mem, err := unix.Mmap(int(x.file.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("residency mmap: %w", err)
	}
	x.mem = mem
	if x.generation, err = newGeneration(); err != nil {
		return err
	}
	x.regions = format(mem, spans, x.generation)
	return nil
}

// newGeneration is a random non-zero id, so readers can tell a restarted
// daemon's index from the one they mapped (0 stays free for "none").
func newGeneration() (uint64, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("residency generation: %w", err)
		}
		if g := binary.LittleEndian.Uint64(b[:]); g != 0 {
			return g, nil
		}
	}
}

// Path is the file's path, "" for a memfd.
func (x *File) Path() string { return x.path }

// Fd is the open descriptor of the index, e.g. to pass a memfd to an engine.
// It stays owned by the File.
func (x *File) Fd() uintptr { return x.file.Fd() }

// Generation is the random id written into the header at Create.
func (x *File) Generation() uint64 { return x.generation }

// Size is the file size in bytes.
func (x *File) Size() int { return len(x.mem) }

// Regions is the number of regions.
func (x *File) Regions() int { return len(x.regions) }

// Region is region i, in the order of Create's capacities.
func (x *File) Region(i int) *Region { return x.regions[i] }

// Close unmaps and closes the index and removes its file — unless the path
// now names another inode (a newer daemon's index), which it leaves alone.
// Readers' own mappings stay valid. Safe to call more than once.
// REQUIRES: no Region method runs during or after Close.
func (x *File) Close() error {
	if !x.closed.CompareAndSwap(false, true) {
		return nil
	}
	return x.discard()
}

// discard releases whatever Create got so far.
func (x *File) discard() error {
	var errs []error
	if x.mem != nil {
		errs = append(errs, unix.Munmap(x.mem))
	}
	if x.path != "" {
		errs = append(errs, removeIfSame(x.path, x.file))
	}
	errs = append(errs, x.file.Close())
	return errors.Join(errs...)
}

// removeIfSame removes path if it still names f's inode.
func removeIfSame(path string, f *os.File) error {
	mine, err := f.Stat()
	if err != nil {
		return fmt.Errorf("residency stat: %w", err)
	}
	there, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) || (err == nil && !os.SameFile(mine, there)) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("residency stat %s: %w", path, err)
	}
	return os.Remove(path)
}

package residency

import (
	"fmt"
	"math"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Reader is a read-only mapping of an index, validated at Open. Lookups take
// no lock and make no syscall; any number of goroutines may share a Reader.
type Reader struct {
	mem        []byte  // Invariant: set once by Open; unmapped by Close
	tables     []table // in file order: State answers the first that holds a key
	generation uint64
	closed     atomic.Bool
}

// Open maps the index at path read-only and validates it. A file that is
// short, foreign, corrupt or of another version is an ErrBadIndex. A path
// like /proc/<pid>/fd/<n> opens a daemon's memfd.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("residency open: %w", err)
	}
	defer f.Close() // NB: the mapping outlives the descriptor
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("residency stat: %w", err)
	}
	if fi.Size() < tableStart || fi.Size() > math.MaxInt {
		return nil, fmt.Errorf("%w: %s is %d bytes", ErrBadIndex, path, fi.Size())
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("residency mmap: %w", err)
	}
	r, err := newReader(mem)
	if err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// newReader validates mem and wraps it.
func newReader(mem []byte) (*Reader, error) {
	gen, tables, err := parse(mem)
	if err != nil {
		return nil, err
	}
	return &Reader{mem: mem, tables: tables, generation: gen}, nil
}

// Generation is the id of the daemon instance that created the index.
func (r *Reader) Generation() uint64 { return r.generation }

// State is fp's state in the first region that holds it, StateNone if none
// does. REQUIRES: not after Close.
func (r *Reader) State(fp uint64) uint8 {
	for i := range r.tables {
		if s := r.tables[i].lookup(fp); s != StateNone {
			return s
		}
	}
	return StateNone
}

// Close unmaps the index. Safe to call more than once.
func (r *Reader) Close() error {
	if !r.closed.CompareAndSwap(false, true) {
		return nil
	}
	return unix.Munmap(r.mem)
}

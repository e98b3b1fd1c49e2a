package chaos

import (
	"errors"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/blockfmt"
	"github.com/kvtier/kvtier/tiers/fs"
)

// Disk full: every node's fs root lies under the run's directory, on one
// disk. Now and then (disk-full) that disk fills for diskFullMin..Max:
// while it is full every create, write and sync of a file fails with
// ENOSPC — a write after landing half its bytes, as a real write that runs
// out of room does — then it has room again. The fs tier must shed those
// cascades and count them (its WritesFull, the tiering actor's
// CascadeDropped), remove what it tore, never serve it (its checksums;
// no-wrong-bytes and no-corrupt-committed), and store again once there is
// room: the disk-full-absorbed invariant.
//
// Both layouts of the fs tier meet it (Options.FSLayout). The files layout
// creates a temporary file per block (Create), writes it (Write) and renames
// it into place. The segments layout opens a segment file (OpenWrite: a
// create when the segment is new) and writes each record with WriteAt —
// one call per buffer under these wrappers: the block, then its entry (the
// segment header first, for a segment's first record) — and seals a
// segment by writing its header and footer (WriteAt). Every write fails
// while the disk is full, so a seal is refused too: that is no block's
// write: the tier counts it as a failed chore (ChoreFailures; at start, a
// torn segment's seal too), the segment read unsealed.
//
// The seam is the fs tier's own (Config.FS, the fs.FS it does every call
// through): fullFS is the innermost layer, under the fs-error/fs-slow
// rules (fs.Faulty) and the bit-flipping reader.

const (
	diskFullTick = 250 * time.Millisecond
	diskFullMin  = time.Second
	diskFullMax  = 3 * time.Second
	// diskRecovery is how long the engines must have run on after the last
	// window for every fs tier to be expected to have stored a block again;
	// diskRecoveryWrites is how many block files the disk must have taken
	// since for none of them stored to be a violation (fs-error may fail a
	// few).
	diskRecovery       = time.Second
	diskRecoveryWrites = 3
	// diskFullMargin is the least time left after a window, before the
	// run's end: the recovery check needs diskRecovery of it.
	diskFullMargin = 3 * diskRecovery / 2
)

// tmpMarker marks the fs tier's temporary block files (tiers/fs format.go);
// segExt names its segment files (segformat.go). Neither is exported.
const (
	tmpMarker = ".tmp."
	segExt    = ".seg"
)

// errDiskFull is what a full disk answers.
var errDiskFull = syscall.ENOSPC

// disk is the run's disk: full or not, and the windows it was full.
type disk struct {
	full atomic.Bool

	mu      sync.Mutex
	windows int       // windows ended
	lastEnd time.Time // when the last one ended
}

// fill makes the disk full.
func (d *disk) fill() { d.full.Store(true) }

// free gives the disk room again, ending the window if one was open.
func (d *disk) free() {
	if !d.full.Swap(false) {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.windows++
	d.lastEnd = time.Now()
}

// ended is how many windows ended, and when the last did.
func (d *disk) ended() (int, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.windows, d.lastEnd
}

// startDiskFull fills the disk for a while whenever the plan says so (one
// decision per diskFullTick); the returned func stops it, leaving the disk
// with room. A window of the seeded plan ends at least diskFullMargin
// before the run's end, so that the tiers' recovery is seen (shortened to
// fit; no decision is made once there is no room for half the shortest
// window).
func startDiskFull(rs *runState) (stop func()) {
	if !rs.gate.enabled[supervision.FaultDiskFull] {
		return func() {}
	}
	end := time.Now().Add(rs.opts.Duration) // NB: started as the engines are (runFor)
	// NB: a replay (the shrinker's, which ends 2 s after its last fault)
	// injects every window it recorded, uncapped by the margin.
	_, replay := rs.gate.plan.(supervision.Script)
	stopTicks := everyTick(diskFullTick, func(done <-chan struct{}) bool {
		room := time.Until(end) - diskFullMargin
		if replay {
			room = diskFullMax
		}
		if room < diskFullMin/2 {
			return true
		}
		d := rs.gate.decide("disk full", supervision.FaultDiskFull)
		if d.None() {
			return true
		}
		rs.disk.fill()
		defer rs.disk.free()
		window := time.NewTimer(min(diskFullMin+time.Duration(d.Arg%uint64(diskFullMax-diskFullMin)), room))
		defer window.Stop()
		select {
		case <-window.C:
			return true
		case <-done:
			return false
		}
	})
	return func() {
		stopTicks()
		rs.disk.free()
	}
}

// fullFS is one node incarnation's view of the run's disk: the OS's
// filesystem, failing creates, writes and syncs with ENOSPC while the disk
// is full. It counts the calls it failed: each is a block's write — the
// store gives a block up at its first error, so each such refusal is one
// block — or a segment's seal (segments layout). And it counts the blocks
// the disk took and published since the last window ended (count).
//
// Invariant: the fs tier's WritesFull + ChoreFailures ≥ refused (a full
// write or a failed chore it counted without a refusal: its capacity,
// fs-error's faults, which fail the call above this layer).
type fullFS struct {
	fs.FS
	d       *disk
	block   int // the node's block size: a write of as many bytes is a block's
	refused atomic.Uint64

	mu      sync.Mutex
	epoch   int // windows ended when created and stored were counted from
	created int // blocks the disk took since then
	stored  int // of them, published
}

func newFullFS(d *disk, blockBytes int) *fullFS { return &fullFS{FS: fs.OS{}, d: d, block: blockBytes} }

// count adds created and stored blocks, counting from the last window's
// end. A block is created when its bytes start to reach the disk and
// stored when the tier publishes it: the files layout's Create and Rename
// of its temporary file; the segments layout's WriteAt of its bytes and of
// its header (landed).
func (f *fullFS) count(created, stored int) {
	windows, _ := f.d.ended()
	f.mu.Lock()
	defer f.mu.Unlock()
	if windows != f.epoch {
		f.epoch, f.created, f.stored = windows, 0, 0
	}
	f.created += created
	f.stored += stored
}

// sinceRoom is what the disk took and published since its last window
// ended.
func (f *fullFS) sinceRoom() (created, stored int) {
	windows, _ := f.d.ended()
	f.mu.Lock()
	defer f.mu.Unlock()
	if windows != f.epoch {
		return 0, 0
	}
	return f.created, f.stored
}

// refuse counts a refused call and returns its error.
func (f *fullFS) refuse(op, name string) error {
	f.refused.Add(1)
	return &os.PathError{Op: op, Path: name, Err: errDiskFull}
}

// Create implements fs.FS: a block's temporary file (files layout).
func (f *fullFS) Create(name string) (fs.File, error) {
	if f.d.full.Load() {
		return nil, f.refuse("open", name)
	}
	in, err := f.FS.Create(name)
	if err != nil {
		return nil, err
	}
	f.count(1, 0)
	return fullFile{File: in, fs: f, name: name}, nil
}

// OpenWrite implements fs.FS: a segment file, opened to write a record or
// a seal. A full disk refuses it when it creates the file (a new segment);
// opening a file that exists takes no room, and never fails so on a real
// disk.
func (f *fullFS) OpenWrite(name string) (fs.File, error) {
	if f.d.full.Load() && !exists(name) {
		return nil, f.refuse("open", name)
	}
	in, err := f.FS.OpenWrite(name)
	if err != nil {
		return nil, err
	}
	return fullFile{File: in, fs: f, name: name}, nil
}

func exists(name string) bool {
	_, err := os.Lstat(name)
	return err == nil
}

// Rename implements fs.FS: a block published (files layout).
func (f *fullFS) Rename(oldpath, newpath string) error {
	if err := f.FS.Rename(oldpath, newpath); err != nil {
		return err
	}
	f.count(0, 1)
	return nil
}

type fullFile struct {
	fs.File
	fs   *fullFS
	name string
}

// Write lands half of p and fails when the disk is full: the file is torn.
func (w fullFile) Write(p []byte) (int, error) {
	if !w.fs.d.full.Load() {
		return w.File.Write(p)
	}
	n, err := w.File.Write(p[:len(p)/2])
	if err != nil {
		return n, err
	}
	return n, w.fs.refuse("write", w.name)
}

// WriteAt lands half of p and fails when the disk is full, as Write does:
// the record (or the seal) is torn.
func (w fullFile) WriteAt(p []byte, off int64) (int, error) {
	if !w.fs.d.full.Load() {
		n, err := w.File.WriteAt(p, off)
		if err == nil {
			w.fs.landed(p)
		}
		return n, err
	}
	n, err := w.File.WriteAt(p[:len(p)/2], off)
	if err != nil {
		return n, err
	}
	return n, w.fs.refuse("write", w.name)
}

// landed counts a segment write that reached the disk whole: a block's
// bytes (as many as the node's block: no entry, header or footer is) are a
// block the disk took; a block's header (tiers/blockfmt: the stored block's
// header and provenance, its entry's last part) publishes it — the tier
// writes a record's block, then its entry (tiers/fs doc.go), and indexes it
// once both landed. Nothing else a segment holds decodes as a block's
// header.
func (f *fullFS) landed(p []byte) {
	switch {
	case len(p) == f.block:
		f.count(1, 0)
	case isBlockHeader(p):
		f.count(0, 1)
	}
}

func isBlockHeader(p []byte) bool {
	_, err := blockfmt.Decode(p)
	return err == nil
}

// Sync fails when the disk is full, as a delayed allocation that finds no
// room does.
func (w fullFile) Sync() error {
	if w.fs.d.full.Load() {
		return w.fs.refuse("sync", w.name)
	}
	return w.File.Sync()
}

// onDisk is what an fs tier's root holds: its block files and their
// bytes, its segment files and the room they take, and the temporary
// files left behind (a write that failed — a full disk tears it — must
// remove its own; the segments layout makes none).
type onDisk struct {
	blocks   int
	bytes    int64
	segments int
	segRoom  int64
	torn     []string
}

// scanRoot walks an fs tier's root.
func scanRoot(root string) (onDisk, error) {
	var out onDisk
	err := filepath.WalkDir(root, func(path string, e iofs.DirEntry, err error) error {
		switch {
		case errors.Is(err, iofs.ErrNotExist):
			return nil
		case err != nil:
			return err
		case e.IsDir():
			return nil
		case strings.Contains(e.Name(), tmpMarker):
			out.torn = append(out.torn, path)
		case strings.HasSuffix(e.Name(), blockfmt.Ext):
			info, err := e.Info()
			if err != nil {
				return err
			}
			out.blocks++
			out.bytes += info.Size()
		case strings.HasSuffix(e.Name(), segExt):
			switch room, err := roomOf(path); {
			case errors.Is(err, iofs.ErrNotExist): // removed since the listing
			case err != nil:
				return err
			default:
				out.segments++
				out.segRoom += room
			}
		}
		return nil
	})
	return out, err
}

// roomOf is the room a file takes on disk: the bytes of its data extents
// (SEEK_DATA/SEEK_HOLE: a hole, such as a segment's between its entry and
// data regions, takes none), and no more than its allocated blocks. Each
// alone can overstate it — allocated blocks count XFS's speculative
// preallocation past the end of a file being written, and a filesystem
// that does not report holes reports the whole file as data — never
// understate it, but on a filesystem that compresses.
func roomOf(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return 0, err
	}
	room := dataBytes(int(f.Fd()), info.Size())
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		room = min(room, st.Blocks*512)
	}
	return room, nil
}

// dataBytes sums the data extents of the open file fd of size bytes (the
// whole file where the filesystem does not tell).
func dataBytes(fd int, size int64) int64 {
	var total int64
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err != nil {
			if err == unix.ENXIO { // no data past off
				return total
			}
			return size
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return size
		}
		total += min(hole, size) - data
		off = hole
	}
	return total
}

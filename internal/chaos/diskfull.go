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

// tmpMarker marks the fs tier's temporary block files (tiers/fs format.go).
const tmpMarker = ".tmp."

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
// is full. It counts the block writes it failed (the store gives a block up
// at its first error, so each refusal is one block), and the block files
// created and published since the last window ended.
type fullFS struct {
	fs.FS
	d       *disk
	refused atomic.Uint64

	mu      sync.Mutex
	epoch   int // windows ended when created and stored were counted from
	created int // block files the disk took since then
	stored  int // of them, renamed into place
}

func newFullFS(d *disk) *fullFS { return &fullFS{FS: fs.OS{}, d: d} }

// count adds created and stored files, counting from the last window's end.
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

// Create implements fs.FS.
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

// Rename implements fs.FS: a block published.
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

// Sync fails when the disk is full, as a delayed allocation that finds no
// room does.
func (w fullFile) Sync() error {
	if w.fs.d.full.Load() {
		return w.fs.refuse("sync", w.name)
	}
	return w.File.Sync()
}

// onDisk is what an fs tier's root holds: its block files and their
// bytes, and the temporary files left behind (a write that failed — a full
// disk tears it — must remove its own).
type onDisk struct {
	blocks int
	bytes  int64
	torn   []string
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
		}
		return nil
	})
	return out, err
}

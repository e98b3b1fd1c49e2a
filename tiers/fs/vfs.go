package fs

import (
	"io"
	"os"

	"github.com/kvtier/kvtier/supervision"
)

// File is an open block or segment file: a block file is written once in
// sequence, a segment file at offsets (WriteAt, by several workers at once,
// each into the range the actor reserved for it); either is read at offsets.
type File interface {
	io.Writer
	io.WriterAt
	io.ReaderAt
	Sync() error
	Close() error
}

// FS is every filesystem call the tier makes. OS is the real one; Faulty
// wraps any FS to inject errors and stalls.
type FS interface {
	// Create makes a new file for writing; it fails if name exists.
	Create(name string) (File, error)
	// Open opens name for reading.
	Open(name string) (File, error)
	// OpenWrite opens name for writing at offsets (WriteAt), creating it if
	// it does not exist and never truncating it: a segment file, which
	// every write into it opens.
	OpenWrite(name string) (File, error)
	// Truncate cuts name to size bytes (a segment's torn tail).
	Truncate(name string, size int64) error
	Rename(oldpath, newpath string) error
	Remove(name string) error
	MkdirAll(dir string) error
	ReadDir(dir string) ([]os.DirEntry, error)
}

// OS is the operating system's filesystem.
type OS struct{}

// Create implements FS.
func (OS) Create(name string) (File, error) {
	return os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
}

// Open implements FS.
func (OS) Open(name string) (File, error) { return os.Open(name) }

// OpenWrite implements FS.
func (OS) OpenWrite(name string) (File, error) {
	return os.OpenFile(name, os.O_WRONLY|os.O_CREATE, 0o644)
}

// Truncate implements FS.
func (OS) Truncate(name string, size int64) error { return os.Truncate(name, size) }

// Rename implements FS.
func (OS) Rename(oldpath, newpath string) error { return os.Rename(oldpath, newpath) }

// Remove implements FS.
func (OS) Remove(name string) error { return os.Remove(name) }

// MkdirAll implements FS.
func (OS) MkdirAll(dir string) error { return os.MkdirAll(dir, 0o755) }

// ReadDir implements FS.
func (OS) ReadDir(dir string) ([]os.DirEntry, error) { return os.ReadDir(dir) }

// Op names a filesystem call for fault rules.
type Op uint8

// Operations a Rule sees. OpenWrite is seen as OpCreate, a WriteAt as
// OpWrite: a rule that fills the disk or fails writes fails the segment
// layout's as it does the files layout's.
const (
	OpCreate Op = iota + 1
	OpOpen
	OpWrite
	OpRead
	OpSync
	OpClose
	OpRename
	OpRemove
	OpMkdir
	OpReadDir
	OpTruncate
)

// Rule decides whether op on path fails: a non-nil error is returned
// instead of performing the call. A rule may block (to model a stalled
// device) until the test releases it.
type Rule func(op Op, path string) error

// Faulty wraps an FS and consults its rules before every call (in the order
// they were added; the first error wins). With no rules it is the inner FS.
type Faulty struct {
	inner FS
	rules supervision.Rules[Rule]
}

// NewFaulty wraps inner.
func NewFaulty(inner FS) *Faulty { return &Faulty{inner: inner} }

// Inject adds a rule; the returned func removes it.
func (f *Faulty) Inject(r Rule) (remove func()) { return f.rules.Inject(r) }

func (f *Faulty) check(op Op, path string) error {
	for _, r := range f.rules.Active() {
		if err := r(op, path); err != nil {
			return &os.PathError{Op: opName(op), Path: path, Err: err}
		}
	}
	return nil
}

func opName(op Op) string {
	return [...]string{"?", "create", "open", "write", "read", "sync", "close", "rename", "remove", "mkdir", "readdir", "truncate"}[op]
}

// Create implements FS.
func (f *Faulty) Create(name string) (File, error) { return f.open(OpCreate, name, f.inner.Create) }

// Open implements FS.
func (f *Faulty) Open(name string) (File, error) { return f.open(OpOpen, name, f.inner.Open) }

// open checks op on name, then opens it with open, the file wrapped so its
// own calls can fail too.
func (f *Faulty) open(op Op, name string, open func(string) (File, error)) (File, error) {
	if err := f.check(op, name); err != nil {
		return nil, err
	}
	in, err := open(name)
	if err != nil {
		return nil, err
	}
	return &faultyFile{File: in, fs: f, name: name}, nil
}

// OpenWrite implements FS (seen by rules as OpCreate).
func (f *Faulty) OpenWrite(name string) (File, error) {
	return f.open(OpCreate, name, f.inner.OpenWrite)
}

// Truncate implements FS.
func (f *Faulty) Truncate(name string, size int64) error {
	if err := f.check(OpTruncate, name); err != nil {
		return err
	}
	return f.inner.Truncate(name, size)
}

// Rename implements FS.
func (f *Faulty) Rename(oldpath, newpath string) error {
	if err := f.check(OpRename, newpath); err != nil {
		return err
	}
	return f.inner.Rename(oldpath, newpath)
}

// Remove implements FS.
func (f *Faulty) Remove(name string) error {
	if err := f.check(OpRemove, name); err != nil {
		return err
	}
	return f.inner.Remove(name)
}

// MkdirAll implements FS.
func (f *Faulty) MkdirAll(dir string) error {
	if err := f.check(OpMkdir, dir); err != nil {
		return err
	}
	return f.inner.MkdirAll(dir)
}

// ReadDir implements FS.
func (f *Faulty) ReadDir(dir string) ([]os.DirEntry, error) {
	if err := f.check(OpReadDir, dir); err != nil {
		return nil, err
	}
	return f.inner.ReadDir(dir)
}

type faultyFile struct {
	File
	fs   *Faulty
	name string
}

func (f *faultyFile) Write(p []byte) (int, error) {
	if err := f.fs.check(OpWrite, f.name); err != nil {
		return 0, err
	}
	return f.File.Write(p)
}

func (f *faultyFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.fs.check(OpWrite, f.name); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}

func (f *faultyFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.fs.check(OpRead, f.name); err != nil {
		return 0, err
	}
	return f.File.ReadAt(p, off)
}

func (f *faultyFile) Sync() error {
	if err := f.fs.check(OpSync, f.name); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f *faultyFile) Close() error {
	err := f.fs.check(OpClose, f.name)
	if cerr := f.File.Close(); err == nil {
		err = cerr
	}
	return err
}

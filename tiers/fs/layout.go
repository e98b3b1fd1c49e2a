package fs

import (
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// Layouts: how an fs tier keeps its blocks on disk (Config.Layout).
const (
	// LayoutFiles keeps one file per block.
	LayoutFiles = "files"
	// LayoutSegments packs blocks into append-only segment files, and reads
	// the block files of the files layout it finds in the same root.
	LayoutSegments = "segments"
	// DefaultLayout is the layout of a Config that names none: segments,
	// which write at 0.8–0.9× a sequential file where one file per block
	// writes at ~0.4× (docs/PERFORMANCE.md), and read a files root through.
	DefaultLayout = LayoutSegments
)

// LayoutOf is the layout a Config.Layout value means ("": DefaultLayout).
func LayoutOf(layout string) string {
	if layout == "" {
		return DefaultLayout
	}
	return layout
}

// layout is where a tier's blocks live and what I/O its decisions take:
// filesLayout (Index + one file per block) or segLayout (segLog + segment
// files). Its methods run in the actor's Receive and do no I/O: what needs
// the disk comes back as closures for the tier's workers, with what to do
// in Receive once they ran.
type layout interface {
	Has(k messages.Key) bool
	Touch(k messages.Key)
	Blocks() int
	Used() int64
	ReadyKeys() []messages.Key

	// reader is the I/O reading readable k into dest (verified), and the
	// copy it reads (nil for the files layout): see drop.
	reader(k messages.Key) (read func(dest []byte) (uint32, *messages.Provenance, error), at *record)
	// provenance is the I/O reading readable k's header and provenance
	// (a block of n bytes), and the copy it reads.
	provenance(k messages.Key, n int) (read func() (*messages.Provenance, error), at *record)
	// drop makes readable k unreadable — if at is set, only when k is
	// still that copy — and reports whether it was; cleanup is the I/O
	// that removes it (nil: none now).
	drop(k messages.Key, at *record) (ok bool, cleanup *cleanup)
	// beginWrite reserves room for m's block of size bytes, evicting as
	// the capacity needs: errExists, errBusy, ErrTierFull as
	// Index.BeginWrite.
	beginWrite(m *tiermsg.Write, size int64) (*writeOp, error)
	// chores is the housekeeping I/O due now (the segment layout's seals
	// and removals).
	chores() []chore
}

// cleanup is I/O removing what a drop made unreadable; done runs in
// Receive after io ran, or at once if it could not be submitted — then
// skipped first, if set.
type cleanup struct {
	io      func()
	done    func()
	skipped func()
}

// writeOp is a reserved write: the keys it evicted (unreadable now), the
// I/O (evictions' removals, then the write), end to run in Receive with
// its outcome, abort to run instead if the I/O could not be submitted.
type writeOp struct {
	evicted []messages.Key
	io      func() error
	end     func(ok bool)
	abort   func()
}

// chore is housekeeping I/O; done runs in Receive with its outcome,
// requeue instead if it could not be submitted (it is due again).
type chore struct {
	what    string
	io      func() error
	done    func(error)
	requeue func()
}

// filesLayout is one file per block: Index decides, Store does the I/O.
type filesLayout struct {
	*Index
	store *Store
}

func (l filesLayout) reader(k messages.Key) (func([]byte) (uint32, *messages.Provenance, error), *record) {
	return func(dest []byte) (uint32, *messages.Provenance, error) { return l.store.Read(k, dest) }, nil
}

func (l filesLayout) provenance(k messages.Key, n int) (func() (*messages.Provenance, error), *record) {
	return func() (*messages.Provenance, error) { return l.store.ReadProvenance(k, n) }, nil
}

func (l filesLayout) drop(k messages.Key, _ *record) (bool, *cleanup) {
	if !l.StartDelete(k) {
		return false, nil
	}
	// NB: a file that could not be removed is left for the next start-up
	// scan to validate.
	return true, &cleanup{io: func() { _ = l.store.Remove(k) }, done: func() { l.EndDelete(k) }}
}

func (l filesLayout) beginWrite(m *tiermsg.Write, size int64) (*writeOp, error) {
	evicted, err := l.BeginWrite(m.Key, size)
	if err != nil {
		return nil, err
	}
	store := l.store
	return &writeOp{
		evicted: evicted,
		io: func() error {
			for _, k := range evicted {
				_ = store.Remove(k) // NB: a file left behind is re-validated by the next scan
			}
			_, err := store.Write(m.Key, m.Src, m.Checksum, m.Prov)
			return err
		},
		end: func(ok bool) {
			for _, k := range evicted {
				l.EndDelete(k)
			}
			l.EndWrite(m.Key, ok)
		},
		abort: func() {
			l.EndWrite(m.Key, false)
			for _, k := range evicted {
				l.EndDelete(k)
			}
		},
	}, nil
}

func (filesLayout) chores() []chore { return nil }

// segLayout is the segment layout: segLog decides, Store does the I/O.
type segLayout struct {
	x     *segLog
	store *Store
}

func (l segLayout) Has(k messages.Key) bool   { return l.x.has(k) }
func (l segLayout) Touch(k messages.Key)      { l.x.touch(k) }
func (l segLayout) Blocks() int               { return l.x.ready }
func (l segLayout) Used() int64               { return l.x.used }
func (l segLayout) ReadyKeys() []messages.Key { return l.x.readyKeys() }

// path is s's file: a segment's, or a block file's.
func (l segLayout) path(s *segment) string {
	if s.id == 0 {
		return l.store.Path(s.key)
	}
	return l.store.segPath(s.id)
}

// at is where record r is stored. A block file read through is read once:
// not kept open.
func (l segLayout) at(r *record) storedAt {
	return storedAt{path: l.path(r.seg), keep: r.seg.id != 0, off: r.off, data: r.data}
}

func (l segLayout) reader(k messages.Key) (func([]byte) (uint32, *messages.Provenance, error), *record) {
	r := l.x.entries[k]
	at, store := l.at(r), l.store
	return func(dest []byte) (uint32, *messages.Provenance, error) { return store.readAt(at, k, dest) }, r
}

func (l segLayout) provenance(k messages.Key, n int) (func() (*messages.Provenance, error), *record) {
	r := l.x.entries[k]
	at, store := l.at(r), l.store
	return func() (*messages.Provenance, error) { return store.provenanceAt(at, k, n) }, r
}

// drop marks k's record dead; a segment (or block file) left with no live
// block is removed, by the cleanup (or, after a seal in flight, a chore).
func (l segLayout) drop(k messages.Key, at *record) (bool, *cleanup) {
	ok, gone := l.x.drop(k, at)
	if gone == nil {
		return ok, nil
	}
	path, store := l.path(gone), l.store
	return ok, &cleanup{io: func() { _ = store.removePath(path) }, done: func() {},
		skipped: func() { l.x.requeueRemoval(gone) }}
}

func (l segLayout) beginWrite(m *tiermsg.Write, size int64) (*writeOp, error) {
	block := int64(len(m.Src))
	w, err := l.x.beginWrite(m.Key, entrySize(size-block), block)
	if err != nil {
		return nil, err
	}
	removes := make([]string, len(w.removes))
	for i, s := range w.removes {
		removes[i] = l.path(s)
	}
	store, r := l.store, w.rec
	rw := recordWrite{id: r.seg.id, header: w.header, dataBase: r.seg.dataBase, off: r.off, size: r.size, data: r.data}
	return &writeOp{
		evicted: w.evicted,
		io: func() error {
			for _, p := range removes {
				_ = store.removePath(p) // NB: a file left behind is re-validated by the next scan
			}
			return store.writeRecord(rw, m.Key, m.Src, m.Checksum, m.Prov)
		},
		end:   func(ok bool) { l.x.endWrite(w, ok) },
		abort: func() { l.x.abortWrite(w) },
	}, nil
}

func (l segLayout) chores() []chore {
	due := l.x.chores()
	if len(due) == 0 {
		return nil
	}
	out := make([]chore, len(due))
	for i, c := range due {
		what, io := l.choreIO(c)
		out[i] = chore{what: what, io: io, done: func(err error) { l.x.choreDone(c, err) }, requeue: func() { l.x.requeue(c) }}
	}
	return out
}

// choreIO is the I/O of c: its segment's seal (footer), or its file's
// removal.
func (l segLayout) choreIO(c segChore) (what string, io func() error) {
	store, s := l.store, c.seg
	if !c.seal {
		path := l.path(s)
		return "remove segment", func() error { return store.removePath(path) }
	}
	h, entries, end, offs := segHead{id: s.id, version: segV2, dataBase: s.dataBase}, s.entries, s.end, c.offs
	return "seal segment", func() error { return store.sealSegment(h, entries, end, offs) }
}

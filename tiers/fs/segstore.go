package fs

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math"
	"path/filepath"
	"slices"
	"time"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
)

// The segment layout's file I/O (formats in segformat.go). Like the rest
// of Store, every call runs on a worker (or in Open), never in the actor;
// a write opens the segment, writes its record at the offset the actor
// reserved for it and closes it again, so writers share no file handle and
// hold no lock.

// segPath is segment id's file.
func (s *Store) segPath(id uint64) string { return segPath(s.root, id) }

// recordWrite is where the actor reserved a record in segment id: its
// entry of size bytes at off, its block at data; header: the write puts
// the segment header (with dataBase) too.
type recordWrite struct {
	id              uint64
	header          bool
	dataBase        int64
	off, size, data int64
}

// writeRecord writes k's record (its entry, header and provenance p, and
// its block src) where w says, the block first: an entry a process crash
// left on disk names a block that is there. It checks src against sum
// before the entry goes out — a slot that does not match never gets an
// entry, so its block is never indexed, found at start or served — and
// with fsync syncs the segment before it returns. Out of space is
// ErrTierFull.
func (s *Store) writeRecord(w recordWrite, k messages.Key, src []byte, sum uint32, p *messages.Provenance) error {
	prefix, _ := blockfmt.Prefix(k, len(src), sum, p)
	if n := entrySize(int64(len(prefix))); n != w.size {
		return fmt.Errorf("fs tier: %v: entry of %d bytes, %d reserved", k, n, w.size)
	}
	entry, off := [][]byte{encodeEntryHead(w.data), prefix}, w.off
	var header []byte
	switch {
	case w.header && off == segHeaderSize: // the first entry: one write with it
		entry, off = append([][]byte{encodeSegHeader(w.id, w.dataBase)}, entry...), 0
	case w.header:
		header = encodeSegHeader(w.id, w.dataBase)
	}
	return s.withSegment(w.id, func(f File) error {
		if err := writeAtv(f, [][]byte{src}, w.data); err != nil {
			return ioErr("write", err)
		}
		// NB: summed after the block's write, not before: the write's copy
		// brought src into this core's cache, where the check costs about a
		// third of what it costs on a slot coming from memory (issue 29,
		// docs/PERFORMANCE.md, "Round 4"). A mismatch leaves the bytes in
		// a slot no entry names: dead space, as after a failed write.
		if got := crc32.Checksum(src, blockfmt.Castagnoli); got != sum {
			return fmt.Errorf("%w: %v: slot has %08x, committed %08x", messages.ErrChecksum, k, got, sum)
		}
		if err := writeAtv(f, entry, off); err != nil {
			return ioErr("write", err)
		}
		if header != nil {
			if err := writeAtv(f, [][]byte{header}, 0); err != nil {
				return ioErr("write", err)
			}
		}
		return nil
	})
}

// sealSegment writes the footer of segment h.id at end, listing the
// entries (version 1: records) at offs, the entries ending at entriesEnd
// (version 2), and its header again (a first write that failed left none);
// with fsync it syncs the segment.
func (s *Store) sealSegment(h segHead, entriesEnd, end int64, offs []int64) error {
	header := encodeSegHeader(h.id, h.dataBase)
	if h.version == segV1 {
		header = encodeSegHeaderV1(h.id)
	}
	return s.withSegment(h.id, func(f File) error {
		if _, err := f.WriteAt(header, 0); err != nil {
			return ioErr("write", err)
		}
		if _, err := f.WriteAt(encodeFooter(h.version, h.id, entriesEnd, offs), end); err != nil {
			return ioErr("write", err)
		}
		return nil
	})
}

// withSegment runs fn on segment id open for writing (created if absent,
// never truncated; kept open between writes) and, with fsync on, syncs it;
// a sync that fails fails the write. (A close is no longer per write: on a
// local filesystem it reports nothing a write or sync did not; with fsync
// off a write error the kernel finds only at writeback is not reported, as
// it was not before either.)
func (s *Store) withSegment(id uint64, fn func(f File) error) error {
	f, release, err := s.segs.acquire(s.segPath(id), true)
	if err != nil {
		return ioErr("open", err)
	}
	defer release()
	if err := fn(f); err != nil {
		return err
	}
	if s.fsync {
		if err := f.Sync(); err != nil {
			return ioErr("fsync", err)
		}
	}
	return nil
}

// removePath removes a file (a segment's open copies let go first); a
// missing one is not an error.
func (s *Store) removePath(path string) error {
	s.segs.drop(path)
	if err := s.fs.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return ioErr("remove", err)
	}
	return nil
}

// segRec is a record the scan found: key's entry of size bytes at off and
// its block of length bytes at data (version 2), or (version 1) its stored
// block of size bytes at off.
type segRec struct {
	key             messages.Key
	off, size, data int64
	length          int64
}

// segFound is a segment the start-up scan found.
type segFound struct {
	id    uint64
	size  int64 // bytes accounted once the scan is done with it
	end   int64 // where its records (version 2: blocks) end
	mtime time.Time
	recs  []segRec // in offset order
}

// ScanSegments lists the segments under the root, in id order, and the
// highest id seen (0: none). A sealed segment's records are those its
// footer lists, each header read and checked (the bytes are verified on
// read, as a block file's are). A segment without a valid footer was being
// written when the process stopped: its records are walked from the start
// and verified whole (header, provenance, CRC32C of the block); the file is
// truncated after the last good block — what follows is its torn tail,
// counted in Torn — and sealed (recoverSegment). A file whose segment
// header is bad, or that holds no valid record, is removed (Removed); a
// record whose header is bad in a sealed segment is left out (Removed).
// Files that are not segments are left alone (Skipped).
func (s *Store) ScanSegments(maxBlock int, res *ScanResult) ([]segFound, uint64, error) {
	dir := filepath.Join(s.root, segDirName)
	if err := s.fs.MkdirAll(dir); err != nil {
		return nil, 0, ioErr("mkdir segments", err)
	}
	entries, err := s.fs.ReadDir(dir)
	if err != nil {
		return nil, 0, ioErr("read segments", err)
	}
	var found []segFound
	var maxID uint64
	for _, e := range entries {
		id, ok := parseSegName(e.Name())
		info, err := e.Info()
		if !ok || !e.Type().IsRegular() || err != nil {
			res.Skipped++
			continue
		}
		maxID = max(maxID, id)
		seg, keep, err := s.scanSegment(id, info.Size(), maxBlock, res)
		if err != nil {
			// NB: unreadable now (EMFILE, EIO): left for the next start,
			// neither served nor removed.
			res.Skipped++
			continue
		}
		if !keep {
			if s.removePath(s.segPath(id)) == nil {
				res.Removed++
			}
			continue
		}
		seg.mtime = info.ModTime()
		found = append(found, seg)
	}
	slices.SortFunc(found, func(a, b segFound) int { return compareU64(a.id, b.id) })
	return found, maxID, nil
}

func compareU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// segScan is one segment file being scanned: its header, size and the
// tier's bound on a block's length (its blocks may be of any length up to
// it: one segment holds blocks of every namespace's size).
type segScan struct {
	f        File
	head     segHead
	size     int64
	maxBlock int
}

// length checks a header's block length against the bound.
func (sc segScan) length(h blockfmt.Header) bool {
	return h.Length >= 1 && h.Length <= int64(sc.maxBlock)
}

// scanSegment reads segment id (size bytes): keep is false when it is to
// be removed; an error when it could not be opened or its header read.
func (s *Store) scanSegment(id uint64, size int64, maxBlock int, res *ScanResult) (seg segFound, keep bool, err error) {
	f, err := s.fs.Open(s.segPath(id))
	if err != nil {
		return segFound{}, false, err
	}
	defer f.Close()
	var hdr [segHeaderSize]byte
	if n, err := f.ReadAt(hdr[:], 0); n < segHeaderSize {
		if err != nil && !errors.Is(err, io.EOF) {
			return segFound{}, false, err
		}
		return segFound{}, false, nil
	}
	head, ok := decodeSegHeader(hdr[:])
	if !ok || head.id != id || (head.version == segV2 && head.dataBase%segPage != 0) {
		return segFound{}, false, nil
	}
	sc := segScan{f: f, head: head, size: size, maxBlock: maxBlock}
	seg = segFound{id: id, size: size}
	offs, entriesEnd, end, ok, err := readFooter(f, head, size)
	if err != nil {
		return segFound{}, false, err
	}
	if !ok {
		seg, keep = s.recoverSegment(sc, seg, res)
		return seg, keep, nil
	}
	seg.end = end
	for i, off := range offs {
		var r segRec
		var err error
		if head.version == segV1 {
			limit := end
			if i+1 < len(offs) {
				limit = offs[i+1]
			}
			r, err = sc.recordAt(off, limit)
		} else {
			r, err = sc.entryAt(off, entriesEnd, end)
		}
		if err != nil {
			res.Removed++
			continue
		}
		seg.recs = append(seg.recs, r)
	}
	if head.version == segV2 {
		seg.size = sc.accounted(entriesEnd, end, len(offs))
	}
	return seg, len(seg.recs) > 0, nil
}

// accounted is what a version 2 segment whose entries end at entriesEnd,
// its blocks at end, with n records, is accounted: as segLog accounts one
// being written.
func (sc segScan) accounted(entriesEnd, end int64, n int) int64 {
	return segOverhead + entriesEnd - segHeaderSize + end - sc.head.dataBase + int64(n)*segEntrySize
}

// readFooter reads and checks the footer of segment h (a file of size
// bytes): the offsets it lists, where its entries end (version 2) and
// where its records (version 2: blocks) end; ok is false when it has none
// that checks, err set when it could not be read (no proof of either).
func readFooter(f File, h segHead, size int64) (offs []int64, entriesEnd, end int64, ok bool, err error) {
	floor := int64(segHeaderSize)
	if h.version == segV2 {
		floor = h.dataBase
	}
	if size < floor+int64(segFooterFixed(h.version)) {
		return nil, 0, 0, false, nil
	}
	var tail [24]byte
	if err := readFull(f, tail[:], size-24); err != nil {
		return nil, 0, 0, false, err
	}
	count, ok := footerCount(tail[:], h.id, h.version)
	footer := int64(count)*segEntrySize + int64(segFooterFixed(h.version))
	if !ok || size-footer < floor {
		return nil, 0, 0, false, nil
	}
	b := make([]byte, footer)
	if err := readFull(f, b, size-footer); err != nil {
		return nil, 0, 0, false, err
	}
	limit := size - footer
	if h.version == segV2 {
		limit = h.dataBase
	}
	offs, entriesEnd, ok = decodeFooter(b, h.id, h.version, limit)
	return offs, entriesEnd, size - footer, ok, nil
}

// readFull reads len(b) bytes at off, within the file's size: any failure
// is an I/O error.
func readFull(f File, b []byte, off int64) error {
	if n, err := f.ReadAt(b, off); n < len(b) {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // NB: shrunk since it was listed
		}
		return ioErr("read", err)
	}
	return nil
}

// recordAt reads and checks the header of the version 1 record at off,
// which must end by limit and hold a block within the tier's bound.
func (sc segScan) recordAt(off, limit int64) (segRec, error) {
	var buf [headerSize]byte
	h, _, err := readRawHeader(sc.f, off, buf[:], segOffset(off))
	switch {
	case err != nil:
		return segRec{}, err
	case !sc.length(h) || off+h.Size() > limit:
		return segRec{}, fmt.Errorf("%w: segment offset %d: record of %d bytes (block %d) past %d",
			messages.ErrInvalidBlock, off, h.Size(), h.Length, limit)
	}
	return segRec{key: h.Key, off: off, size: h.Size(), length: h.Length}, nil
}

// entryAt reads and checks the version 2 entry at off, which must end by
// entriesEnd, and whose block, of a length within the tier's bound, must
// lie in the data region ending by end. (Blocks of one length lie at
// multiples of it from the region's start, as they always did; blocks of
// several lengths lie back to back, so the offset is checked against the
// region's bounds only: the header and the block's checksum say the rest.) An entry that decodes but names no such block
// is returned with its offset and size (and an error): a walk goes on after
// it.
func (sc segScan) entryAt(off, entriesEnd, end int64) (segRec, error) {
	var buf [entryHead + headerSize]byte
	data, h, _, err := readRawEntry(sc.f, off, buf[:], segOffset(off))
	if err != nil {
		return segRec{}, err
	}
	size := entrySize(headerSize + int64(h.ProvLen))
	if off+size > entriesEnd {
		return segRec{}, fmt.Errorf("%w: segment offset %d: entry of %d bytes past %d", messages.ErrInvalidBlock, off, size, entriesEnd)
	}
	base := sc.head.dataBase
	if !sc.length(h) || data < base || data > end-h.Length {
		return segRec{off: off, size: size}, fmt.Errorf("%w: segment offset %d: a block of %d bytes at %d, out of the data region from %d to %d (blocks of 1..%d bytes)",
			messages.ErrInvalidBlock, off, h.Length, data, base, end, sc.maxBlock)
	}
	return segRec{key: h.Key, off: off, size: size, data: data, length: h.Length}, nil
}

// segOffset names a record by its offset in errors.
type segOffset int64

func (o segOffset) String() string { return fmt.Sprintf("segment offset %d", int64(o)) }

// recoverSegment walks an unsealed segment's records (version 2: entries)
// from its header, verifying each one whole, truncates it after the last
// good block and seals it. A record whose header is sound but whose
// provenance or bytes are not (a write cut short before one that landed)
// is skipped and counted in Removed. Version 2: an entry that does not
// decode (never written: a hole) is stepped over to the next that does
// (resync); the walk ends where none does. Version 1: the walk stops at a
// header that does not decode or a record cut short. Everything after the
// last good record is the torn tail.
func (s *Store) recoverSegment(sc segScan, seg segFound, res *ScanResult) (segFound, bool) {
	var buf []byte // NB: grown to the longest block walked, not to the bound
	limit := sc.size
	off, entriesEnd, good := int64(segHeaderSize), int64(segHeaderSize), int64(segHeaderSize)
	if sc.head.version == segV2 {
		limit, good = sc.head.dataBase, sc.head.dataBase
	}
	skipped := 0
	extent := entriesEnd // version 2: where the entry region's bytes end
	var failed error
	for off < limit {
		r, err := sc.walkOne(off, &buf)
		if err != nil && r.size == 0 && errors.Is(err, messages.ErrInvalidBlock) && sc.head.version == segV2 {
			next, found, ext, rerr := sc.resync(off + entryAlign)
			extent = max(extent, ext)
			if rerr != nil {
				failed = rerr
				break
			}
			if found {
				off = next
				continue
			}
			break
		}
		if err != nil && (r.size == 0 || !errors.Is(err, messages.ErrInvalidBlock)) {
			if !errors.Is(err, messages.ErrInvalidBlock) {
				failed = err
			}
			break
		}
		if err != nil {
			skipped++
		} else {
			seg.recs = append(seg.recs, r)
			entriesEnd = r.off + r.size
			good = max(good, sc.recordEnd(r))
			res.Removed += skipped // NB: bad records before a good one; after the last, they are the tail
			skipped = 0
		}
		off += r.size
	}
	seg.end = good
	n := int64(len(seg.recs))
	if failed != nil {
		// NB: an I/O error is no proof of a torn tail: what was verified
		// is served, the rest is left for the next start to walk again.
		res.Unsealed++
		seg.size += segOverhead + n*segEntrySize
		return seg, n > 0
	}
	if good < sc.size {
		res.Torn++
		res.TornBytes += sc.size - good
		if n == 0 {
			return seg, false
		}
		if err := s.fs.Truncate(s.segPath(seg.id), good); err != nil {
			res.Unsealed++
			seg.size += segOverhead + n*segEntrySize
			return seg, true
		}
	}
	if n == 0 {
		return seg, false
	}
	offs := make([]int64, n)
	for i, r := range seg.recs {
		offs[i] = r.off
	}
	seg.size = good + n*segEntrySize + int64(segFooterFixed(sc.head.version))
	if sc.head.version == segV2 {
		// NB: the entries' end as the footer has it covers the bytes of
		// entries the walk could not use (torn), so the room they take stays
		// accounted at every later start.
		entriesEnd = max(entriesEnd, extent)
		seg.size = sc.accounted(entriesEnd, good, len(offs))
	}
	if err := s.sealSegment(sc.head, entriesEnd, good, offs); err != nil {
		res.Unsealed++ // walked again at the next start
		if errors.Is(err, messages.ErrTierFull) {
			res.SealsFull++
		}
	}
	return seg, true
}

// walkOne reads and verifies whole (header, provenance, block) the record
// (version 2: entry and block) at off of a segment being recovered, into
// *buf (grown to the block's length when shorter). A header that does not
// decode or (version 1) a record cut short
// returns no size: the walk stops there.
func (sc segScan) walkOne(off int64, buf *[]byte) (segRec, error) {
	var r segRec
	var err error
	if sc.head.version == segV1 {
		r, err = sc.recordAt(off, sc.size)
	} else {
		r, err = sc.entryAt(off, sc.head.dataBase, math.MaxInt64)
	}
	if err != nil {
		return r, err // NB: with its size when the walk can go on after it
	}
	var h blockfmt.Header
	n := int(r.length)
	if r.data == 0 {
		h, _, err = readHeader(sc.f, off, r.key, n)
	} else {
		h, _, err = readEntry(sc.f, off, r.data, r.key, n)
	}
	if err == nil {
		at := r.data
		if at == 0 {
			at = off + h.BlockOffset()
		}
		if cap(*buf) < n {
			*buf = make([]byte, n)
		}
		err = readVerify(sc.f, at, (*buf)[:n], h.Sum, h.Key)
	}
	return r, err
}

// recordEnd is where r's bytes end in the file: its block's end (version
// 2), or its record's.
func (sc segScan) recordEnd(r segRec) int64 {
	if r.data != 0 {
		return r.data + r.length
	}
	return r.off + r.size
}

// resync looks for the next entry of a version 2 segment being recovered
// at the offsets from from on (a multiple of entryAlign) to the entry
// region's end: one whose head and header check, and whose block lies
// where a block may. It reports where, and how far from from on the region
// holds bytes at all (one past its last non-zero byte): the room torn
// entries take. A bit flip that makes garbage pass both checksums is the
// only false find, and its block is verified before it is served.
func (sc segScan) resync(from int64) (next int64, found bool, extent int64, err error) {
	const span = entryHead + headerSize // what a candidate's checks read
	chunk := make([]byte, 64<<10+span)
	base := sc.head.dataBase
	for at := from; at < base; at += int64(len(chunk) - span) {
		n, err := sc.f.ReadAt(chunk[:min(int64(len(chunk)), base-at)], at)
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, false, extent, ioErr("read", err)
		}
		b := chunk[:n]
		if i := lastNonZero(b); i >= 0 {
			extent = at + int64(i) + 1
		}
		for i := 0; i+span <= len(b); i += entryAlign {
			data, ok := decodeEntryHead(b[i:])
			if !ok || data < base {
				continue
			}
			if _, err := blockfmt.Decode(b[i+entryHead : i+span]); err == nil {
				return at + int64(i), true, extent, nil
			}
		}
		if n < len(chunk) {
			break // the file ends
		}
	}
	return 0, false, extent, nil
}

// lastNonZero is the index of b's last non-zero byte, -1 if none.
func lastNonZero(b []byte) int {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] != 0 {
			return i
		}
	}
	return -1
}

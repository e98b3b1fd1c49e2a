package fs

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
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

// writeRecord writes k's stored block (header, provenance p, src) at off
// in segment id, the size bytes the actor reserved there; first: the
// segment's first record, whose write puts the segment header too. It
// checks src against sum first, and with fsync syncs the segment before it
// returns. Out of space is ErrTierFull.
func (s *Store) writeRecord(id uint64, off int64, first bool, k messages.Key, src []byte, sum uint32,
	p *messages.Provenance, size int64) error {
	if got := crc32.Checksum(src, castagnoli); got != sum {
		return fmt.Errorf("%w: %v: slot has %08x, committed %08x", messages.ErrChecksum, k, got, sum)
	}
	prefix, _ := blockfmt.Prefix(k, len(src), sum, p)
	if n := int64(len(prefix) + len(src)); n != size {
		return fmt.Errorf("fs tier: %v: record of %d bytes, %d reserved", k, n, size)
	}
	return s.withSegment(id, func(f File) error {
		if first {
			prefix = append(encodeSegHeader(id), prefix...)
			off -= segHeaderSize
		}
		if err := writeAtv(f, [][]byte{prefix, src}, off); err != nil {
			return ioErr("write", err)
		}
		return nil
	})
}

// sealSegment writes segment id's footer at end, listing the records at
// offs, and its header again (a first write that failed left none); with
// fsync it syncs the segment.
func (s *Store) sealSegment(id uint64, end int64, offs []int64) error {
	return s.withSegment(id, func(f File) error {
		if _, err := f.WriteAt(encodeSegHeader(id), 0); err != nil {
			return ioErr("write", err)
		}
		if _, err := f.WriteAt(encodeFooter(id, offs), end); err != nil {
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

// segRec is a record the scan found: key's stored block of size bytes at
// off.
type segRec struct {
	key       messages.Key
	off, size int64
}

// segFound is a segment the start-up scan found.
type segFound struct {
	id    uint64
	size  int64 // the file's size once the scan is done with it
	end   int64 // where its records end (its footer starts)
	mtime time.Time
	recs  []segRec // in offset order
}

// ScanSegments lists the segments under the root, in id order, and the
// highest id seen (0: none). A sealed segment's records are those its
// footer lists, each header read and checked (the bytes are verified on
// read, as a block file's are). A segment without a valid footer was being
// written when the process stopped: its records are walked from the start
// and verified whole (header, provenance, CRC32C of the block); the file is
// truncated after the last good one — what follows is its torn tail,
// counted in Torn — and sealed (recoverSegment). A file whose segment
// header is bad, or that holds no valid record, is removed (Removed); a
// record whose header is bad in a sealed segment is left out (Removed).
// Files that are not segments are left alone (Skipped).
func (s *Store) ScanSegments(blockBytes int, res *ScanResult) ([]segFound, uint64, error) {
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
		seg, keep := s.scanSegment(id, info.Size(), blockBytes, res)
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

// scanSegment reads segment id (size bytes): keep is false when it is to
// be removed.
func (s *Store) scanSegment(id uint64, size int64, blockBytes int, res *ScanResult) (seg segFound, keep bool) {
	path := s.segPath(id)
	f, err := s.fs.Open(path)
	if err != nil {
		res.Skipped++ // NB: unreadable now; left for the next start
		return segFound{}, false
	}
	defer f.Close()
	var hdr [segHeaderSize]byte
	if n, _ := f.ReadAt(hdr[:], 0); n < segHeaderSize {
		return segFound{}, false
	}
	if got, ok := decodeSegHeader(hdr[:]); !ok || got != id {
		return segFound{}, false
	}
	seg = segFound{id: id, size: size}
	if offs, end, ok := readFooter(f, id, size); ok {
		seg.end = end
		for i, off := range offs {
			limit := end
			if i+1 < len(offs) {
				limit = offs[i+1]
			}
			h, err := recordHeader(f, off, limit, blockBytes)
			if err != nil {
				res.Removed++
				continue
			}
			seg.recs = append(seg.recs, segRec{key: h.Key, off: off, size: h.Size()})
		}
		return seg, len(seg.recs) > 0
	}
	return s.recoverSegment(f, seg, blockBytes, res)
}

// readFooter reads and checks segment id's footer (a file of size bytes):
// the offsets it lists and where the records end.
func readFooter(f File, id uint64, size int64) ([]int64, int64, bool) {
	if size < segHeaderSize+segFooterFixed {
		return nil, 0, false
	}
	var tail [segFooterFixed]byte
	if n, _ := f.ReadAt(tail[:], size-segFooterFixed); n < segFooterFixed {
		return nil, 0, false
	}
	count, ok := footerCount(tail[:], id)
	footer := int64(count)*segEntrySize + segFooterFixed
	if !ok || size-footer < segHeaderSize {
		return nil, 0, false
	}
	b := make([]byte, footer)
	if n, _ := f.ReadAt(b, size-footer); int64(n) < footer {
		return nil, 0, false
	}
	offs, ok := decodeFooter(b, id, size-footer)
	return offs, size - footer, ok
}

// recordHeader reads and checks the header of the record at off, which
// must end by limit and hold a block of blockBytes.
func recordHeader(f File, off, limit int64, blockBytes int) (blockfmt.Header, error) {
	var buf [headerSize]byte
	h, _, err := readRawHeader(f, off, buf[:], segOffset(off))
	switch {
	case err != nil:
		return h, err
	case h.Length != int64(blockBytes) || off+h.Size() > limit:
		return h, fmt.Errorf("%w: segment offset %d: record of %d bytes (block %d) past %d",
			messages.ErrInvalidBlock, off, h.Size(), h.Length, limit)
	}
	return h, nil
}

// segOffset names a record by its offset in errors.
type segOffset int64

func (o segOffset) String() string { return fmt.Sprintf("segment offset %d", int64(o)) }

// recoverSegment walks an unsealed segment's records, verifying each one
// whole, truncates it after the last good one and seals it. A record whose
// header is sound but whose provenance or bytes are not (a write cut short
// before one that landed) is skipped and counted in Removed; the walk stops
// at a header that does not decode or a record cut short, and everything
// from the end of the last good record on is the torn tail.
func (s *Store) recoverSegment(f File, seg segFound, blockBytes int, res *ScanResult) (segFound, bool) {
	buf := make([]byte, blockBytes)
	off, good := int64(segHeaderSize), int64(segHeaderSize)
	skipped := 0
	var failed error
	for off < seg.size {
		h, err := recordHeader(f, off, seg.size, blockBytes)
		if err != nil {
			if !errors.Is(err, messages.ErrInvalidBlock) {
				failed = err
			}
			break
		}
		_, _, err = readHeader(f, off, h.Key, blockBytes) // the provenance too
		if err == nil {
			err = readVerify(f, off+h.BlockOffset(), buf, h.Sum, h.Key)
		}
		if err != nil && !errors.Is(err, messages.ErrInvalidBlock) {
			failed = err
			break
		}
		if err != nil {
			skipped++
		} else {
			seg.recs = append(seg.recs, segRec{key: h.Key, off: off, size: h.Size()})
			good = off + h.Size()
			res.Removed += skipped // NB: bad records before a good one; after the last, they are the tail
			skipped = 0
		}
		off += h.Size()
	}
	seg.end = good
	if failed != nil {
		// NB: an I/O error is no proof of a torn tail: what was verified
		// is served, the rest is left for the next start to walk again.
		res.Unsealed++
		seg.size = max(seg.size, good+int64(len(seg.recs))*segEntrySize+segFooterFixed)
		return seg, len(seg.recs) > 0
	}
	if good < seg.size {
		res.Torn++
		res.TornBytes += seg.size - good
		if len(seg.recs) == 0 {
			return seg, false
		}
		if err := s.fs.Truncate(s.segPath(seg.id), good); err != nil {
			res.Unsealed++
			seg.size += int64(len(seg.recs))*segEntrySize + segFooterFixed
			return seg, true
		}
	}
	if len(seg.recs) == 0 {
		return seg, false
	}
	offs := make([]int64, len(seg.recs))
	for i, r := range seg.recs {
		offs[i] = r.off
	}
	seg.size = good + int64(len(offs))*segEntrySize + segFooterFixed
	if err := s.sealSegment(seg.id, good, offs); err != nil {
		res.Unsealed++ // walked again at the next start
	}
	return seg, true
}

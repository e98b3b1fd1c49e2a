package fs

import (
	"cmp"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
)

// readChunk is the unit a block is read and checksummed in: a 256 KiB
// block is read whole and then summed (it is still in the 2 MiB L2 cache of
// the core that read it; reading it in 64 KiB chunks cost one pread per
// chunk and was 10-15% slower, docs/PERFORMANCE.md), a larger one in 1 MiB
// pieces.
const readChunk = 1 << 20

// Store does the tier's file I/O: one call per block, run on a worker
// goroutine, never in the actor. It holds no index; the actor decides which
// calls to make.
type Store struct {
	fs     FS
	root   string
	fsync  bool
	tmpSeq atomic.Uint64
	segs   *fileCache // segment files kept open between operations
	// maxBlock bounds the blocks served (0: blockfmt.MaxBlockBytes): a
	// header naming a longer one is not a block of this tier (its bound
	// was lowered since), whatever its file's size.
	maxBlock int
}

// NewStore serves blocks under root through fsys; with fsync every write
// is synced before it is published.
func NewStore(fsys FS, root string, fsync bool) *Store {
	return &Store{fs: fsys, root: root, fsync: fsync, segs: newFileCache(fsys, maxCachedFiles)}
}

// openRead opens path for reading: through the cache of open segment files
// with keep (a segment), else for this one operation (a block file).
func (s *Store) openRead(path string, keep bool) (File, func(), error) {
	if keep {
		return s.segs.acquire(path, false)
	}
	f, err := s.fs.Open(path)
	if err != nil {
		return nil, nil, err
	}
	return f, func() { _ = f.Close() }, nil
}

// Path is key's file.
func (s *Store) Path(k messages.Key) string { return filepath.Join(s.root, relPath(k)) }

// Write stores src as k's block, with its provenance p (nil: none) in the
// header: it checks src against sum, writes header, provenance and bytes to
// a temporary file, optionally syncs it, and renames it into place, so a
// reader sees the whole block or none. It returns the file's size. Out of
// space is ErrTierFull.
func (s *Store) Write(k messages.Key, src []byte, sum uint32, p *messages.Provenance) (int64, error) {
	if got := crc32.Checksum(src, blockfmt.Castagnoli); got != sum {
		return 0, fmt.Errorf("%w: %v: slot has %08x, committed %08x", messages.ErrChecksum, k, got, sum)
	}
	path := s.Path(k)
	if err := s.fs.MkdirAll(filepath.Dir(path)); err != nil {
		return 0, ioErr("mkdir", err)
	}
	prefix, _ := blockfmt.Prefix(k, len(src), sum, p)
	tmp := path + tmpMarker + strconv.FormatUint(s.tmpSeq.Add(1), 10)
	if err := s.writeFile(tmp, prefix, src); err != nil {
		_ = s.fs.Remove(tmp)
		return 0, err
	}
	if err := s.fs.Rename(tmp, path); err != nil {
		_ = s.fs.Remove(tmp)
		return 0, ioErr("rename", err)
	}
	return int64(len(prefix) + len(src)), nil
}

// FileSize is the size of k's file holding a block of n bytes with
// provenance p, as Write writes it.
func FileSize(n int, p *messages.Provenance) int64 {
	return headerSize + int64(max(blockfmt.ProvenanceSize(p), 0)) + int64(n)
}

func (s *Store) writeFile(name string, prefix, src []byte) (err error) {
	f, err := s.fs.Create(name)
	if err != nil {
		return ioErr("create", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = ioErr("close", cerr)
		}
	}()
	if _, err := f.Write(prefix); err != nil {
		return ioErr("write", err)
	}
	if _, err := f.Write(src); err != nil {
		return ioErr("write", err)
	}
	if s.fsync {
		if err := f.Sync(); err != nil {
			return ioErr("fsync", err)
		}
	}
	return nil
}

// ioErr wraps an I/O error; out of space or quota becomes ErrTierFull.
func ioErr(op string, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: %s: %w", messages.ErrTierFull, op, err)
	}
	return fmt.Errorf("fs tier %s: %w", op, err)
}

// Read reads k's block into dest and verifies it: header intact, same key,
// length len(dest), provenance section intact, CRC32C of the bytes as
// recorded. It returns the checksum and the stored provenance (nil when the
// file has none). A file that fails a check is ErrInvalidBlock (the caller
// removes it); a missing file is ErrNotFound; a sound block of another
// length than len(dest) is blockfmt.ErrSize, with dest untouched (the
// header is checked before a byte of the block is read).
func (s *Store) Read(k messages.Key, dest []byte) (sum uint32, p *messages.Provenance, err error) {
	return s.readAt(storedAt{path: s.Path(k)}, k, dest)
}

// storedAt is where a stored block is: its file (through the cache of open
// files when keep: a segment), the offset of its header (a block file: 0;
// a version 1 segment: its record's; version 2: its entry's) and that of
// its block when apart from it (version 2; else 0: behind the header).
type storedAt struct {
	path      string
	keep      bool
	off, data int64
}

// readAt reads and verifies, as Read does, k's stored block at at.
func (s *Store) readAt(at storedAt, k messages.Key, dest []byte) (sum uint32, p *messages.Provenance, err error) {
	f, release, h, p, err := s.open(at, k, len(dest))
	if err != nil {
		return 0, nil, err
	}
	defer release()
	block := at.data
	if block == 0 {
		block = at.off + h.BlockOffset()
	}
	if err := readVerify(f, block, dest, h.Sum, k); err != nil {
		return 0, nil, err
	}
	return h.Sum, p, nil
}

// readVerify reads len(dest) bytes at off into dest and checks their
// CRC32C is sum: ErrInvalidBlock when short or different.
func readVerify(f File, off int64, dest []byte, sum uint32, k messages.Key) error {
	// NB: read and checksum chunk by chunk, so each chunk is summed while it
	// is still in cache.
	var got uint32
	for o := 0; o < len(dest); o += readChunk {
		chunk := dest[o:min(o+readChunk, len(dest))]
		if n, err := f.ReadAt(chunk, off+int64(o)); n < len(chunk) {
			if err != nil && !errors.Is(err, io.EOF) {
				return ioErr("read", err)
			}
			return fmt.Errorf("%w: %v: truncated block (%d of %d bytes)", messages.ErrInvalidBlock, k, o+n, len(dest))
		}
		got = crc32.Update(got, blockfmt.Castagnoli, chunk)
	}
	if got != sum {
		return fmt.Errorf("%w: %v: %w: want %08x, got %08x", messages.ErrInvalidBlock, k, messages.ErrChecksum, sum, got)
	}
	return nil
}

// ReadProvenance reads only k's header and provenance (a block of n
// bytes): what the start-up announcements need. The block's bytes are
// verified when it is read.
func (s *Store) ReadProvenance(k messages.Key, n int) (*messages.Provenance, error) {
	return s.provenanceAt(storedAt{path: s.Path(k)}, k, n)
}

// provenanceAt is ReadProvenance for k's stored block at at.
func (s *Store) provenanceAt(at storedAt, k messages.Key, n int) (*messages.Provenance, error) {
	_, release, _, p, err := s.open(at, k, n)
	if err != nil {
		return nil, err
	}
	release()
	return p, nil
}

// open opens at's file and reads and checks the header (of k's block of n
// bytes) and provenance there. release lets the file go.
func (s *Store) open(at storedAt, k messages.Key, n int) (f File, release func(), h blockfmt.Header, p *messages.Provenance, err error) {
	f, release, err = s.openRead(at.path, at.keep)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, h, nil, fmt.Errorf("%w: %v", messages.ErrNotFound, k)
	}
	if err != nil {
		return nil, nil, h, nil, ioErr("open", err)
	}
	if at.data != 0 {
		h, p, err = readEntry(f, at.off, at.data, k, n)
	} else {
		h, p, err = readHeader(f, at.off, k, n)
	}
	if err == nil && h.Length > int64(cmp.Or(s.maxBlock, blockfmt.MaxBlockBytes)) {
		err = fmt.Errorf("%w: %v: a block of %d bytes, over the tier's bound %d", messages.ErrInvalidBlock, k, h.Length, s.maxBlock)
	}
	if err != nil {
		release()
		return nil, nil, h, nil, err
	}
	return f, release, h, p, nil
}

// headerRead is what one read fetches of a stored block's start: the
// header and a typical provenance section (a second read fetches a larger
// one).
const headerRead = 4 << 10

// readHeader reads, at base, the header of k's block of n bytes and its
// provenance.
func readHeader(f File, base int64, k messages.Key, n int) (blockfmt.Header, *messages.Provenance, error) {
	var buf [headerRead]byte
	h, got, err := readRawHeader(f, base, buf[:], k)
	if err != nil {
		return blockfmt.Header{}, nil, err
	}
	return checkStored(f, base, h, got, k, n)
}

// readEntry reads, at off in a version 2 segment, the entry of k's block
// of n bytes (which it must place at data): its header and provenance.
func readEntry(f File, off, data int64, k messages.Key, n int) (blockfmt.Header, *messages.Provenance, error) {
	var buf [headerRead]byte
	at, h, got, err := readRawEntry(f, off, buf[:], k)
	switch {
	case err != nil:
		return blockfmt.Header{}, nil, err
	case at != data:
		return blockfmt.Header{}, nil, fmt.Errorf("%w: %v: entry names a block at %d, not %d", messages.ErrInvalidBlock, k, at, data)
	}
	return checkStored(f, off+entryHead, h, got, k, n)
}

// checkStored checks that decoded header h, at base, is k's block of n
// bytes, and decodes the provenance section after it: from got (the bytes
// read from base on) or, when larger, read apart.
func checkStored(f File, base int64, h blockfmt.Header, got []byte, k messages.Key, n int) (blockfmt.Header, *messages.Provenance, error) {
	if err := h.Check(k, n); err != nil {
		return blockfmt.Header{}, nil, err
	}
	section := got[headerSize:min(len(got), headerSize+h.ProvLen)]
	if len(section) < h.ProvLen {
		section = make([]byte, h.ProvLen)
		if m, err := f.ReadAt(section, base+headerSize); m < len(section) {
			if err != nil && !errors.Is(err, io.EOF) {
				return blockfmt.Header{}, nil, ioErr("read", err)
			}
			return blockfmt.Header{}, nil, fmt.Errorf("%w: %v: truncated provenance", messages.ErrInvalidBlock, k)
		}
	}
	p, err := blockfmt.DecodeProvenance(section)
	if err != nil {
		return blockfmt.Header{}, nil, fmt.Errorf("%v: %w", k, err)
	}
	return h, p, nil
}

// readRawEntry reads up to len(buf) bytes at off, an entry of a version 2
// segment, and decodes its head and the header after it: the block's
// offset, the header, and the bytes read from the header on.
func readRawEntry(f File, off int64, buf []byte, who any) (int64, blockfmt.Header, []byte, error) {
	got, err := f.ReadAt(buf, off)
	if got < entryHead+headerSize {
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, blockfmt.Header{}, nil, ioErr("read", err)
		}
		return 0, blockfmt.Header{}, nil, fmt.Errorf("%w: %v: truncated entry", messages.ErrInvalidBlock, who)
	}
	data, ok := decodeEntryHead(buf)
	if !ok {
		return 0, blockfmt.Header{}, nil, fmt.Errorf("%w: %v: entry head checksum", messages.ErrInvalidBlock, who)
	}
	h, err := blockfmt.Decode(buf[entryHead:got])
	if err != nil {
		return 0, blockfmt.Header{}, nil, fmt.Errorf("%v: %w", who, err)
	}
	return data, h, buf[entryHead:got], nil
}

// readRawHeader reads up to len(buf) bytes at base and decodes the header
// they start with; what names the block in errors is who (a key, or a
// segment offset). It returns the bytes read.
func readRawHeader(f File, base int64, buf []byte, who any) (blockfmt.Header, []byte, error) {
	got, err := f.ReadAt(buf, base)
	if got < headerSize {
		if err != nil && !errors.Is(err, io.EOF) {
			return blockfmt.Header{}, nil, ioErr("read", err)
		}
		return blockfmt.Header{}, nil, fmt.Errorf("%w: %v: truncated header", messages.ErrInvalidBlock, who)
	}
	h, err := blockfmt.Decode(buf[:got])
	if err != nil {
		return blockfmt.Header{}, nil, fmt.Errorf("%v: %w", who, err)
	}
	return h, buf[:got], nil
}

// Remove deletes k's file; a missing file is not an error.
func (s *Store) Remove(k messages.Key) error {
	if err := s.fs.Remove(s.Path(k)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return ioErr("remove", err)
	}
	return nil
}

// scanned is a block file found by Scan.
type scanned struct {
	key   messages.Key
	size  int64
	mtime time.Time
}

// ScanResult is what a start-up scan found.
type ScanResult struct {
	blocks  []scanned // oldest first
	Removed int       // leftovers removed: temporary files, misnamed or mis-sized block files; bad segments and records
	Skipped int       // entries that are not ours, left alone
	// The segment layout's: torn tails truncated (and their bytes), and
	// segments left unsealed (an I/O error; walked again at the next start),
	// of them SealsFull for lack of room.
	Torn      int
	TornBytes int64
	Unsealed  int
	SealsFull int
}

// Scan walks the root and lists the block files, oldest first (the
// segments directory is not its to read). Temporary
// files (a write interrupted by a crash), block files whose name does not
// parse and block files whose size cannot be header, provenance and a
// block of 1 to maxBlock bytes (blocks of several sizes share a tier) are
// removed and counted: they can never be served. Headers
// are verified by the tier's start-up announcements (or on read), block
// checksums on read. A missing root is created.
func (s *Store) Scan(maxBlock int) (ScanResult, error) {
	var res ScanResult
	if err := s.fs.MkdirAll(s.root); err != nil {
		return res, ioErr("mkdir root", err)
	}
	nsDirs, err := s.fs.ReadDir(s.root)
	if err != nil {
		return res, ioErr("read root", err)
	}
	for _, nd := range nsDirs {
		if nd.Name() == segDirName {
			continue // the segment layout's (ScanSegments)
		}
		ns, ok := blockfmt.ParseNSDir(nd.Name())
		if !ok || !nd.IsDir() {
			res.Skipped++
			continue
		}
		if err := s.scanNamespace(ns, filepath.Join(s.root, nd.Name()), maxBlock, &res); err != nil {
			return res, err
		}
	}
	slices.SortStableFunc(res.blocks, func(a, b scanned) int { return a.mtime.Compare(b.mtime) })
	return res, nil
}

func (s *Store) scanNamespace(ns messages.Namespace, dir string, maxBlock int, res *ScanResult) error {
	shards, err := s.fs.ReadDir(dir)
	if err != nil {
		return ioErr("read dir", err)
	}
	for _, sd := range shards {
		if !sd.IsDir() || len(sd.Name()) != 2 || !blockfmt.IsLowerHex(sd.Name()) {
			res.Skipped++
			continue
		}
		shardDir := filepath.Join(dir, sd.Name())
		files, err := s.fs.ReadDir(shardDir)
		if err != nil {
			return ioErr("read dir", err)
		}
		for _, f := range files {
			s.scanFile(ns, shardDir, sd.Name(), f, maxBlock, res)
		}
	}
	return nil
}

func (s *Store) scanFile(ns messages.Namespace, dir, shard string, f fs.DirEntry, maxBlock int, res *ScanResult) {
	name := f.Name()
	full := filepath.Join(dir, name)
	if !f.Type().IsRegular() {
		res.Skipped++
		return
	}
	if strings.Contains(name, tmpMarker) && strings.Contains(name, blockExt) {
		if s.fs.Remove(full) == nil {
			res.Removed++
		}
		return
	}
	if !strings.HasSuffix(name, blockExt) {
		res.Skipped++
		return
	}
	hash, group, ok := blockfmt.ParseFileName(name)
	info, err := f.Info()
	if !ok || err != nil || !blockfmt.Fits(info.Size(), maxBlock) || blockfmt.ShardOf(name) != shard {
		if s.fs.Remove(full) == nil {
			res.Removed++
		}
		return
	}
	res.blocks = append(res.blocks, scanned{
		key:  messages.Key{Namespace: ns, Hash: hash, Group: group},
		size: info.Size(), mtime: info.ModTime(),
	})
}

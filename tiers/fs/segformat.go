package fs

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kvtier/kvtier/tiers/blockfmt"
)

// The segment layout's files: root/segments/<16-hex id>.seg, ids never
// reused (the next is one past the highest found at start). Writers write
// version 2; version 1 segments (earlier builds) are still read, recovered
// and evicted, never written to.
//
// Version 2: the blocks in a data region, their headers in an entry region
// of their own at the file's start. A segment holds blocks of any length
// (each entry's header says its block's); blocks of one length lie at
// block-size-aligned offsets, as every segment written before blocks had
// several sizes does.
//
//	off        size  field
//	  0           8  magic "KVTSEG02"
//	  8           8  segment id, little endian (the file's name)
//	 16           8  D: where the data region starts (a multiple of the
//	                 block size, or of 4 KiB for blocks that are not)
//	 24           4  zero
//	 28           4  CRC32C of bytes 0..27
//	 32           …  the entry region: one entry per record, back to back,
//	                 each 8 bytes the block's offset in the data region, 4
//	                 zero, 4 CRC32C of those 12, then the stored block's
//	                 header and provenance section (tiers/blockfmt) — all
//	                 a block file holds but the block — padded to a
//	                 multiple of 8 bytes; ends before D (the rest of it is
//	                 a hole)
//	  D           …  the data region: the blocks in the order of their
//	                 entries, back to back, except that a block whose
//	                 length is a multiple of 4 KiB starts at a multiple of
//	                 4 KiB (the bytes skipped are a hole); so blocks of one
//	                 size S lie at D + i × S. A reader takes a block's
//	                 place from its entry and checks only that it lies in
//	                 the region: no earlier reader needed more
//	end     8 × n    sealed segments only: the footer, n entry offsets
//	                 (ascending: the records written whole and live at seal)
//	          8      where the entries end
//	          4      n
//	          8      segment id
//	          4      CRC32C of the offsets, entries' end, n and id
//	          8      magic "KVTSEAL2"
//
// Why apart: a 256 KiB write covering whole, naturally aligned large folios
// costs ext4 ~48 µs, one straddling them (the block behind its header) ~64
// µs (BenchmarkRecordWriteShapes); a sequential file of blocks is the
// baseline the tier is held to.
//
// Version 1 ("KVTSEG01", footer "KVTSEAL1" without the entries' end):
// records back to back from offset 32, each a stored block exactly as a
// block file holds it (header, provenance, block); the footer lists their
// offsets.
//
// A segment without a valid footer was being written when the process
// stopped: the start-up scan walks its entries (version 1: records) from
// the header, verifies each one's header, provenance and block checksum,
// truncates the file after the last good block (its torn tail), and seals
// it. An entry that was never written (its write failed, or was still in
// flight) leaves a hole the walk steps over: it tries each 8-byte offset
// after it for the next entry whose head and header check (version 1 stops
// there).
const (
	segDirName    = "segments"
	segExt        = ".seg"
	segHeaderSize = 32
	segEntrySize  = 8 // a record's offset in the footer
	// entryHead is what an entry adds before the stored block's header.
	entryHead = 16
	// entryAlign: entries start at multiples of it (entrySize).
	entryAlign = 8
	// segPage is a filesystem block: the entry region's end and the file's
	// end each take at most one more on disk than they hold.
	segPage = 4 << 10
	// segOverhead is what a version 2 segment adds beyond its records
	// (entries, blocks) and their footer entries, accounted against the
	// capacity.
	segOverhead = segHeaderSize + segFooterV2 + 2*segPage
	// entryBudget is the room the entry region keeps per block slot (an
	// entry with a typical provenance takes ~300 bytes): a segment whose
	// entries outgrow it is sealed early.
	entryBudget = 512
	// DefaultSegmentBytes is the size a segment is sealed at.
	DefaultSegmentBytes = 64 << 20
)

// Segment format versions.
const (
	segV1 = 1
	segV2 = 2
)

var (
	segMagic  = [...][8]byte{segV1: {'K', 'V', 'T', 'S', 'E', 'G', '0', '1'}, segV2: {'K', 'V', 'T', 'S', 'E', 'G', '0', '2'}}
	sealMagic = [...][8]byte{segV1: {'K', 'V', 'T', 'S', 'E', 'A', 'L', '1'}, segV2: {'K', 'V', 'T', 'S', 'E', 'A', 'L', '2'}}
)

// A footer's size beyond its offsets, by version.
const (
	segFooterV1 = 24
	segFooterV2 = 32
)

// segFooterFixed is a footer's size beyond its offsets.
func segFooterFixed(version int) int {
	if version == segV1 {
		return segFooterV1
	}
	return segFooterV2
}

// segName is segment id's file name.
func segName(id uint64) string { return fmt.Sprintf("%016x%s", id, segExt) }

// parseSegName inverts segName.
func parseSegName(name string) (uint64, bool) {
	base, ok := strings.CutSuffix(name, segExt)
	if !ok || len(base) != 16 || !blockfmt.IsLowerHex(base) {
		return 0, false
	}
	id, err := strconv.ParseUint(base, 16, 64)
	return id, err == nil && id > 0
}

// segPath is segment id's file under root.
func segPath(root string, id uint64) string { return filepath.Join(root, segDirName, segName(id)) }

// segHead is a decoded segment header.
type segHead struct {
	id       uint64
	version  int
	dataBase int64 // version 2: where the data region starts
}

// encodeSegHeader is a version 2 segment header.
func encodeSegHeader(id uint64, dataBase int64) []byte {
	b := make([]byte, segHeaderSize)
	copy(b, segMagic[segV2][:])
	binary.LittleEndian.PutUint64(b[8:], id)
	binary.LittleEndian.PutUint64(b[16:], uint64(dataBase))
	binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], blockfmt.Castagnoli))
	return b
}

// encodeSegHeaderV1 is a version 1 segment header (tests make old
// segments with it).
func encodeSegHeaderV1(id uint64) []byte {
	b := make([]byte, segHeaderSize)
	copy(b, segMagic[segV1][:])
	binary.LittleEndian.PutUint64(b[8:], id)
	binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], blockfmt.Castagnoli))
	return b
}

// decodeSegHeader checks a segment header of either version.
func decodeSegHeader(b []byte) (segHead, bool) {
	if len(b) < segHeaderSize || binary.LittleEndian.Uint32(b[28:]) != crc32.Checksum(b[:28], blockfmt.Castagnoli) {
		return segHead{}, false
	}
	h := segHead{id: binary.LittleEndian.Uint64(b[8:])}
	switch [8]byte(b[:8]) {
	case segMagic[segV1]:
		h.version = segV1
	case segMagic[segV2]:
		h.version, h.dataBase = segV2, int64(binary.LittleEndian.Uint64(b[16:]))
		if h.dataBase < segHeaderSize || h.dataBase > 1<<50 {
			return segHead{}, false
		}
	default:
		return segHead{}, false
	}
	return h, true
}

// entrySize is the room an entry whose stored block's header and
// provenance take prefix bytes takes: with its head, padded to entryAlign.
func entrySize(prefix int64) int64 {
	return (entryHead + prefix + entryAlign - 1) / entryAlign * entryAlign
}

// encodeEntryHead is the head of an entry whose block is at data.
func encodeEntryHead(data int64) []byte {
	b := make([]byte, entryHead)
	binary.LittleEndian.PutUint64(b, uint64(data))
	binary.LittleEndian.PutUint32(b[12:], crc32.Checksum(b[:12], blockfmt.Castagnoli))
	return b
}

// decodeEntryHead checks an entry's head and returns its block's offset.
func decodeEntryHead(b []byte) (int64, bool) {
	if len(b) < entryHead || binary.LittleEndian.Uint32(b[8:]) != 0 ||
		binary.LittleEndian.Uint32(b[12:]) != crc32.Checksum(b[:12], blockfmt.Castagnoli) {
		return 0, false
	}
	return int64(binary.LittleEndian.Uint64(b)), true
}

// entriesFor is the size of the entry region of a segment that is sealed
// at target bytes and holds blocks of block bytes, whose first entry takes
// first bytes: a budget per block slot (at least twice the first entry),
// rounded up to a whole block when blocks are whole filesystem blocks (the
// case that matters), else to a filesystem block.
func entriesFor(target, block, first int64) int64 {
	slots := max(1, (target+block-1)/block)
	n := segHeaderSize + slots*max(entryBudget, 2*first)
	unit := int64(segPage)
	if block%segPage == 0 {
		unit = block
	}
	return (n + unit - 1) / unit * unit
}

// encodeFooter is segment id's footer (of the given version) listing the
// entries (version 1: records) at offs; entriesEnd is where the entries
// end (version 2 only).
func encodeFooter(version int, id uint64, entriesEnd int64, offs []int64) []byte {
	b := make([]byte, 0, len(offs)*segEntrySize+segFooterFixed(version))
	for _, o := range offs {
		b = binary.LittleEndian.AppendUint64(b, uint64(o))
	}
	if version == segV2 {
		b = binary.LittleEndian.AppendUint64(b, uint64(entriesEnd))
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(offs)))
	b = binary.LittleEndian.AppendUint64(b, id)
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, blockfmt.Castagnoli))
	return append(b, sealMagic[version][:]...)
}

// footerCount reads the last 24 bytes of a footer: the number of offsets
// it lists, when the magic (of the version) and id match.
func footerCount(tail []byte, id uint64, version int) (int, bool) {
	if len(tail) != 24 || [8]byte(tail[16:]) != sealMagic[version] || binary.LittleEndian.Uint64(tail[4:]) != id {
		return 0, false
	}
	return int(binary.LittleEndian.Uint32(tail)), true
}

// decodeFooter checks a whole footer (offsets and fixed part) of segment
// id and returns the offsets and (version 2) the entries' end. Offsets
// ascend from the segment header on, and each leaves room for a stored
// block's header before limit (version 1: where the records end; version
// 2: the data region's start, and the entries' end must be within it).
func decodeFooter(b []byte, id uint64, version int, limit int64) ([]int64, int64, bool) {
	fixed := segFooterFixed(version)
	n := (len(b) - fixed) / segEntrySize
	if len(b) < fixed || n*segEntrySize+fixed != len(b) {
		return nil, 0, false
	}
	tail := b[len(b)-24:]
	if got, ok := footerCount(tail, id, version); !ok || got != n ||
		binary.LittleEndian.Uint32(tail[12:]) != crc32.Checksum(b[:len(b)-12], blockfmt.Castagnoli) {
		return nil, 0, false
	}
	var entriesEnd int64
	minRecord := int64(headerSize)
	if version == segV2 {
		entriesEnd = int64(binary.LittleEndian.Uint64(b[n*segEntrySize:]))
		if entriesEnd < segHeaderSize || entriesEnd > limit {
			return nil, 0, false
		}
		limit, minRecord = entriesEnd, entryHead+headerSize
	}
	offs := make([]int64, n)
	prev := int64(segHeaderSize) - 1
	for i := range offs {
		o := int64(binary.LittleEndian.Uint64(b[i*segEntrySize:]))
		if o <= prev || o > limit-minRecord {
			return nil, 0, false
		}
		offs[i], prev = o, o
	}
	return offs, entriesEnd, true
}

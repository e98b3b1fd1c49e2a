package fs

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"strconv"
	"strings"
)

// The segment layout's files: root/segments/<16-hex id>.seg, ids never
// reused (the next is one past the highest found at start).
//
//	off        size  field
//	  0           8  magic "KVTSEG01"
//	  8           8  segment id, little endian (the file's name)
//	 16          12  zero
//	 28           4  CRC32C of bytes 0..27
//	 32           …  records, back to back: each a stored block exactly as
//	                 a block file holds it (tiers/blockfmt: 160-byte header,
//	                 provenance section, block), so every record carries its
//	                 key, length, CRC32C and provenance
//	end     8 × n    sealed segments only: the footer, n record offsets
//	                 (ascending: the records written whole and live at seal)
//	          4      n
//	          8      segment id
//	          4      CRC32C of the offsets, n and id
//	          8      magic "KVTSEAL1"
//
// A segment without a valid footer was being written when the process
// stopped: the start-up scan walks its records from the header, verifies
// each one's header, provenance and block checksum, truncates the file at
// the first that fails or is short (its torn tail), and seals it.
const (
	segDirName     = "segments"
	segExt         = ".seg"
	segHeaderSize  = 32
	segFooterFixed = 24
	segEntrySize   = 8 // a record's offset in the footer
	// segOverhead is what a segment adds beyond its records and their
	// footer entries.
	segOverhead = segHeaderSize + segFooterFixed
	// DefaultSegmentBytes is the size a segment is sealed at.
	DefaultSegmentBytes = 64 << 20
)

var (
	segMagic  = [8]byte{'K', 'V', 'T', 'S', 'E', 'G', '0', '1'}
	sealMagic = [8]byte{'K', 'V', 'T', 'S', 'E', 'A', 'L', '1'}
)

// segName is segment id's file name.
func segName(id uint64) string { return fmt.Sprintf("%016x%s", id, segExt) }

// parseSegName inverts segName.
func parseSegName(name string) (uint64, bool) {
	base, ok := strings.CutSuffix(name, segExt)
	if !ok || len(base) != 16 || !isLowerHex(base) {
		return 0, false
	}
	id, err := strconv.ParseUint(base, 16, 64)
	return id, err == nil && id > 0
}

// segPath is segment id's file under root.
func segPath(root string, id uint64) string { return filepath.Join(root, segDirName, segName(id)) }

// encodeSegHeader is segment id's header.
func encodeSegHeader(id uint64) []byte {
	b := make([]byte, segHeaderSize)
	copy(b, segMagic[:])
	binary.LittleEndian.PutUint64(b[8:], id)
	binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
	return b
}

// decodeSegHeader checks a segment header and returns its id.
func decodeSegHeader(b []byte) (uint64, bool) {
	if len(b) < segHeaderSize || [8]byte(b[:8]) != segMagic ||
		binary.LittleEndian.Uint32(b[28:]) != crc32.Checksum(b[:28], castagnoli) {
		return 0, false
	}
	return binary.LittleEndian.Uint64(b[8:]), true
}

// encodeFooter is segment id's footer listing offs.
func encodeFooter(id uint64, offs []int64) []byte {
	b := make([]byte, 0, len(offs)*segEntrySize+segFooterFixed)
	for _, o := range offs {
		b = binary.LittleEndian.AppendUint64(b, uint64(o))
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(offs)))
	b = binary.LittleEndian.AppendUint64(b, id)
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	return append(b, sealMagic[:]...)
}

// footerCount reads a footer's fixed tail (its last segFooterFixed bytes):
// the number of offsets before it, when the magic and id match.
func footerCount(tail []byte, id uint64) (int, bool) {
	if len(tail) != segFooterFixed || [8]byte(tail[16:]) != sealMagic || binary.LittleEndian.Uint64(tail[4:]) != id {
		return 0, false
	}
	return int(binary.LittleEndian.Uint32(tail)), true
}

// decodeFooter checks a whole footer (offsets and tail) of a segment whose
// records end where it starts (dataEnd) and returns the offsets.
func decodeFooter(b []byte, id uint64, dataEnd int64) ([]int64, bool) {
	n := (len(b) - segFooterFixed) / segEntrySize
	if len(b) < segFooterFixed || n*segEntrySize+segFooterFixed != len(b) {
		return nil, false
	}
	tail := b[n*segEntrySize:]
	if got, ok := footerCount(tail, id); !ok || got != n ||
		binary.LittleEndian.Uint32(tail[12:]) != crc32.Checksum(b[:n*segEntrySize+12], castagnoli) {
		return nil, false
	}
	offs := make([]int64, n)
	prev := int64(segHeaderSize) - 1
	for i := range offs {
		o := int64(binary.LittleEndian.Uint64(b[i*segEntrySize:]))
		if o <= prev || o+headerSize > dataEnd {
			return nil, false
		}
		offs[i], prev = o, o
	}
	return offs, true
}

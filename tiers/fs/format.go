package fs

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kvtier/kvtier/messages"
)

// On-disk block format, version 1: a fixed 160-byte header, then the block.
//
//	off  size  field
//	  0     4  magic "KVTB"
//	  4     2  format version (1), little endian
//	  6     1  namespace length (≤ 64)
//	  7     1  hash length (1..64)
//	  8     4  group
//	 12     8  block length in bytes
//	 20     4  CRC32C (Castagnoli) of the block
//	 24    64  namespace, zero padded
//	 88    64  hash, zero padded
//	152     4  CRC32C of bytes 0..151
//	156     4  zero
const (
	headerSize    = 160
	formatVersion = 1
	maxNamespace  = 64
	blockExt      = ".blk"
	tmpMarker     = ".tmp."
)

var (
	magic      = [4]byte{'K', 'V', 'T', 'B'}
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

// header is a decoded block header.
type header struct {
	key    messages.Key
	length int64
	sum    uint32
}

func encodeHeader(dst *[headerSize]byte, h header) {
	*dst = [headerSize]byte{}
	copy(dst[0:4], magic[:])
	binary.LittleEndian.PutUint16(dst[4:], formatVersion)
	dst[6], dst[7] = byte(len(h.key.Namespace)), byte(len(h.key.Hash))
	binary.LittleEndian.PutUint32(dst[8:], h.key.Group)
	binary.LittleEndian.PutUint64(dst[12:], uint64(h.length))
	binary.LittleEndian.PutUint32(dst[20:], h.sum)
	copy(dst[24:88], h.key.Namespace)
	copy(dst[88:152], h.key.Hash)
	binary.LittleEndian.PutUint32(dst[152:], crc32.Checksum(dst[:152], castagnoli))
}

func decodeHeader(src []byte) (header, error) {
	bad := func(why string) (header, error) {
		return header{}, fmt.Errorf("%w: header: %s", messages.ErrInvalidBlock, why)
	}
	switch {
	case len(src) < headerSize:
		return bad("short")
	case [4]byte(src[0:4]) != magic:
		return bad("bad magic")
	case binary.LittleEndian.Uint16(src[4:]) != formatVersion:
		return bad(fmt.Sprintf("format version %d", binary.LittleEndian.Uint16(src[4:])))
	case binary.LittleEndian.Uint32(src[152:]) != crc32.Checksum(src[:152], castagnoli):
		return bad("header checksum")
	case binary.LittleEndian.Uint32(src[156:]) != 0:
		return bad("reserved bytes set")
	}
	nsLen, hashLen := int(src[6]), int(src[7])
	if nsLen > maxNamespace || hashLen == 0 || hashLen > messages.MaxHashBytes {
		return bad("field lengths")
	}
	return header{
		key: messages.Key{Namespace: messages.Namespace(src[24 : 24+nsLen]),
			Hash: string(src[88 : 88+hashLen]), Group: binary.LittleEndian.Uint32(src[8:])},
		length: int64(binary.LittleEndian.Uint64(src[12:])),
		sum:    binary.LittleEndian.Uint32(src[20:]),
	}, nil
}

// storable reports whether key fits the format.
func storable(k messages.Key) error {
	if err := k.Validate(); err != nil {
		return err
	}
	if len(k.Namespace) > maxNamespace {
		return fmt.Errorf("%w: namespace of %d bytes (fs tier takes ≤ %d)", messages.ErrBadKey, len(k.Namespace), maxNamespace)
	}
	return nil
}

// nsDir names a namespace's directory: the namespace itself when it is
// lowercase hex (what Layout.Namespace makes), else "x" + its hex encoding.
// Either way only [0-9a-fx] reach the path.
func nsDir(ns messages.Namespace) string {
	if isLowerHex(string(ns)) && ns != "" {
		return string(ns)
	}
	return "x" + hex.EncodeToString([]byte(ns))
}

func parseNSDir(name string) (messages.Namespace, bool) {
	if rest, ok := strings.CutPrefix(name, "x"); ok {
		b, err := hex.DecodeString(rest)
		return messages.Namespace(b), err == nil && len(b) <= maxNamespace
	}
	return messages.Namespace(name), isLowerHex(name) && name != "" && len(name) <= maxNamespace
}

func isLowerHex(s string) bool {
	for i := range len(s) {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// relPath is the key's file, relative to the root.
func relPath(k messages.Key) string {
	h := hex.EncodeToString([]byte(k.Hash))
	return filepath.Join(nsDir(k.Namespace), shardOf(h), h+"-"+strconv.FormatUint(uint64(k.Group), 10)+blockExt)
}

func shardOf(hexHash string) string {
	if len(hexHash) < 2 {
		return "00"
	}
	return hexHash[:2]
}

// parseFileName recovers the hash and group from a block file's name.
func parseFileName(name string) (hash string, group uint32, ok bool) {
	base, found := strings.CutSuffix(name, blockExt)
	if !found {
		return "", 0, false
	}
	h, g, found := strings.Cut(base, "-")
	if !found || !isLowerHex(h) {
		return "", 0, false
	}
	raw, err := hex.DecodeString(h)
	if err != nil || len(raw) == 0 || len(raw) > messages.MaxHashBytes {
		return "", 0, false
	}
	n, err := strconv.ParseUint(g, 10, 32)
	if err != nil {
		return "", 0, false
	}
	return string(raw), uint32(n), true
}

// HeaderSize is the bytes each block file adds to its block: a tier of
// capacity N × (block + HeaderSize) holds N blocks.
const HeaderSize = headerSize

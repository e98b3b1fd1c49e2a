package blockfmt

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"path"
	"strconv"
	"strings"

	"github.com/kvtier/kvtier/messages"
)

// Stored block format. A fixed 160-byte header, then (version 2) a
// provenance section of ProvLen bytes, then the block.
//
//	off  size  field
//	  0     4  magic "KVTB"
//	  4     2  format version (1 or 2), little endian
//	  6     1  namespace length (≤ 64)
//	  7     1  hash length (1..64)
//	  8     4  group
//	 12     8  block length in bytes
//	 20     4  CRC32C (Castagnoli) of the block
//	 24    64  namespace, zero padded
//	 88    64  hash, zero padded
//	152     4  CRC32C of bytes 0..151 (version 2: then of bytes 156..159)
//	156     4  version 1: zero; version 2: provenance section length (≤ MaxProvenance)
//
// Version 1 files (no provenance) are still read; writers write version 2.
// The provenance section (encodeProvenance) carries its own CRC32C.
const (
	HeaderSize   = 160
	Version      = 2
	MaxNamespace = 64
	// Ext ends every block object's name.
	Ext = ".blk"
)

var magic = [4]byte{'K', 'V', 'T', 'B'}

// Castagnoli is the CRC32C table blocks are checksummed with.
var Castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Header is a decoded block header.
type Header struct {
	Key     messages.Key
	Length  int64
	Sum     uint32 // CRC32C of the block
	ProvLen int    // bytes of the provenance section after the header (0: none)
}

// Size is the stored object's size: header, provenance section, block.
func (h Header) Size() int64 { return HeaderSize + int64(h.ProvLen) + h.Length }

// BlockOffset is where the block starts in the stored object.
func (h Header) BlockOffset() int64 { return HeaderSize + int64(h.ProvLen) }

// Encode writes h into dst (version 2).
func Encode(dst *[HeaderSize]byte, h Header) {
	*dst = [HeaderSize]byte{}
	copy(dst[0:4], magic[:])
	binary.LittleEndian.PutUint16(dst[4:], Version)
	dst[6], dst[7] = byte(len(h.Key.Namespace)), byte(len(h.Key.Hash))
	binary.LittleEndian.PutUint32(dst[8:], h.Key.Group)
	binary.LittleEndian.PutUint64(dst[12:], uint64(h.Length))
	binary.LittleEndian.PutUint32(dst[20:], h.Sum)
	copy(dst[24:88], h.Key.Namespace)
	copy(dst[88:152], h.Key.Hash)
	binary.LittleEndian.PutUint32(dst[156:], uint32(h.ProvLen))
	binary.LittleEndian.PutUint32(dst[152:], headerSum(dst[:], Version))
}

// headerSum is the header checksum of a version's header.
func headerSum(src []byte, version uint16) uint32 {
	sum := crc32.Checksum(src[:152], Castagnoli)
	if version >= 2 {
		sum = crc32.Update(sum, Castagnoli, src[156:160])
	}
	return sum
}

// Decode parses and validates a header (magic, version, header checksum,
// field lengths, provenance length). Any failure is ErrInvalidBlock.
func Decode(src []byte) (Header, error) {
	bad := func(why string) (Header, error) {
		return Header{}, fmt.Errorf("%w: header: %s", messages.ErrInvalidBlock, why)
	}
	if len(src) < HeaderSize {
		return bad("short")
	}
	if [4]byte(src[0:4]) != magic {
		return bad("bad magic")
	}
	version := binary.LittleEndian.Uint16(src[4:])
	if version != 1 && version != 2 {
		return bad(fmt.Sprintf("format version %d", version))
	}
	if binary.LittleEndian.Uint32(src[152:]) != headerSum(src, version) {
		return bad("header checksum")
	}
	provLen := binary.LittleEndian.Uint32(src[156:])
	if version == 1 && provLen != 0 {
		return bad("reserved bytes set")
	}
	if provLen > MaxProvenance {
		return bad(fmt.Sprintf("provenance section of %d bytes", provLen))
	}
	nsLen, hashLen := int(src[6]), int(src[7])
	if nsLen > MaxNamespace || hashLen == 0 || hashLen > messages.MaxHashBytes {
		return bad("field lengths")
	}
	return Header{
		Key: messages.Key{Namespace: messages.Namespace(src[24 : 24+nsLen]),
			Hash: string(src[88 : 88+hashLen]), Group: binary.LittleEndian.Uint32(src[8:])},
		Length:  int64(binary.LittleEndian.Uint64(src[12:])),
		Sum:     binary.LittleEndian.Uint32(src[20:]),
		ProvLen: int(provLen),
	}, nil
}

// Prefix is what a writer puts before the block: k's header and, when p
// fits the bounds (messages.Provenance.Validate), its provenance section.
// A provenance that does not fit is left out (dropped reports it): the
// block is stored and served all the same, announced as a placeholder.
func Prefix(k messages.Key, length int, sum uint32, p *messages.Provenance) (prefix []byte, dropped bool) {
	n := ProvenanceSize(p)
	if n < 0 {
		n, dropped = 0, true
	}
	prefix = make([]byte, HeaderSize, HeaderSize+n)
	Encode((*[HeaderSize]byte)(prefix), Header{Key: k, Length: int64(length), Sum: sum, ProvLen: n})
	if n > 0 {
		prefix = appendProvenance(prefix, p)
	}
	return prefix, dropped
}

// Errors of block sizes.
var (
	// ErrSize: a block of no bytes or of more than the tier's bound (a
	// write, refused before anything is stored), or a read into a
	// destination whose length is not the stored block's (the stored copy
	// is sound and stays: it is another namespace's or another caller's
	// geometry, not damage). It is a messages.ErrBadRequest, never an
	// ErrInvalidBlock: nothing is removed for it.
	ErrSize = fmt.Errorf("%w: block size", messages.ErrBadRequest)
)

// MaxBlockBytes bounds a stored block's length whatever a tier's own
// bound: 1 GiB (a peer handshake's bound too).
const MaxBlockBytes = 1 << 30

// AnyLength, as Check's length, checks the key only: a caller that does
// not know the block's length yet (a start-up scan, an announcement).
const AnyLength = -1

// CheckLength checks that a block of n bytes may be stored by a tier whose
// bound is max (ErrSize otherwise).
func CheckLength(n, max int) error {
	if n < 1 || n > max {
		return fmt.Errorf("%w: a block of %d bytes (1..%d stored)", ErrSize, n, max)
	}
	return nil
}

// Check verifies that a decoded header describes k's block, of length
// bytes unless length is AnyLength. Another key is ErrInvalidBlock (the
// copy is not what its name says); a sound copy of another length is
// ErrSize (the destination is wrong, not the copy).
func (h Header) Check(k messages.Key, length int) error {
	switch {
	case h.Key != k || h.Length < 1:
		return fmt.Errorf("%w: %v: stored copy holds %v of %d bytes", messages.ErrInvalidBlock, k, h.Key, h.Length)
	case length != AnyLength && h.Length != int64(length):
		return fmt.Errorf("%w: %v: the stored block is %d bytes, the destination %d", ErrSize, k, h.Length, length)
	}
	return nil
}

// SizeFits reports whether an object of size bytes can be a stored block of
// blockBytes (header, a provenance section within its bound, the block):
// what listings and HEADs can check before the header is read.
func SizeFits(size int64, blockBytes int) bool {
	min := int64(HeaderSize + blockBytes)
	return size >= min && size <= min+MaxProvenance
}

// Fits reports whether an object of size bytes can be a stored block of 1
// to maxBlock bytes: what a listing or a HEAD checks of a tier that stores
// blocks of any size up to its bound.
func Fits(size int64, maxBlock int) bool {
	return size >= HeaderSize+1 && size <= int64(HeaderSize+MaxProvenance)+int64(maxBlock)
}

// Storable reports whether key fits the format.
func Storable(k messages.Key) error {
	if err := k.Validate(); err != nil {
		return err
	}
	if len(k.Namespace) > MaxNamespace {
		return fmt.Errorf("%w: namespace of %d bytes (stored blocks take ≤ %d)", messages.ErrBadKey, len(k.Namespace), MaxNamespace)
	}
	return nil
}

// NSDir names a namespace's directory (or key segment): the namespace
// itself when it is lowercase hex (what Layout.Namespace makes), else "x" +
// its hex encoding. Either way only [0-9a-fx] reach the name.
func NSDir(ns messages.Namespace) string {
	if IsLowerHex(string(ns)) && ns != "" {
		return string(ns)
	}
	return "x" + hex.EncodeToString([]byte(ns))
}

// ParseNSDir inverts NSDir.
func ParseNSDir(name string) (messages.Namespace, bool) {
	if rest, ok := strings.CutPrefix(name, "x"); ok {
		b, err := hex.DecodeString(rest)
		return messages.Namespace(b), err == nil && len(b) <= MaxNamespace
	}
	return messages.Namespace(name), IsLowerHex(name) && name != "" && len(name) <= MaxNamespace
}

// IsLowerHex reports whether s is made of [0-9a-f] only.
func IsLowerHex(s string) bool {
	for i := range len(s) {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// RelPath is k's object name relative to a root or prefix, "/"-separated:
// <namespace dir>/<2-hex shard>/<hex hash>-<group>.blk.
func RelPath(k messages.Key) string {
	h := hex.EncodeToString([]byte(k.Hash))
	return path.Join(NSDir(k.Namespace), ShardOf(h), h+"-"+strconv.FormatUint(uint64(k.Group), 10)+Ext)
}

// ShardOf is the shard directory of a hex hash (or a file name starting
// with one): its first two characters.
func ShardOf(hexHash string) string {
	if len(hexHash) < 2 {
		return "00"
	}
	return hexHash[:2]
}

// ParseFileName recovers the hash and group from a block object's base name.
func ParseFileName(name string) (hash string, group uint32, ok bool) {
	base, found := strings.CutSuffix(name, Ext)
	if !found {
		return "", 0, false
	}
	h, g, found := strings.Cut(base, "-")
	if !found || !IsLowerHex(h) {
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

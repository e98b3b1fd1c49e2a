package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/kvtier/kvtier/rdma"
)

// Wire constants; the layout is documented in doc.go.
const (
	// wireVersion 2: a header carries a (slot, length) pair per block,
	// where version 1 carried one slot size for whole slots.
	wireVersion = 2 // preface version
	metaVersion = 1 // Metadata() encoding version

	prefaceFixed = 6  // magic(4) version(1) node length(1)
	headerFixed  = 20 // token(16) count(4)
	entryBytes   = 8  // per block: dst slot(4) length(4)
	metaFixed    = 10 // version(1) slot bytes(4) slots(4) addr length(1)

	maxNodeID = 255 // node id bytes, bounded by the preface's 1-byte length
	maxAddr   = 255 // advertised address bytes, bounded by the 1-byte length

	ackOK      byte = 0x00 // every payload byte is in the consumer's slots
	ackRefused byte = 0x01 // the transfer was refused (unknown token, wrong peer or slots)
)

// magic opens every data-plane connection ("KVTD").
var magic = [4]byte{'K', 'V', 'T', 'D'}

// errFrame is the decoders' error; it always wraps rdma.ErrProtocol so a
// consumer can count and refuse without inspecting the cause.
var errFrame = fmt.Errorf("malformed frame: %w", rdma.ErrProtocol)

// header is one transfer's fixed header plus its entries: the destination
// slot and the length of each block.
type header struct {
	Token rdma.Token
	Dst   []int
	Lens  []int
}

// appendPreface appends the connection preface for node to b.
func appendPreface(b []byte, node string) []byte {
	b = append(b, magic[:]...)
	b = append(b, wireVersion, byte(len(node)))
	return append(b, node...)
}

// readPreface reads and checks a connection preface. It reads at most
// prefaceFixed+maxNodeID bytes, so nothing it allocates is peer-sized
// beyond that bound.
func readPreface(r io.Reader) (string, error) {
	var fixed [prefaceFixed]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return "", fmt.Errorf("preface: %w", err)
	}
	if [4]byte(fixed[:4]) != magic {
		return "", fmt.Errorf("preface: bad magic %x: %w", fixed[:4], errFrame)
	}
	if fixed[4] != wireVersion {
		return "", fmt.Errorf("preface: version %d, want %d: %w", fixed[4], wireVersion, errFrame)
	}
	n := int(fixed[5])
	if n == 0 {
		return "", fmt.Errorf("preface: empty node id: %w", errFrame)
	}
	node := make([]byte, n)
	if _, err := io.ReadFull(r, node); err != nil {
		return "", fmt.Errorf("preface: node id: %w", noEOF(err))
	}
	return string(node), nil
}

// appendHeader appends one transfer header: the fixed part, then a (dst
// slot, length) pair per block.
func appendHeader(b []byte, tok rdma.Token, dst, lens []int) []byte {
	b = append(b, tok[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(dst)))
	for i, s := range dst {
		b = binary.BigEndian.AppendUint32(b, uint32(s))
		b = binary.BigEndian.AppendUint32(b, uint32(lens[i]))
	}
	return b
}

// decodeHeaderFixed decodes the fixed part of a header. count is checked
// against maxCount (the consumer's pool size) before anyone allocates the
// entry list.
func decodeHeaderFixed(b *[headerFixed]byte, maxCount int) (tok rdma.Token, count int, err error) {
	copy(tok[:], b[:16])
	c := binary.BigEndian.Uint32(b[16:20])
	if c == 0 || uint64(c) > uint64(maxCount) {
		return tok, 0, fmt.Errorf("header: %d slots, want 1..%d: %w", c, maxCount, errFrame)
	}
	return tok, int(c), nil
}

// readEntries reads count (slot, length) pairs into buf (reused across
// transfers) and checks each slot is below limit and each length within
// 1..slotBytes (the consumer's slot size). count must already be bounded.
func readEntries(r io.Reader, count, limit, slotBytes int, buf []byte) (dst, lens []int, _ []byte, err error) {
	if cap(buf) < entryBytes*count {
		buf = make([]byte, entryBytes*count)
	}
	buf = buf[:entryBytes*count]
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, nil, buf, fmt.Errorf("header: entries: %w", noEOF(err))
	}
	dst, lens = make([]int, count), make([]int, count)
	for i := range dst {
		s := binary.BigEndian.Uint32(buf[entryBytes*i:])
		n := binary.BigEndian.Uint32(buf[entryBytes*i+4:])
		if uint64(s) >= uint64(limit) {
			return nil, nil, buf, fmt.Errorf("header: slot %d outside %d slots: %w", s, limit, errFrame)
		}
		if n == 0 || uint64(n) > uint64(slotBytes) {
			return nil, nil, buf, fmt.Errorf("header: entry %d: %d bytes, want 1..%d: %w", i, n, slotBytes, errFrame)
		}
		dst[i], lens[i] = int(s), int(n)
	}
	return dst, lens, buf, nil
}

// readHeader reads a whole header: the form the fuzzer drives. The
// consumer's reader uses the two halves separately so that it can check
// the token before reading the entries.
func readHeader(r io.Reader, maxCount, slotBytes int) (header, error) {
	var fixed [headerFixed]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return header{}, fmt.Errorf("header: %w", err)
	}
	tok, count, err := decodeHeaderFixed(&fixed, maxCount)
	if err != nil {
		return header{}, err
	}
	dst, lens, _, err := readEntries(r, count, maxCount, slotBytes, nil)
	if err != nil {
		return header{}, err
	}
	return header{Token: tok, Dst: dst, Lens: lens}, nil
}

// noEOF turns io.EOF inside a frame into io.ErrUnexpectedEOF: only a
// connection that ends between frames ends cleanly.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// peerMeta is a peer's decoded Metadata(): where to dial it and the
// geometry of its registered pool (so Write can check remote slots).
type peerMeta struct {
	Addr      string
	SlotBytes int
	Slots     int
}

// encodeMeta encodes m (see doc.go, "Metadata").
func encodeMeta(m peerMeta) []byte {
	b := make([]byte, 0, metaFixed+len(m.Addr))
	b = append(b, metaVersion)
	b = binary.BigEndian.AppendUint32(b, uint32(m.SlotBytes))
	b = binary.BigEndian.AppendUint32(b, uint32(m.Slots))
	b = append(b, byte(len(m.Addr)))
	return append(b, m.Addr...)
}

// errMeta marks metadata that cannot be decoded.
var errMeta = errors.New("bad tcp transport metadata")

// decodeMeta decodes and checks a peer's metadata: exact length, known
// version, non-zero geometry, a host:port address.
func decodeMeta(b []byte) (peerMeta, error) {
	if len(b) < metaFixed {
		return peerMeta{}, fmt.Errorf("%w: %d bytes", errMeta, len(b))
	}
	if b[0] != metaVersion {
		return peerMeta{}, fmt.Errorf("%w: version %d, want %d", errMeta, b[0], metaVersion)
	}
	m := peerMeta{
		SlotBytes: int(binary.BigEndian.Uint32(b[1:5])),
		Slots:     int(binary.BigEndian.Uint32(b[5:9])),
	}
	n := int(b[9])
	if len(b) != metaFixed+n {
		return peerMeta{}, fmt.Errorf("%w: %d bytes for a %d-byte address", errMeta, len(b), n)
	}
	m.Addr = string(b[metaFixed:])
	if m.SlotBytes <= 0 || m.Slots <= 0 {
		return peerMeta{}, fmt.Errorf("%w: geometry %d×%d", errMeta, m.Slots, m.SlotBytes)
	}
	if _, _, err := net.SplitHostPort(m.Addr); err != nil {
		return peerMeta{}, fmt.Errorf("%w: address %q: %w", errMeta, m.Addr, err)
	}
	return m, nil
}

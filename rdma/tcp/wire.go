package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"

	"github.com/kvtier/kvtier/rdma"
)

// Wire constants; the layout is documented in doc.go.
const (
	wireVersion = 1 // preface version
	metaVersion = 1 // Metadata() encoding version

	prefaceFixed = 6  // magic(4) version(1) node length(1)
	headerFixed  = 24 // token(16) count(4) slot bytes(4)
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

// header is one transfer's fixed header plus its destination slot list.
type header struct {
	Token     rdma.Token
	SlotBytes int
	Dst       []int
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

// appendHeader appends one transfer header (fixed part and slot list).
func appendHeader(b []byte, tok rdma.Token, slotBytes int, dst []int) []byte {
	b = append(b, tok[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(dst)))
	b = binary.BigEndian.AppendUint32(b, uint32(slotBytes))
	for _, s := range dst {
		b = binary.BigEndian.AppendUint32(b, uint32(s))
	}
	return b
}

// decodeHeaderFixed decodes the fixed part of a header. count is checked
// against maxCount (the consumer's pool size) before anyone allocates the
// slot list.
func decodeHeaderFixed(b *[headerFixed]byte, maxCount int) (tok rdma.Token, count, slotBytes int, err error) {
	copy(tok[:], b[:16])
	c := binary.BigEndian.Uint32(b[16:20])
	sb := binary.BigEndian.Uint32(b[20:24])
	if c == 0 || uint64(c) > uint64(maxCount) {
		return tok, 0, 0, fmt.Errorf("header: %d slots, want 1..%d: %w", c, maxCount, errFrame)
	}
	if sb == 0 || uint64(sb) > math.MaxInt32 {
		return tok, 0, 0, fmt.Errorf("header: slot bytes %d: %w", sb, errFrame)
	}
	return tok, int(c), int(sb), nil
}

// readSlots reads count slot indices into buf (reused across transfers)
// and checks each is below limit. count must already be bounded.
func readSlots(r io.Reader, count, limit int, buf []byte) ([]int, []byte, error) {
	if cap(buf) < 4*count {
		buf = make([]byte, 4*count)
	}
	buf = buf[:4*count]
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, buf, fmt.Errorf("header: slot list: %w", noEOF(err))
	}
	slots := make([]int, count)
	for i := range slots {
		s := binary.BigEndian.Uint32(buf[4*i:])
		if uint64(s) >= uint64(limit) {
			return nil, buf, fmt.Errorf("header: slot %d outside %d slots: %w", s, limit, errFrame)
		}
		slots[i] = int(s)
	}
	return slots, buf, nil
}

// readHeader reads a whole header: the form the fuzzer drives. The
// consumer's reader uses the two halves separately so that it can check
// the token before reading the slot list.
func readHeader(r io.Reader, maxCount int) (header, error) {
	var fixed [headerFixed]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return header{}, fmt.Errorf("header: %w", err)
	}
	tok, count, sb, err := decodeHeaderFixed(&fixed, maxCount)
	if err != nil {
		return header{}, err
	}
	dst, _, err := readSlots(r, count, maxCount, nil)
	if err != nil {
		return header{}, err
	}
	return header{Token: tok, SlotBytes: sb, Dst: dst}, nil
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

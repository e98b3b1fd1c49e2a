package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// A minimal msgpack reader and writer over byte slices. The reader checks
// every type code exactly (an integer field takes an integer, never a float,
// a string or nil) and every length against the caller's bound and against
// what is left of the frame before anything is allocated.
//
// Errors come in two classes: boundError (a length, count or integer above
// its bound: "too_large") and everything else ("malformed").

// errShort: the frame ends inside a value.
var errShort = errors.New("frame truncated")

// boundError is a length, count or integer above its bound.
type boundError struct{ msg string }

func (e *boundError) Error() string { return e.msg }

func overBound(format string, a ...any) error { return &boundError{fmt.Sprintf(format, a...)} }

// maxDepth bounds nesting when skipping values.
const maxDepth = 8

// reader decodes msgpack values from a frame it owns.
type reader struct {
	b   []byte
	off int
}

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errShort
	}
	return r.b[r.off], nil
}

// next returns the next n bytes, aliasing the frame with capacity clipped
// (an append to the result never overwrites what follows it).
func (r *reader) next(n int) ([]byte, error) {
	if n < 0 || n > r.left() {
		return nil, errShort
	}
	p := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return p, nil
}

func (r *reader) be(n int) (uint64, error) {
	p, err := r.next(n)
	if err != nil {
		return 0, err
	}
	var v uint64
	for _, c := range p {
		v = v<<8 | uint64(c)
	}
	return v, nil
}

// isNil reports (and consumes) a nil.
func (r *reader) isNil() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// uint reads a non-negative integer ≤ max, in any msgpack integer encoding.
func (r *reader) uint(max uint64) (uint64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var v uint64
	switch {
	case c <= 0x7f:
		r.off++
		v = uint64(c)
	case c >= 0xcc && c <= 0xcf:
		r.off++
		v, err = r.be(1 << (c - 0xcc))
	case c >= 0xd0 && c <= 0xd3:
		r.off++
		var u uint64
		if u, err = r.be(1 << (c - 0xd0)); err == nil {
			n := signExtend(u, 1<<(c-0xd0))
			if n < 0 {
				return 0, fmt.Errorf("negative integer %d", n)
			}
			v = uint64(n)
		}
	case c >= 0xe0:
		return 0, fmt.Errorf("negative integer %d", int8(c))
	default:
		return 0, fmt.Errorf("want an integer, got %s", codeName(c))
	}
	if err != nil {
		return 0, err
	}
	if v > max {
		return 0, overBound("integer %d above its bound %d", v, max)
	}
	return v, nil
}

// int reads a signed integer within [min, max].
func (r *reader) int(min, max int64) (int64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var v int64
	switch {
	case c <= 0x7f || c >= 0xe0:
		r.off++
		v = int64(int8(c))
	case c >= 0xd0 && c <= 0xd3:
		r.off++
		u, err := r.be(1 << (c - 0xd0))
		if err != nil {
			return 0, err
		}
		v = signExtend(u, 1<<(c-0xd0))
	case c >= 0xcc && c <= 0xcf:
		u, err := r.uint(math.MaxUint64)
		if err != nil {
			return 0, err
		}
		if u > math.MaxInt64 {
			return 0, overBound("integer %d out of range [%d, %d]", u, min, max)
		}
		v = int64(u)
	default:
		return 0, fmt.Errorf("want an integer, got %s", codeName(c))
	}
	if v < min || v > max {
		return 0, overBound("integer %d out of range [%d, %d]", v, min, max)
	}
	return v, nil
}

func signExtend(u uint64, n int) int64 {
	shift := 64 - 8*n
	return int64(u<<shift) >> shift
}

func (r *reader) bool() (bool, error) {
	c, err := r.peek()
	if err != nil {
		return false, err
	}
	switch c {
	case 0xc2:
		r.off++
		return false, nil
	case 0xc3:
		r.off++
		return true, nil
	}
	return false, fmt.Errorf("want a bool, got %s", codeName(c))
}

// strBytes reads a str of at most max bytes, aliasing the frame.
func (r *reader) strBytes(max int) ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf:
		r.off++
		n = uint64(c & 0x1f)
	case c >= 0xd9 && c <= 0xdb:
		r.off++
		if n, err = r.be(1 << (c - 0xd9)); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("want a string, got %s", codeName(c))
	}
	if n > uint64(max) {
		return nil, overBound("string of %d bytes (max %d)", n, max)
	}
	return r.next(int(n))
}

// str reads a string of at most max bytes.
func (r *reader) str(max int) (string, error) {
	p, err := r.strBytes(max)
	return string(p), err
}

// bin reads a byte string of at most max bytes, aliasing the frame.
func (r *reader) bin(max int) ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	if c < 0xc4 || c > 0xc6 {
		return nil, fmt.Errorf("want bytes (bin), got %s", codeName(c))
	}
	r.off++
	n, err := r.be(1 << (c - 0xc4))
	if err != nil {
		return nil, err
	}
	if n > uint64(max) {
		return nil, overBound("bytes of length %d (max %d)", n, max)
	}
	return r.next(int(n))
}

// binExact reads a byte string of exactly n bytes.
func (r *reader) binExact(n int) ([]byte, error) {
	p, err := r.bin(math.MaxInt32)
	if err != nil {
		return nil, err
	}
	if len(p) != n {
		return nil, fmt.Errorf("bytes of length %d (want exactly %d)", len(p), n)
	}
	return p, nil
}

// arrayLen reads an array header of at most max elements; each element
// takes at least minBytes bytes, so a length beyond the frame is refused
// before the caller allocates for it.
func (r *reader) arrayLen(max, minBytes int) (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x90 && c <= 0x9f:
		r.off++
		n = uint64(c & 0x0f)
	case c == 0xdc || c == 0xdd:
		r.off++
		if n, err = r.be(2 << (c - 0xdc)); err != nil {
			return 0, err
		}
	default:
		return 0, fmt.Errorf("want an array, got %s", codeName(c))
	}
	if n > uint64(max) {
		return 0, overBound("array of %d elements (max %d)", n, max)
	}
	if n*uint64(minBytes) > uint64(r.left()) {
		return 0, errShort
	}
	return int(n), nil
}

// mapLen reads a map header of at most max entries.
func (r *reader) mapLen(max int) (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x80 && c <= 0x8f:
		r.off++
		n = uint64(c & 0x0f)
	case c == 0xde || c == 0xdf:
		r.off++
		if n, err = r.be(2 << (c - 0xde)); err != nil {
			return 0, err
		}
	default:
		return 0, fmt.Errorf("want a map, got %s", codeName(c))
	}
	if n > uint64(max) {
		return 0, overBound("map of %d entries (max %d)", n, max)
	}
	if 2*n > uint64(r.left()) {
		return 0, errShort
	}
	return int(n), nil
}

// skip steps over one value of any type (extension types and floats
// included: a newer peer may send them in fields this version skips).
// Every length is checked against the frame, so skipping is O(frame).
func (r *reader) skip(depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("values nested deeper than %d", maxDepth)
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	fixed := func(n int) error { r.off++; _, err := r.next(n); return err }
	sized := func(lenBytes, extra int) error {
		r.off++
		n, err := r.be(lenBytes)
		if err != nil {
			return err
		}
		if n > uint64(r.left()) {
			return errShort
		}
		_, err = r.next(int(n) + extra)
		return err
	}
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		r.off++
		return nil
	case c >= 0xcc && c <= 0xcf:
		return fixed(1 << (c - 0xcc))
	case c >= 0xd0 && c <= 0xd3:
		return fixed(1 << (c - 0xd0))
	case c == 0xca:
		return fixed(4)
	case c == 0xcb:
		return fixed(8)
	case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16: type byte + data
		return fixed(1 + 1<<(c-0xd4))
	case c >= 0xc7 && c <= 0xc9: // ext 8, 16, 32: length, type byte, data
		return sized(1<<(c-0xc7), 1)
	case c >= 0xa0 && c <= 0xbf:
		return fixed(int(c & 0x1f))
	case c >= 0xd9 && c <= 0xdb:
		return sized(1<<(c-0xd9), 0)
	case c >= 0xc4 && c <= 0xc6:
		return sized(1<<(c-0xc4), 0)
	case c >= 0x90 && c <= 0x9f, c == 0xdc, c == 0xdd:
		n, err := r.arrayLen(math.MaxInt32, 1)
		if err != nil {
			return err
		}
		for range n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		n, err := r.mapLen(math.MaxInt32)
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("invalid msgpack type code %s", codeName(c))
}

// codeName names a type code for error messages.
func codeName(c byte) string {
	switch {
	case c <= 0x7f, c >= 0xe0, c >= 0xcc && c <= 0xd3:
		return "an integer"
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		return "a map"
	case c >= 0x90 && c <= 0x9f, c == 0xdc, c == 0xdd:
		return "an array"
	case c >= 0xa0 && c <= 0xbf, c >= 0xd9 && c <= 0xdb:
		return "a string"
	case c == 0xc0:
		return "nil"
	case c == 0xc2, c == 0xc3:
		return "a bool"
	case c >= 0xc4 && c <= 0xc6:
		return "bytes"
	case c == 0xca, c == 0xcb:
		return "a float"
	case c >= 0xc7 && c <= 0xc9, c >= 0xd4 && c <= 0xd8:
		return "an extension"
	}
	return fmt.Sprintf("0x%02x", c)
}

// writer appends msgpack values to a buffer.
type writer struct{ b []byte }

func (w *writer) nil_() { w.b = append(w.b, 0xc0) }

func (w *writer) bool(v bool) {
	if v {
		w.b = append(w.b, 0xc3)
	} else {
		w.b = append(w.b, 0xc2)
	}
}

func (w *writer) uint(v uint64) {
	switch {
	case v <= 0x7f:
		w.b = append(w.b, byte(v))
	case v <= math.MaxUint8:
		w.b = append(w.b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xce), uint32(v))
	default:
		w.b = binary.BigEndian.AppendUint64(append(w.b, 0xcf), v)
	}
}

func (w *writer) int(v int64) {
	switch {
	case v >= 0:
		w.uint(uint64(v))
	case v >= -32:
		w.b = append(w.b, byte(int8(v)))
	case v >= math.MinInt8:
		w.b = append(w.b, 0xd0, byte(int8(v)))
	case v >= math.MinInt16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xd1), uint16(int16(v)))
	case v >= math.MinInt32:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xd2), uint32(int32(v)))
	default:
		w.b = binary.BigEndian.AppendUint64(append(w.b, 0xd3), uint64(v))
	}
}

func (w *writer) str(s string) {
	n := len(s)
	switch {
	case n <= 31:
		w.b = append(w.b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		w.b = append(w.b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xda), uint16(n))
	default:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xdb), uint32(n))
	}
	w.b = append(w.b, s...)
}

func (w *writer) binHeader(n int) {
	switch {
	case n <= math.MaxUint8:
		w.b = append(w.b, 0xc4, byte(n))
	case n <= math.MaxUint16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xc5), uint16(n))
	default:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xc6), uint32(n))
	}
}

func (w *writer) bin(p []byte) {
	w.binHeader(len(p))
	w.b = append(w.b, p...)
}

func (w *writer) arrayLen(n int) {
	switch {
	case n <= 15:
		w.b = append(w.b, 0x90|byte(n))
	case n <= math.MaxUint16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xdc), uint16(n))
	default:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xdd), uint32(n))
	}
}

func (w *writer) mapLen(n int) {
	switch {
	case n <= 15:
		w.b = append(w.b, 0x80|byte(n))
	case n <= math.MaxUint16:
		w.b = binary.BigEndian.AppendUint16(append(w.b, 0xde), uint16(n))
	default:
		w.b = binary.BigEndian.AppendUint32(append(w.b, 0xdf), uint32(n))
	}
}

// Package msgp is the one strict msgpack core under kvtier's wire codecs
// (peer/wire, scheduler/wire): a Reader that checks every type code exactly
// (an integer field takes an integer, never a float, a string or nil) and
// every length against the caller's bound and against what is left of the
// frame before anything is allocated, and a Writer that always picks the
// smallest encoding. It owns no state beyond the frame it is handed and
// knows nothing of any message, but for the provenance fields both
// protocols carry alike (prov.go).
package msgp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Errors come in two classes: *BoundError (a length, count or integer above
// its bound) and everything else (malformed), ErrShort among them.

// ErrShort: the frame ends inside a value.
var ErrShort = errors.New("frame truncated")

// BoundError is a length, count or integer above its bound.
type BoundError struct{ msg string }

func (e *BoundError) Error() string { return e.msg }

// OverBound makes a BoundError.
func OverBound(format string, a ...any) error { return &BoundError{fmt.Sprintf(format, a...)} }

// MaxDepth bounds nesting when skipping values.
const MaxDepth = 8

// Reader decodes msgpack values from B, from Off on. Values it returns as
// byte slices alias B with their capacity clipped (an append to one never
// overwrites what follows it); a caller that keeps them past B's life
// copies B first.
type Reader struct {
	B   []byte
	Off int
}

func (r *Reader) Left() int { return len(r.B) - r.Off }

func (r *Reader) Peek() (byte, error) {
	if r.Off >= len(r.B) {
		return 0, ErrShort
	}
	return r.B[r.Off], nil
}

// next returns the next n bytes, aliasing the frame with capacity clipped
// (an append to the result never overwrites what follows it).
func (r *Reader) Next(n int) ([]byte, error) {
	if n < 0 || n > r.Left() {
		return nil, ErrShort
	}
	p := r.B[r.Off : r.Off+n : r.Off+n]
	r.Off += n
	return p, nil
}

func (r *Reader) BE(n int) (uint64, error) {
	p, err := r.Next(n)
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
func (r *Reader) IsNil() bool {
	if r.Off < len(r.B) && r.B[r.Off] == 0xc0 {
		r.Off++
		return true
	}
	return false
}

// uint reads a non-negative integer ≤ max, in any msgpack integer encoding.
func (r *Reader) Uint(max uint64) (uint64, error) {
	c, err := r.Peek()
	if err != nil {
		return 0, err
	}
	var v uint64
	switch {
	case c <= 0x7f:
		r.Off++
		v = uint64(c)
	case c >= 0xcc && c <= 0xcf:
		r.Off++
		v, err = r.BE(1 << (c - 0xcc))
	case c >= 0xd0 && c <= 0xd3:
		r.Off++
		var u uint64
		if u, err = r.BE(1 << (c - 0xd0)); err == nil {
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
		return 0, OverBound("integer %d above its bound %d", v, max)
	}
	return v, nil
}

// int reads a signed integer within [min, max].
func (r *Reader) Int(min, max int64) (int64, error) {
	c, err := r.Peek()
	if err != nil {
		return 0, err
	}
	var v int64
	switch {
	case c <= 0x7f || c >= 0xe0:
		r.Off++
		v = int64(int8(c))
	case c >= 0xd0 && c <= 0xd3:
		r.Off++
		u, err := r.BE(1 << (c - 0xd0))
		if err != nil {
			return 0, err
		}
		v = signExtend(u, 1<<(c-0xd0))
	case c >= 0xcc && c <= 0xcf:
		u, err := r.Uint(math.MaxUint64)
		if err != nil {
			return 0, err
		}
		if u > math.MaxInt64 {
			return 0, OverBound("integer %d out of range [%d, %d]", u, min, max)
		}
		v = int64(u)
	default:
		return 0, fmt.Errorf("want an integer, got %s", codeName(c))
	}
	if v < min || v > max {
		return 0, OverBound("integer %d out of range [%d, %d]", v, min, max)
	}
	return v, nil
}

func signExtend(u uint64, n int) int64 {
	shift := 64 - 8*n
	return int64(u<<shift) >> shift
}

func (r *Reader) Bool() (bool, error) {
	c, err := r.Peek()
	if err != nil {
		return false, err
	}
	switch c {
	case 0xc2:
		r.Off++
		return false, nil
	case 0xc3:
		r.Off++
		return true, nil
	}
	return false, fmt.Errorf("want a bool, got %s", codeName(c))
}

// strBytes reads a str of at most max bytes, aliasing the frame.
func (r *Reader) StrBytes(max int) ([]byte, error) {
	c, err := r.Peek()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf:
		r.Off++
		n = uint64(c & 0x1f)
	case c >= 0xd9 && c <= 0xdb:
		r.Off++
		if n, err = r.BE(1 << (c - 0xd9)); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("want a string, got %s", codeName(c))
	}
	if n > uint64(max) {
		return nil, OverBound("string of %d bytes (max %d)", n, max)
	}
	return r.Next(int(n))
}

// str reads a string of at most max bytes.
func (r *Reader) Str(max int) (string, error) {
	p, err := r.StrBytes(max)
	return string(p), err
}

// bin reads a byte string of at most max bytes, aliasing the frame.
func (r *Reader) Bin(max int) ([]byte, error) {
	c, err := r.Peek()
	if err != nil {
		return nil, err
	}
	if c < 0xc4 || c > 0xc6 {
		return nil, fmt.Errorf("want bytes (bin), got %s", codeName(c))
	}
	r.Off++
	n, err := r.BE(1 << (c - 0xc4))
	if err != nil {
		return nil, err
	}
	if n > uint64(max) {
		return nil, OverBound("bytes of length %d (max %d)", n, max)
	}
	return r.Next(int(n))
}

// binExact reads a byte string of exactly n bytes.
func (r *Reader) BinExact(n int) ([]byte, error) {
	p, err := r.Bin(math.MaxInt32)
	if err != nil {
		return nil, err
	}
	if len(p) != n {
		return nil, fmt.Errorf("bytes of length %d (want exactly %d)", len(p), n)
	}
	return p, nil
}

// ArrayLen reads an array header of at most max elements; each element
// takes at least minBytes bytes, so a length beyond the frame is refused
// before the caller allocates for it.
func (r *Reader) ArrayLen(max, minBytes int) (int, error) {
	n, err := r.containerLen(0x90, 0xdc, "an array")
	if err != nil {
		return 0, err
	}
	if n > uint64(max) {
		return 0, OverBound("array of %d elements (max %d)", n, max)
	}
	if n*uint64(minBytes) > uint64(r.Left()) {
		return 0, ErrShort
	}
	return int(n), nil
}

// MapLen reads a map header of at most max entries.
func (r *Reader) MapLen(max int) (int, error) {
	n, err := r.containerLen(0x80, 0xde, "a map")
	if err != nil {
		return 0, err
	}
	if n > uint64(max) {
		return 0, OverBound("map of %d entries (max %d)", n, max)
	}
	if 2*n > uint64(r.Left()) {
		return 0, ErrShort
	}
	return int(n), nil
}

// containerLen reads the length of an array or a map header: fix is the
// fixarray/fixmap code (0x90, 0x80), c16 the 16-bit form's (0xdc, 0xde),
// and the 32-bit form's code follows c16.
func (r *Reader) containerLen(fix, c16 byte, what string) (uint64, error) {
	c, err := r.Peek()
	if err != nil {
		return 0, err
	}
	switch {
	case c >= fix && c <= fix|0x0f:
		r.Off++
		return uint64(c & 0x0f), nil
	case c == c16 || c == c16+1:
		r.Off++
		return r.BE(2 << (c - c16))
	}
	return 0, fmt.Errorf("want %s, got %s", what, codeName(c))
}

// skip steps over one value of any type (extension types and floats
// included: a newer peer may send them in fields this version skips).
// Every length is checked against the frame, so skipping is O(frame).
func (r *Reader) Skip(depth int) error {
	if depth > MaxDepth {
		return fmt.Errorf("values nested deeper than %d", MaxDepth)
	}
	c, err := r.Peek()
	if err != nil {
		return err
	}
	fixed := func(n int) error { r.Off++; _, err := r.Next(n); return err }
	sized := func(lenBytes, extra int) error {
		r.Off++
		n, err := r.BE(lenBytes)
		if err != nil {
			return err
		}
		if n > uint64(r.Left()) {
			return ErrShort
		}
		_, err = r.Next(int(n) + extra)
		return err
	}
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		r.Off++
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
		n, err := r.ArrayLen(math.MaxInt32, 1)
		if err != nil {
			return err
		}
		for range n {
			if err := r.Skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		n, err := r.MapLen(math.MaxInt32)
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := r.Skip(depth + 1); err != nil {
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

// Writer appends msgpack values to B.
type Writer struct{ B []byte }

func (w *Writer) Nil() { w.B = append(w.B, 0xc0) }

func (w *Writer) Bool(v bool) {
	if v {
		w.B = append(w.B, 0xc3)
	} else {
		w.B = append(w.B, 0xc2)
	}
}

func (w *Writer) Uint(v uint64) {
	switch {
	case v <= 0x7f:
		w.B = append(w.B, byte(v))
	case v <= math.MaxUint8:
		w.B = append(w.B, 0xcc, byte(v))
	case v <= math.MaxUint16:
		w.B = binary.BigEndian.AppendUint16(append(w.B, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		w.B = binary.BigEndian.AppendUint32(append(w.B, 0xce), uint32(v))
	default:
		w.B = binary.BigEndian.AppendUint64(append(w.B, 0xcf), v)
	}
}

func (w *Writer) Int(v int64) {
	switch {
	case v >= 0:
		w.Uint(uint64(v))
	case v >= -32:
		w.B = append(w.B, byte(int8(v)))
	case v >= math.MinInt8:
		w.B = append(w.B, 0xd0, byte(int8(v)))
	case v >= math.MinInt16:
		w.B = binary.BigEndian.AppendUint16(append(w.B, 0xd1), uint16(int16(v)))
	case v >= math.MinInt32:
		w.B = binary.BigEndian.AppendUint32(append(w.B, 0xd2), uint32(int32(v)))
	default:
		w.B = binary.BigEndian.AppendUint64(append(w.B, 0xd3), uint64(v))
	}
}

func (w *Writer) Str(s string) {
	if n := len(s); n <= 31 {
		w.B = append(w.B, 0xa0|byte(n))
	} else {
		w.sizedHeader(n, 0xd9)
	}
	w.B = append(w.B, s...)
}

func (w *Writer) BinHeader(n int) { w.sizedHeader(n, 0xc4) }

// sizedHeader writes a str or bin header in its 8-, 16- or 32-bit length
// form: c8 is the 8-bit form's code (str8 0xd9, bin8 0xc4), and the 16- and
// 32-bit forms' codes follow it.
func (w *Writer) sizedHeader(n int, c8 byte) {
	switch {
	case n <= math.MaxUint8:
		w.B = append(w.B, c8, byte(n))
	case n <= math.MaxUint16:
		w.B = binary.BigEndian.AppendUint16(append(w.B, c8+1), uint16(n))
	default:
		w.B = binary.BigEndian.AppendUint32(append(w.B, c8+2), uint32(n))
	}
}

func (w *Writer) Bin(p []byte) {
	w.BinHeader(len(p))
	w.B = append(w.B, p...)
}

func (w *Writer) ArrayLen(n int) { w.containerHeader(n, 0x90, 0xdc) }

func (w *Writer) MapLen(n int) { w.containerHeader(n, 0x80, 0xde) }

// containerHeader writes an array or map header of n entries: fix is the
// fixarray/fixmap code, c16 the 16-bit form's (the 32-bit form's follows).
func (w *Writer) containerHeader(n int, fix, c16 byte) {
	switch {
	case n <= 15:
		w.B = append(w.B, fix|byte(n))
	case n <= math.MaxUint16:
		w.B = binary.BigEndian.AppendUint16(append(w.B, c16), uint16(n))
	default:
		w.B = binary.BigEndian.AppendUint32(append(w.B, c16+1), uint32(n))
	}
}

// BinString writes s as bytes (bin), not as a str.
func (w *Writer) BinString(s string) {
	w.BinHeader(len(s))
	w.B = append(w.B, s...)
}

// Optional map entries: a field left at its zero value is omitted, never
// written as an empty value. Count counts the entries that are present, for
// the MapLen written before them.

// Count returns how many of set are true.
func Count(set ...bool) int {
	n := 0
	for _, on := range set {
		if on {
			n++
		}
	}
	return n
}

// OptStr writes the entry name: v unless v is empty.
func (w *Writer) OptStr(name, v string) { opt(w, name, v, v != "", w.Str) }

// OptUint writes the entry name: v unless v is 0.
func (w *Writer) OptUint(name string, v uint64) { opt(w, name, v, v != 0, w.Uint) }

// OptInt writes the entry name: v unless v is 0.
func (w *Writer) OptInt(name string, v int64) { opt(w, name, v, v != 0, w.Int) }

// OptBin writes the entry name: v unless v is empty.
func (w *Writer) OptBin(name string, v []byte) { opt(w, name, v, len(v) > 0, w.Bin) }

// OptStrs writes the entry name: v unless v is empty.
func (w *Writer) OptStrs(name string, v []string) { opt(w, name, v, len(v) > 0, w.Strs) }

func opt[T any](w *Writer, name string, v T, present bool, write func(T)) {
	if present {
		w.Str(name)
		write(v)
	}
}

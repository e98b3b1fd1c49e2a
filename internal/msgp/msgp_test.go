package msgp

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

func TestRoundTripPicksExactTypes(t *testing.T) {
	var w Writer
	w.ArrayLen(7)
	w.Uint(300)
	w.Int(-40000)
	w.Str("ns")
	w.Bin([]byte{1, 2, 3})
	w.BinString("xy")
	w.Bool(true)
	w.Nil()
	r := Reader{B: w.B}
	n, err := r.ArrayLen(7, 1)
	require.NoError(t, err)
	assert.Equal(t, 7, n)
	u, err := r.Uint(300)
	require.NoError(t, err)
	assert.Equal(t, uint64(300), u)
	i, err := r.Int(math.MinInt32, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(-40000), i)
	s, err := r.Str(2)
	require.NoError(t, err)
	assert.Equal(t, "ns", s)
	b, err := r.Bin(3)
	require.NoError(t, err)
	assert.Equal(t, []byte{1, 2, 3}, b)
	assert.Equal(t, len(b), cap(b), "a slice of the frame cannot be appended over what follows")
	b, err = r.BinExact(2)
	require.NoError(t, err)
	assert.Equal(t, "xy", string(b))
	v, err := r.Bool()
	require.NoError(t, err)
	assert.True(t, v)
	assert.True(t, r.IsNil())
	assert.Zero(t, r.Left())
}

func TestBoundsAndTypesAreRefused(t *testing.T) {
	var w Writer
	w.Uint(301)
	_, err := (&Reader{B: w.B}).Uint(300)
	var be *BoundError
	assert.True(t, errors.As(err, &be), "above its bound: a BoundError")

	_, err = (&Reader{B: w.B}).Str(10)
	assert.ErrorContains(t, err, "want a string, got an integer")
	assert.False(t, errors.As(err, &be), "a wrong type is malformed, not out of bounds")

	// An array that claims more elements than the frame can hold is refused
	// before anyone allocates for them.
	_, err = (&Reader{B: []byte{0xdd, 0x7f, 0xff, 0xff, 0xff}}).ArrayLen(math.MaxInt32, 1)
	assert.ErrorIs(t, err, ErrShort)
}

func FuzzSkip(f *testing.F) {
	var w Writer
	w.MapLen(2)
	w.Str("k")
	w.ArrayLen(2)
	w.Int(-1)
	w.Bin([]byte("v"))
	w.Str("e")
	w.B = append(w.B, 0xd4, 1, 2) // fixext 1
	f.Add(w.B)
	f.Fuzz(func(t *testing.T, b []byte) {
		r := Reader{B: b}
		if err := r.Skip(0); err == nil && (r.Off == 0 || r.Off > len(b)) {
			t.Fatalf("skipped %d bytes of %d", r.Off, len(b))
		}
	})
}

// The writer's headers agree byte for byte with an independent msgpack
// encoder (the one vLLM-compatible events are decoded with) at every length
// where the encoding changes form, and the reader takes them back.
func TestHeadersMatchAnIndependentEncoderAtEveryFormBoundary(t *testing.T) {
	other := func(encode func(*msgpack.Encoder) error) []byte {
		var buf bytes.Buffer
		enc := msgpack.NewEncoder(&buf)
		enc.UseCompactInts(true)
		require.NoError(t, encode(enc))
		return buf.Bytes()
	}
	for _, n := range []int{0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536} {
		s := strings.Repeat("x", n)
		var w Writer
		w.Str(s)
		require.Equal(t, other(func(e *msgpack.Encoder) error { return e.EncodeString(s) }), w.B, "str of %d bytes", n)
		got, err := (&Reader{B: w.B}).Str(n)
		require.NoError(t, err)
		require.Equal(t, s, got)

		w = Writer{}
		w.Bin([]byte(s))
		require.Equal(t, other(func(e *msgpack.Encoder) error { return e.EncodeBytes([]byte(s)) }), w.B, "bin of %d bytes", n)

		w = Writer{}
		w.ArrayLen(n)
		require.Equal(t, other(func(e *msgpack.Encoder) error { return e.EncodeArrayLen(n) }), w.B, "array of %d", n)
		w = Writer{}
		w.MapLen(n)
		require.Equal(t, other(func(e *msgpack.Encoder) error { return e.EncodeMapLen(n) }), w.B, "map of %d", n)
	}
}

func TestOptionalEntriesAreWrittenOnlyWhenSetAndCounted(t *testing.T) {
	var w Writer
	set := []bool{true, false, true, false, true}
	w.MapLen(Count(set...))
	w.OptStr("a", "x")
	w.OptStr("skipped", "")
	w.OptUint("b", 7)
	w.OptInt("skipped", 0)
	w.OptStrs("c", []string{"y"})
	w.OptBin("skipped", nil)
	var got map[string]any
	require.NoError(t, msgpack.Unmarshal(w.B, &got))
	assert.Equal(t, map[string]any{"a": "x", "b": int8(7), "c": []any{"y"}}, got)
}

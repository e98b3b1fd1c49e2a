package wire

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// fuzzSeeds: every valid frame encoded, truncations of each, frames of
// other versions, and a few hostile headers. A crasher the fuzzer finds is
// written by go test under this package's testdata, to be committed as a
// regression seed (none so far).
func fuzzSeeds() [][]byte {
	var seeds [][]byte
	for _, f := range validFrames() {
		b, err := Encode(f)
		if err != nil {
			panic(err)
		}
		seeds = append(seeds, b, b[:len(b)-1], b[:len(b)/2], b[:1])
	}
	future := kv{"v", Version + 1, "op", "hello", "e", 77, "node", "z", "caps", []any{kv{"x", 1.5}}, "ext", rawBin{0xd4, 1, 2}}
	return append(seeds, raw(future), raw(with(future, "op", "welcome")), raw(with(future, "op", "ping")),
		[]byte{}, []byte{0x80}, []byte{0xdf, 0xff, 0xff, 0xff, 0xff},
		raw(kv{"v", Version, "op", "lookup", "e", 1, "round", 1, "keys", rawBin{0xdd, 0x7f, 0xff, 0xff, 0xff}}))
}

// FuzzDecode: no input panics or hangs; every error is an *Error with a
// known label; a frame comes with an error only for another version's
// Hello/Welcome; whatever decodes re-encodes to a frame that decodes to an
// equal value (and re-encodes to the same bytes).
func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := Decode(b)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			switch Reason(err) {
			case ReasonMalformed, ReasonTooLarge, ReasonUnknownOp, ReasonVersion:
			default:
				t.Fatalf("label %q for %v", Reason(err), err)
			}
			if fr == nil {
				return
			}
			require.ErrorIs(t, err, ErrVersion)
			switch h := fr.(type) {
			case *Hello:
				require.NotEqual(t, Version, h.Version)
				require.NoError(t, checkNode(h.Node))
			case *Welcome:
				require.NotEqual(t, Version, h.Version)
				require.NoError(t, checkNode(h.Node))
			default:
				t.Fatalf("frame %T with error %v", fr, err)
			}
			return
		}
		out, err := Encode(fr)
		if err != nil {
			t.Fatalf("decoded %#v does not re-encode: %v", fr, err)
		}
		again, err := Decode(out)
		if err != nil {
			t.Fatalf("re-encoded frame does not decode: %v", err)
		}
		require.Equal(t, fr, again)
		out2, err := Encode(again)
		require.NoError(t, err)
		require.Equal(t, out, out2)
	})
}

package wire

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"
)

// The session keys and the first seal of the golden Ping under the fixed
// handshake, computed by an independent (Python) implementation of
// docs/PROTOCOL.md ("Sealed frames").
func TestSealGolden(t *testing.T) {
	dialer, listener := SessionKeys(secret, testHello(), testWelcome())
	require.Equal(t, "c8c696a9f05c7f9b1c40703ca809f58ea0561b7d81b785b5829406e6b7e0b381", hex.EncodeToString(dialer))
	require.Equal(t, "43d4fbf86916e5eeee82b73a24756c399911d0a0c8b47bd83f3675d6b0b3a9a6", hex.EncodeToString(listener))
	ping, err := Encode(&Ping{Epoch: 7, Seq: 1})
	require.NoError(t, err)
	require.Equal(t, "00000000000000017ab6eb76310169787cbf13395c94cf31", hex.EncodeToString(NewSealer(dialer).Seal(ping)))
}

func TestOpenRefusesForgedReplayedCrossSessionAndUnsealedFrames(t *testing.T) {
	dialer, listener := SessionKeys(secret, testHello(), testWelcome())
	other := testHello()
	other.Nonce = fill(NonceBytes, 0x11) // another session: same nodes, another handshake
	otherDialer, _ := SessionKeys(secret, other, testWelcome())
	frame := func(seq uint64) []byte {
		b, err := Encode(&Ping{Epoch: 7, Seq: seq})
		require.NoError(t, err)
		return b
	}
	s, o := NewSealer(dialer), NewOpener(dialer)
	f1, f2, f3 := frame(1), frame(2), frame(3)
	seal1, seal2, seal3 := s.Seal(f1), s.Seal(f2), s.Seal(f3)

	require.NoError(t, o.Open(f1, seal1))
	require.ErrorIs(t, o.Open(f1, seal1), ErrReplayed, "the same frame again")
	require.ErrorIs(t, o.Open(f2, seal3), ErrBadSeal, "another frame's seal")
	tampered := append([]byte(nil), f3...)
	tampered[len(tampered)-1] ^= 1
	require.ErrorIs(t, o.Open(tampered, seal3), ErrBadSeal, "a flipped bit")
	require.ErrorIs(t, o.Open(f3, seal3[:SealBytes-1]), ErrBadSeal, "a short seal")
	require.ErrorIs(t, o.Open(f3, nil), ErrUnsealed)
	require.ErrorIs(t, o.Open(f3, NewSealer(otherDialer).Seal(f3)), ErrBadSeal, "sealed in another session")
	require.ErrorIs(t, o.Open(f3, NewSealer(listener).Seal(f3)), ErrBadSeal, "sealed by the other side")
	require.NoError(t, o.Open(f3, seal3), "refusals change nothing: a gap in the counter is fine")
	require.ErrorIs(t, o.Open(f2, seal2), ErrReplayed, "an older counter after a newer one")

	require.Equal(t, "bad_seal", SealReason(ErrBadSeal))
	require.Equal(t, "replayed_frame", SealReason(ErrReplayed))
	require.Equal(t, "unsealed_frame", SealReason(ErrUnsealed))
}

// FuzzOpen: no seal and frame panics the opener, and only the sealer's own
// seals of the frame open.
func FuzzOpen(f *testing.F) {
	dialer, _ := SessionKeys(secret, testHello(), testWelcome())
	ping, _ := Encode(&Ping{Epoch: 7, Seq: 1})
	f.Add(ping, NewSealer(dialer).Seal(ping))
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, b, seal []byte) {
		o := NewOpener(dialer)
		if err := o.Open(b, seal); err == nil {
			s := NewSealer(dialer)
			s.n = o.last - 1
			require.Equal(t, s.Seal(b), seal, "a seal that opens is the sealer's")
		}
	})
}

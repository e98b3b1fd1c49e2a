package wire

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	stdhash "hash"
)

// Sealing (since protocol version 2): once a handshake has proven the shared
// secret, every frame of the session travels sealed. A sealed message is
// two parts: the frame as Encode writes it, then its seal,
//
//	u64(n) tag
//
// where n is the sender's frame counter in this direction (1 for its
// first sealed frame, then strictly increasing) and tag is the first
// TagBytes bytes of HMAC-SHA256 under the direction's key of u64(n) then
// the frame's bytes. The keys are derived from the secret and the
// handshake transcript (SessionKeys), so a frame sealed in one session is
// refused in every other, a frame sealed by one side is never accepted as
// the other's, and a frame replayed within its session is refused by its
// counter. Hello, Welcome, Auth and Refuse travel unsealed: they come
// before (or instead of) the keys.

// Seal sizes.
const (
	TagBytes  = 16 // truncated HMAC-SHA256
	SealBytes = 8 + TagBytes
)

// Label of the session-key derivation (docs/PROTOCOL.md spells it out).
const labelSession = "kvtier-peer-v2-session"

// Errors of Opener.Open (the session counts them as dropped frames, by
// Reason: bad_seal, replayed_frame, unsealed_frame).
var (
	// ErrBadSeal: the seal is not SealBytes long, or its tag is not the
	// frame's under this direction's key (forged, corrupted, or sealed for
	// another session or the other direction).
	ErrBadSeal = errors.New("peer frame seal does not verify")
	// ErrReplayed: the seal verifies but its counter is not above the last
	// one accepted in this direction.
	ErrReplayed = errors.New("peer frame replayed")
	// ErrUnsealed: a frame of a session whose keys are set came without a
	// seal.
	ErrUnsealed = errors.New("peer frame not sealed")
)

// SessionKeys derives a session's two frame keys from the shared secret
// and its handshake halves: dialer seals what the Hello's sender sends,
// listener what the Welcome's sender sends.
//
//	session  = HMAC-SHA256(secret, transcript("kvtier-peer-v2-session", Hello, Welcome))
//	dialer   = HMAC-SHA256(session, "dialer")
//	listener = HMAC-SHA256(session, "listener")
func SessionKeys(secret []byte, h *Hello, w *Welcome) (dialer, listener []byte) {
	m := hmac.New(sha256.New, secret)
	m.Write(transcript(labelSession, h, w))
	session := m.Sum(nil)
	return deriveKey(session, "dialer"), deriveKey(session, "listener")
}

func deriveKey(session []byte, role string) []byte {
	m := hmac.New(sha256.New, session)
	m.Write([]byte(role))
	return m.Sum(nil)
}

// Sealer seals one direction's frames. Not safe for concurrent use: its
// session actor owns it.
type Sealer struct {
	mac stdhash.Hash
	n   uint64
}

// NewSealer seals under key, counting from 1.
func NewSealer(key []byte) *Sealer { return &Sealer{mac: hmac.New(sha256.New, key)} }

// Seal returns the next seal for the encoded frame b.
func (s *Sealer) Seal(b []byte) []byte {
	s.n++
	return appendTag(s.mac, make([]byte, 0, SealBytes+sha256.Size), s.n, b)[:SealBytes]
}

// appendTag appends u64(n) and the full HMAC of u64(n)·b to dst.
func appendTag(mac stdhash.Hash, dst []byte, n uint64, b []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, n)
	mac.Reset()
	mac.Write(dst[len(dst)-8:])
	mac.Write(b)
	return mac.Sum(dst)
}

// Opener checks one direction's seals. Not safe for concurrent use.
type Opener struct {
	mac  stdhash.Hash
	last uint64 // counter of the last frame accepted
	buf  []byte
}

// NewOpener checks seals made under key.
func NewOpener(key []byte) *Opener { return &Opener{mac: hmac.New(sha256.New, key)} }

// Open checks seal against the encoded frame b: nil when the tag verifies
// and its counter is above every one accepted before (then it is the
// last); ErrUnsealed, ErrBadSeal or ErrReplayed otherwise, and nothing
// changes.
func (o *Opener) Open(b, seal []byte) error {
	switch {
	case seal == nil:
		return ErrUnsealed
	case len(seal) != SealBytes:
		return ErrBadSeal
	}
	n := binary.BigEndian.Uint64(seal)
	o.buf = appendTag(o.mac, o.buf[:0], n, b)
	if !hmac.Equal(o.buf[8:8+TagBytes], seal[8:]) {
		return ErrBadSeal
	}
	if n <= o.last {
		return ErrReplayed
	}
	o.last = n
	return nil
}

// SealReason is the dropped-frame counter's label for an Open error.
func SealReason(err error) string {
	switch {
	case errors.Is(err, ErrUnsealed):
		return "unsealed_frame"
	case errors.Is(err, ErrReplayed):
		return "replayed_frame"
	}
	return "bad_seal"
}

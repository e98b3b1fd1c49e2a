package wire

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
)

// MinSecretBytes is the shortest shared secret a node should accept; the
// MAC functions take any secret, configuration enforces this.
const MinSecretBytes = 16

// Role labels of the MAC transcript: a server MAC and a client MAC over the
// same halves differ, so one can never be replayed as the other.
const (
	labelServer = "kvtier-peer-v1-server"
	labelClient = "kvtier-peer-v1-client"
)

// ServerMAC is Welcome.MAC: HMAC-SHA256 under secret of the transcript of
// both halves of the handshake with the server label. w.MAC itself is not
// part of the transcript. A nil half counts as a zero one.
func ServerMAC(secret []byte, h *Hello, w *Welcome) []byte {
	return handshakeMAC(secret, labelServer, h, w)
}

// ClientMAC is Auth.MAC: as ServerMAC, with the client label.
func ClientMAC(secret []byte, h *Hello, w *Welcome) []byte {
	return handshakeMAC(secret, labelClient, h, w)
}

// CheckMAC compares a received MAC with the expected one in constant time.
// Both must be MACBytes long (two empty MACs never match).
func CheckMAC(want, got []byte) bool {
	return len(want) == MACBytes && len(got) == MACBytes && hmac.Equal(want, got)
}

func handshakeMAC(secret []byte, label string, h *Hello, w *Welcome) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write(transcript(label, h, w))
	return m.Sum(make([]byte, 0, MACBytes))
}

// transcript is the byte string the handshake MACs cover (docs/PROTOCOL.md,
// "Peer protocol", spells it out for independent implementations):
//
//	str(label)
//	half(Hello)  = u64(Version) str(Node) u64(Epoch) str(Nonce) list(Namespaces)
//	               u64(BlockBytes) u64(Slots) str(Transport) str(DataMeta)
//	half(Welcome), the same nine fields (its MAC excluded)
//
// where u64 is 8 bytes big-endian (an int as its two's complement), str is
// a 4-byte big-endian length then the bytes, and list is a 4-byte
// big-endian count then each element as str. label is
// "kvtier-peer-v1-server" for ServerMAC, "kvtier-peer-v1-client" for
// ClientMAC.
func transcript(label string, h *Hello, w *Welcome) []byte {
	if h == nil {
		h = &Hello{}
	}
	if w == nil {
		w = &Welcome{}
	}
	size := 4 + len(label) + halfSize(h.Node, h.Namespaces, h.Transport, h.DataMeta) +
		halfSize(w.Node, w.Namespaces, w.Transport, w.DataMeta)
	b := make([]byte, 0, size)
	b = appendStr(b, label)
	b = appendHalf(b, h.Version, h.Node, h.Epoch, h.Nonce, h.Namespaces, h.BlockBytes, h.Slots, h.Transport, h.DataMeta)
	b = appendHalf(b, w.Version, w.Node, w.Epoch, w.Nonce, w.Namespaces, w.BlockBytes, w.Slots, w.Transport, w.DataMeta)
	return b
}

func halfSize(node string, ns []string, transport string, meta []byte) int {
	n := 4*8 + 4*4 + NonceBytes + len(node) + len(transport) + len(meta) + 4
	for _, s := range ns {
		n += 4 + len(s)
	}
	return n
}

func appendHalf(b []byte, version int, node string, epoch uint64, nonce []byte, ns []string,
	blockBytes, slots int, transport string, meta []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(int64(version)))
	b = appendStr(b, node)
	b = binary.BigEndian.AppendUint64(b, epoch)
	b = appendStr(b, string(nonce))
	b = binary.BigEndian.AppendUint32(b, uint32(len(ns)))
	for _, s := range ns {
		b = appendStr(b, s)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(int64(blockBytes)))
	b = binary.BigEndian.AppendUint64(b, uint64(int64(slots)))
	b = appendStr(b, transport)
	return appendStr(b, string(meta))
}

func appendStr(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// NewNonce draws NonceBytes random bytes for a Hello or Welcome.
func NewNonce() []byte {
	n := make([]byte, NonceBytes)
	mustRead(n)
	return n
}

// NewEpoch draws a random session epoch, never 0.
func NewEpoch() uint64 {
	var b [8]byte
	for {
		mustRead(b[:])
		if e := binary.BigEndian.Uint64(b[:]); e != 0 {
			return e
		}
	}
}

func mustRead(p []byte) {
	// NB: crypto/rand.Read never fails on supported platforms (Go ≥ 1.24
	// crashes the program rather than return an error); a handshake without
	// randomness must not go on regardless.
	if _, err := rand.Read(p); err != nil {
		panic("peer/wire: no randomness: " + err.Error())
	}
}

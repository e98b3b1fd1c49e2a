package wire

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"
)

var secret = []byte("correct horse battery staple")

// The MACs of the fixed handshake, computed by an independent (Python)
// implementation of the transcript as docs/PROTOCOL.md spells it.
func TestMACGolden(t *testing.T) {
	h, w := testHello(), testWelcome()
	require.Equal(t, "efefa2a708fb97ac1b9a9ca7e3264c2db7dab7f27bc19a4897372a977b0ca5b1", hex.EncodeToString(ServerMAC(secret, h, w)))
	require.Equal(t, "eb9d26c2df2e73e27d0e5d0b8b5e57516b71f8b82afc87dd45cc8a6170e83423", hex.EncodeToString(ClientMAC(secret, h, w)))
}

// Changing any field of the transcript changes both MACs; the Welcome's own
// MAC is not part of it.
func TestMACCoversEveryField(t *testing.T) {
	for name, mod := range map[string]func(h *Hello, w *Welcome){
		"hello version":     func(h *Hello, w *Welcome) { h.Version = Version + 1 },
		"hello node":        func(h *Hello, w *Welcome) { h.Node = "node-x" },
		"hello epoch":       func(h *Hello, w *Welcome) { h.Epoch++ },
		"hello nonce":       func(h *Hello, w *Welcome) { h.Nonce[31] ^= 1 },
		"hello ns":          func(h *Hello, w *Welcome) { h.Namespaces[1] = "other" },
		"hello ns order":    func(h *Hello, w *Welcome) { h.Namespaces[0], h.Namespaces[1] = h.Namespaces[1], h.Namespaces[0] },
		"hello ns dropped":  func(h *Hello, w *Welcome) { h.Namespaces = h.Namespaces[:1] },
		"hello block":       func(h *Hello, w *Welcome) { h.BlockBytes++ },
		"hello slots":       func(h *Hello, w *Welcome) { h.Slots++ },
		"hello transport":   func(h *Hello, w *Welcome) { h.Transport = "nixl" },
		"hello meta":        func(h *Hello, w *Welcome) { h.DataMeta = append(h.DataMeta, '0') },
		"welcome version":   func(h *Hello, w *Welcome) { w.Version = Version + 1 },
		"welcome node":      func(h *Hello, w *Welcome) { w.Node = "node-x" },
		"welcome epoch":     func(h *Hello, w *Welcome) { w.Epoch++ },
		"welcome nonce":     func(h *Hello, w *Welcome) { w.Nonce[0] ^= 1 },
		"welcome ns":        func(h *Hello, w *Welcome) { w.Namespaces = nil },
		"welcome block":     func(h *Hello, w *Welcome) { w.BlockBytes-- },
		"welcome slots":     func(h *Hello, w *Welcome) { w.Slots-- },
		"welcome transport": func(h *Hello, w *Welcome) { w.Transport = "tcp2" },
		"welcome meta":      func(h *Hello, w *Welcome) { w.DataMeta = nil },
		"halves swapped": func(h *Hello, w *Welcome) {
			h.Node, w.Node = w.Node, h.Node
			h.Nonce, w.Nonce = w.Nonce, h.Nonce
		},
		// Length prefixes: moving bytes between adjacent fields changes the MAC.
		"node/epoch boundary": func(h *Hello, w *Welcome) { h.Node = "node-" },
		"ns boundary":         func(h *Hello, w *Welcome) { h.Namespaces = []string{testNS + "fedcba9876543210"} },
		"transport/meta boundary": func(h *Hello, w *Welcome) {
			h.Transport, h.DataMeta = "tcp1", []byte("0.0.0.1:7001")
		},
	} {
		h, w := testHello(), testWelcome()
		server, client := ServerMAC(secret, h, w), ClientMAC(secret, h, w)
		mod(h, w)
		require.False(t, CheckMAC(server, ServerMAC(secret, h, w)), name)
		require.False(t, CheckMAC(client, ClientMAC(secret, h, w)), name)
	}
	h, w := testHello(), testWelcome()
	server := ServerMAC(secret, h, w)
	w.MAC = fill(MACBytes, 0x55)
	require.True(t, CheckMAC(server, ServerMAC(secret, h, w)), "the Welcome's MAC is not in its own transcript")
}

func TestMACRolesAndSecrets(t *testing.T) {
	h, w := testHello(), testWelcome()
	server, client := ServerMAC(secret, h, w), ClientMAC(secret, h, w)
	require.Len(t, server, MACBytes)
	require.False(t, CheckMAC(server, client), "a server MAC is not a client MAC")
	require.True(t, CheckMAC(server, ServerMAC(bytes.Clone(secret), testHello(), testWelcome())))
	require.False(t, CheckMAC(server, ServerMAC([]byte("correct horse battery stapler"), h, w)))
	require.False(t, CheckMAC(client, ClientMAC(nil, h, w)))
	require.False(t, CheckMAC(nil, nil), "two empty MACs never match")
	require.False(t, CheckMAC(server[:31], server[:31]))
	require.False(t, CheckMAC(server, append(bytes.Clone(server), 0)))
	// A nil half is a zero half, not a panic.
	require.Len(t, ServerMAC(secret, nil, nil), MACBytes)
}

// The MACs survive the wire: what the peer decodes MACs the same as what
// was sent (nil and empty lists included).
func TestMACSurvivesTheWire(t *testing.T) {
	h, w := testHello(), testWelcome()
	h.Namespaces, w.DataMeta = []string{}, []byte{}
	w.MAC = ServerMAC(secret, h, w)
	hb, err := Encode(h)
	require.NoError(t, err)
	wb, err := Encode(w)
	require.NoError(t, err)
	h2, w2 := decodeOK(t, hb).(*Hello), decodeOK(t, wb).(*Welcome)
	require.True(t, CheckMAC(ServerMAC(secret, h2, w2), w2.MAC))
	require.True(t, CheckMAC(ClientMAC(secret, h, w), ClientMAC(secret, h2, w2)))
}

func TestNonceAndEpoch(t *testing.T) {
	a, b := NewNonce(), NewNonce()
	require.Len(t, a, NonceBytes)
	require.NotEqual(t, a, b)
	seen := map[uint64]bool{}
	for range 1000 {
		e := NewEpoch()
		require.NotZero(t, e)
		seen[e] = true
	}
	require.Len(t, seen, 1000)
}

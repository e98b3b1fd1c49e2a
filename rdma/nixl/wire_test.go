package nixl

import (
	"bytes"
	"errors"
	"testing"

	"github.com/kvtier/kvtier/rdma"
)

func TestMetaRoundTrip(t *testing.T) {
	m := peerMeta{Agent: "node-1-abcd", SlotBytes: 128 << 10, Slots: 1700, Base: 0x7f0000000000, NixlMD: []byte("nixl blob")}
	got, err := decodeMeta(encodeMeta(m))
	if err != nil {
		t.Fatal(err)
	}
	if got.Agent != m.Agent || got.SlotBytes != m.SlotBytes || got.Slots != m.Slots || got.Base != m.Base || !bytes.Equal(got.NixlMD, m.NixlMD) {
		t.Fatalf("round trip: %+v, want %+v", got, m)
	}
}

func TestMetaRejectsMalformed(t *testing.T) {
	good := encodeMeta(peerMeta{Agent: "a", SlotBytes: 4096, Slots: 8, Base: 4096, NixlMD: []byte{1, 2, 3}})
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	cases := map[string][]byte{
		"empty":           nil,
		"short":           good[:metaFixed-1],
		"bad magic":       mutate(func(b []byte) []byte { b[0] = 'X'; return b }),
		"future version":  mutate(func(b []byte) []byte { b[4] = metaVersion + 1; return b }),
		"no agent":        mutate(func(b []byte) []byte { b[6], b[7] = 0, 0; return b }),
		"zero slot bytes": mutate(func(b []byte) []byte { clear(b[8:16]); return b }),
		"zero slots":      mutate(func(b []byte) []byte { clear(b[16:24]); return b }),
		"null base":       mutate(func(b []byte) []byte { clear(b[24:32]); return b }),
		"truncated md":    good[:len(good)-1],
		"trailing bytes":  append(bytes.Clone(good), 0),
		"huge md length":  mutate(func(b []byte) []byte { b[metaFixed+1+3] = 0xff; return b }),
	}
	for name, b := range cases {
		if _, err := decodeMeta(b); !errors.Is(err, rdma.ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", name, err)
		}
	}
}

func TestNotifRoundTripAndDigest(t *testing.T) {
	n := notif{Token: rdma.NewToken(), Count: 3, Digest: slotDigest([]int{4, 9, 1})}
	got, ok := decodeNotif(encodeNotif(n))
	if !ok || got != n {
		t.Fatalf("round trip: %+v %v", got, ok)
	}
	if slotDigest([]int{4, 9, 1}) == slotDigest([]int{9, 4, 1}) {
		t.Fatal("digest ignores order")
	}
	for _, b := range [][]byte{nil, encodeNotif(n)[:notifLen-1], append(encodeNotif(n), 0), []byte("XXXX0123456789abcdef01234567")} {
		if _, ok := decodeNotif(b); ok {
			t.Errorf("decoded %q", b)
		}
	}
}

package tcp

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/rdma"
)

// TestWireLayout pins the byte layout documented in doc.go.
func TestWireLayout(t *testing.T) {
	var tok rdma.Token
	for i := range tok {
		tok[i] = byte(i + 1)
	}
	got := appendHeader(appendPreface(nil, "n1"), tok, 0x20000, []int{5, 0x010203})
	want := []byte{
		'K', 'V', 'T', 'D', 1, 2, 'n', '1', // preface
		1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, // token
		0, 0, 0, 2, // count
		0, 2, 0, 0, // slot bytes
		0, 0, 0, 5, 0, 1, 2, 3, // dst slots
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("frame\n got %x\nwant %x", got, want)
	}
	meta := encodeMeta(peerMeta{Addr: "10.0.0.1:7000", SlotBytes: 0x20000, Slots: 300})
	wantMeta := append([]byte{1, 0, 2, 0, 0, 0, 0, 1, 0x2c, 13}, "10.0.0.1:7000"...)
	if !bytes.Equal(meta, wantMeta) {
		t.Fatalf("metadata\n got %x\nwant %x", meta, wantMeta)
	}
}

func TestMetaRoundTripAndRejects(t *testing.T) {
	m := peerMeta{Addr: "[::1]:65535", SlotBytes: 1 << 20, Slots: 1 << 20}
	got, err := decodeMeta(encodeMeta(m))
	if err != nil || got != m {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, m)
	}
	good := encodeMeta(peerMeta{Addr: "127.0.0.1:1", SlotBytes: 4, Slots: 4})
	bad := map[string][]byte{
		"empty":        nil,
		"short":        good[:metaFixed-1],
		"version":      append([]byte{2}, good[1:]...),
		"long":         append(append([]byte(nil), good...), 0),
		"cut address":  good[:len(good)-1],
		"zero slots":   encodeMeta(peerMeta{Addr: "127.0.0.1:1", SlotBytes: 4}),
		"zero bytes":   encodeMeta(peerMeta{Addr: "127.0.0.1:1", Slots: 4}),
		"no port":      encodeMeta(peerMeta{Addr: "127.0.0.1", SlotBytes: 4, Slots: 4}),
		"empty addr":   encodeMeta(peerMeta{SlotBytes: 4, Slots: 4}),
		"garbage addr": encodeMeta(peerMeta{Addr: strings.Repeat("x", 40), SlotBytes: 4, Slots: 4}),
	}
	for name, b := range bad {
		if _, err := decodeMeta(b); !errors.Is(err, errMeta) {
			t.Errorf("%s: %v, want errMeta", name, err)
		}
	}
}

// FuzzHeader drives the consumer's decoders — preface, then one header —
// with arbitrary bytes: they must never panic, never accept a slot list
// longer than the pool or an index outside it, fail only with a protocol
// error or a short read, and whatever they accept must re-encode to
// exactly the bytes they consumed.
func FuzzHeader(f *testing.F) {
	const pool = 64
	var tok rdma.Token
	copy(tok[:], "0123456789abcdef")
	valid := appendHeader(appendPreface(nil, "node-a"), tok, 4096, []int{3, 0, 63})
	f.Add(valid)
	f.Add(valid[:len(valid)-1])                                        // slot list cut short
	f.Add(valid[:prefaceFixed+3])                                      // preface cut short
	f.Add(append([]byte("KVTX"), valid[4:]...))                        // bad magic
	f.Add(append([]byte{'K', 'V', 'T', 'D', 9}, valid[5:]...))         // bad version
	f.Add(appendHeader(appendPreface(nil, "n"), tok, 4096, nil))       // zero slots
	f.Add(appendHeader(appendPreface(nil, "n"), tok, 0, []int{1}))     // zero slot bytes
	f.Add(appendHeader(appendPreface(nil, "n"), tok, 4096, []int{64})) // index outside the pool
	f.Add(appendHeader(appendPreface(nil, "n"), tok, 4096, make([]int, pool+1)))
	huge := appendHeader(appendPreface(nil, "n"), tok, 4096, []int{1})
	copy(huge[prefaceFixed+1+16:], []byte{0xff, 0xff, 0xff, 0xff}) // count 2^32-1
	f.Add(huge)
	f.Add([]byte{'K', 'V', 'T', 'D', 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		node, err := readPreface(r)
		if err != nil {
			checkDecodeErr(t, err)
			return
		}
		if node == "" || len(node) > maxNodeID {
			t.Fatalf("accepted node id of %d bytes", len(node))
		}
		h, err := readHeader(r, pool)
		if err != nil {
			checkDecodeErr(t, err)
			return
		}
		if len(h.Dst) == 0 || len(h.Dst) > pool || h.SlotBytes <= 0 {
			t.Fatalf("accepted %d slots of %d bytes", len(h.Dst), h.SlotBytes)
		}
		for _, s := range h.Dst {
			if s < 0 || s >= pool {
				t.Fatalf("accepted slot %d outside a pool of %d", s, pool)
			}
		}
		consumed := b[:len(b)-r.Len()]
		if enc := appendHeader(appendPreface(nil, node), h.Token, h.SlotBytes, h.Dst); !bytes.Equal(enc, consumed) {
			t.Fatalf("re-encoding\n got %x\nwant %x", enc, consumed)
		}
	})
}

// checkDecodeErr accepts only the decoders' two failure kinds.
func checkDecodeErr(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, rdma.ErrProtocol) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("decoder failed with %v, want a protocol error or a short read", err)
	}
}

// FuzzMetadata: decodeMeta never panics and what it accepts round-trips.
func FuzzMetadata(f *testing.F) {
	f.Add(encodeMeta(peerMeta{Addr: "127.0.0.1:4000", SlotBytes: 4096, Slots: 10}))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeMeta(m), b) {
			t.Fatalf("%+v re-encodes differently", m)
		}
	})
}

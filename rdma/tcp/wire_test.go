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
	got := appendHeader(appendPreface(nil, "n1"), tok, []int{5, 0x010203}, []int{0x20000, 0x1001})
	want := []byte{
		'K', 'V', 'T', 'D', 2, 2, 'n', '1', // preface
		1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, // token
		0, 0, 0, 2, // count
		0, 0, 0, 5, 0, 2, 0, 0, // dst slot 5, 0x20000 bytes
		0, 1, 2, 3, 0, 0, 0x10, 0x01, // dst slot 0x010203, 0x1001 bytes
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
// with arbitrary bytes: they must never panic, never accept an entry list
// longer than the pool, an index outside it or a length outside a slot,
// fail only with a protocol error or a short read, and whatever they
// accept must re-encode to exactly the bytes they consumed.
func FuzzHeader(f *testing.F) {
	const pool, slotBytes = 64, 4096
	var tok rdma.Token
	copy(tok[:], "0123456789abcdef")
	hdr := func(dst, lens []int) []byte { return appendHeader(appendPreface(nil, "n"), tok, dst, lens) }
	valid := appendHeader(appendPreface(nil, "node-a"), tok, []int{3, 0, 63}, []int{4096, 1, 1000})
	f.Add(valid)
	f.Add(valid[:len(valid)-1])                                // entries cut short
	f.Add(valid[:prefaceFixed+3])                              // preface cut short
	f.Add(append([]byte("KVTX"), valid[4:]...))                // bad magic
	f.Add(append([]byte{'K', 'V', 'T', 'D', 1}, valid[5:]...)) // version 1 (one slot size)
	f.Add(hdr(nil, nil))                                       // zero slots
	f.Add(hdr([]int{1}, []int{0}))                             // zero-length block
	f.Add(hdr([]int{1}, []int{slotBytes + 1}))                 // block longer than a slot
	f.Add(hdr([]int{64}, []int{1}))                            // index outside the pool
	f.Add(hdr(make([]int, pool+1), whole(pool+1, 1)))
	huge := hdr([]int{1}, []int{1})
	copy(huge[prefaceFixed+1+16:], []byte{0xff, 0xff, 0xff, 0xff}) // count 2^32-1
	f.Add(huge)
	f.Add([]byte{'K', 'V', 'T', 'D', 2, 0})
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
		h, err := readHeader(r, pool, slotBytes)
		if err != nil {
			checkDecodeErr(t, err)
			return
		}
		if len(h.Dst) == 0 || len(h.Dst) > pool || len(h.Lens) != len(h.Dst) {
			t.Fatalf("accepted %d slots with %d lengths", len(h.Dst), len(h.Lens))
		}
		for i, s := range h.Dst {
			if s < 0 || s >= pool || h.Lens[i] < 1 || h.Lens[i] > slotBytes {
				t.Fatalf("accepted a block of %d bytes in slot %d (a pool of %d slots of %d)", h.Lens[i], s, pool, slotBytes)
			}
		}
		consumed := b[:len(b)-r.Len()]
		if enc := appendHeader(appendPreface(nil, node), h.Token, h.Dst, h.Lens); !bytes.Equal(enc, consumed) {
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

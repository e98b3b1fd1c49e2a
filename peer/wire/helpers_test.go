package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
)

// kv is an ordered msgpack map for hand-built frames: key, value, key, ...
type kv []any

// rawBin is bytes appended as they are (a hand-made msgpack value).
type rawBin []byte

// raw encodes v with no checks: int/uint64/float64/string/[]byte/bool/nil,
// []any as an array, kv as a map, rawBin verbatim.
func raw(v any) []byte {
	var w writer
	rawValue(&w, v)
	return w.B
}

func rawValue(w *writer, v any) {
	switch v := v.(type) {
	case nil:
		w.Nil()
	case bool:
		w.Bool(v)
	case int:
		w.Int(int64(v))
	case uint64:
		w.Uint(v)
	case float64:
		w.B = binary.BigEndian.AppendUint64(append(w.B, 0xcb), math.Float64bits(v))
	case string:
		w.Str(v)
	case []byte:
		w.Bin(v)
	case rawBin:
		w.B = append(w.B, v...)
	case []any:
		w.ArrayLen(len(v))
		for _, x := range v {
			rawValue(w, x)
		}
	case kv:
		w.MapLen(len(v) / 2)
		for _, x := range v {
			rawValue(w, x)
		}
	default:
		panic(fmt.Sprintf("raw: %T", v))
	}
}

// with returns m with key set to val (replaced in place, or appended).
func with(m kv, key string, val any) kv {
	out := append(kv(nil), m...)
	for i := 0; i < len(out); i += 2 {
		if out[i] == key {
			out[i+1] = val
			return out
		}
	}
	return append(out, key, val)
}

// without returns m without key.
func without(m kv, key string) kv {
	var out kv
	for i := 0; i < len(m); i += 2 {
		if m[i] != key {
			out = append(out, m[i], m[i+1])
		}
	}
	return out
}

// le encodes uint32s little-endian, back to back.
func le(vs ...uint32) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

func fill(n int, c byte) []byte { return bytes.Repeat([]byte{c}, n) }

func hash(i int) []byte {
	h := make([]byte, 32)
	binary.BigEndian.PutUint64(h[24:], uint64(i)+1)
	return h
}

const testNS = "0123456789abcdef"

func testKeys(n int) []Key {
	out := make([]Key, n)
	for i := range out {
		out[i] = Key{Namespace: testNS, Hash: hash(i), Group: uint32(i % 3)}
	}
	return out
}

func testHello() *Hello {
	return &Hello{Version: Version, Node: "node-a", Epoch: 0x1122334455667788, Nonce: fill(NonceBytes, 0xa1),
		Namespaces: []string{testNS, "fedcba9876543210"}, BlockBytes: 1 << 20, Slots: 4096,
		Transport: "tcp", DataMeta: []byte("10.0.0.1:7001")}
}

func testWelcome() *Welcome {
	return &Welcome{Version: Version, Node: "node-b", Epoch: 0x1122334455667788, Nonce: fill(NonceBytes, 0xb2),
		Namespaces: []string{testNS}, BlockBytes: 1 << 20, Slots: 8192, Transport: "tcp",
		DataMeta: []byte("10.0.0.2:7001"), MAC: fill(MACBytes, 0xc3)}
}

func testProv(i int) *Provenance {
	return &Provenance{ParentHash: hash(i - 1), TokenIDs: []int32{int32(i), -1, math.MaxInt32, math.MinInt32},
		BlockSize: 4, LoRAID: -7, LoRAName: "adapter", ExtraKeys: []string{"salt", ""}}
}

func testResp(n int, prov bool) *LookupResp {
	r := &LookupResp{Epoch: 9, Round: 3, Hits: make([]bool, n), Checksums: make([]uint32, n)}
	if prov {
		r.Prov = make([]*Provenance, n)
	}
	for i := range n {
		if i%5 == 4 {
			continue // a miss
		}
		r.Hits[i], r.Checksums[i] = true, uint32(i)*2654435761
		if prov && i%7 != 3 {
			r.Prov[i] = testProv(i)
		}
	}
	return r
}

func testFetch(n int) *Fetch {
	f := &Fetch{Epoch: 9, Round: 3, Keys: testKeys(n), Dest: make([]int, n), Token: fill(TokenBytes, 0x7e), TTLms: 2000}
	for i := range f.Dest {
		f.Dest[i] = i * 3
	}
	return f
}

// testSizedFetch is testFetch with a length per block, two sizes
// interleaved.
func testSizedFetch(n int) *Fetch {
	f := testFetch(n)
	f.Sizes = make([]int, n)
	for i := range f.Sizes {
		f.Sizes[i] = []int{4096, 12288}[i%2]
	}
	return f
}

// testSizedResp is testResp with each hit's length (misses 0).
func testSizedResp(n int) *LookupResp {
	r := testResp(n, true)
	r.Sizes = make([]int, n)
	for i, hit := range r.Hits {
		if hit {
			r.Sizes[i] = 1 + i*4096
		}
	}
	return r
}

// validFrames is one or more valid frames of every type.
func validFrames() []Frame {
	return []Frame{
		testHello(),
		&Hello{Version: Version, Node: "n", Epoch: 1, Nonce: fill(NonceBytes, 0), BlockBytes: 1, Slots: 1, Transport: "nixl"},
		testWelcome(),
		&Auth{Epoch: 5, MAC: fill(MACBytes, 1)},
		&Ready{Epoch: 5},
		&Refuse{Epoch: 5, Reason: RefuseVersion, Msg: "this node speaks version 1"},
		&Refuse{Epoch: 5, Reason: RefuseBusy},
		&Lookup{Epoch: 9, Round: 1, Keys: testKeys(3)},
		&Lookup{Epoch: math.MaxUint64, Round: math.MaxUint64, Keys: []Key{{Namespace: "", Hash: []byte{1}, Group: math.MaxUint32}}},
		testResp(8, true),
		testResp(3, false),
		&LookupResp{Epoch: 9, Round: 3, Hits: []bool{false}, Checksums: []uint32{0}, Prov: []*Provenance{nil}},
		&LookupResp{Epoch: 9, Round: 3, Hits: []bool{true}, Checksums: []uint32{0}, Prov: []*Provenance{{}}},
		testFetch(4),
		testSizedFetch(3),
		testSizedResp(6),
		&LookupResp{Epoch: 9, Round: 3, Hits: []bool{true}, Checksums: []uint32{1}, Sizes: []int{MaxBlockBytes}},
		&TransferDone{Epoch: 9, Round: 3, OK: true},
		&TransferDone{Epoch: 9, Round: 3, OK: false, Reason: "checksum"},
		&Abort{Epoch: 9, Round: 4},
		&AbortAck{Epoch: 9, Round: 4},
		&Ping{Epoch: 9, Seq: 0},
		&Pong{Epoch: 9, Seq: 1 << 40},
		&Bye{Epoch: 9},
		&Bye{Epoch: 9, Reason: RefuseShutdown},
	}
}

func longString(n int) string { return strings.Repeat("x", n) }

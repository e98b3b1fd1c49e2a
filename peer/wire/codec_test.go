package wire

import (
	"errors"
	"math"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

func decodeOK(t *testing.T, b []byte) Frame {
	t.Helper()
	f, err := Decode(b)
	require.NoError(t, err)
	return f
}

// Every frame type round-trips; empty optional fields come back as nil.
func TestRoundTrip(t *testing.T) {
	for _, f := range validFrames() {
		t.Run(OpName(f), func(t *testing.T) {
			b, err := Encode(f)
			require.NoError(t, err)
			require.Equal(t, f, decodeOK(t, b))
		})
	}
	empty := []struct {
		name     string
		in, want Frame
	}{
		{"hello empty ns and meta",
			&Hello{Version: Version, Node: "a", Epoch: 1, Nonce: fill(NonceBytes, 1), Namespaces: []string{}, BlockBytes: 2, Slots: 3, Transport: "tcp", DataMeta: []byte{}},
			&Hello{Version: Version, Node: "a", Epoch: 1, Nonce: fill(NonceBytes, 1), BlockBytes: 2, Slots: 3, Transport: "tcp"}},
		{"welcome nil ns and meta",
			&Welcome{Version: Version, Node: "b", Epoch: 1, Nonce: fill(NonceBytes, 1), BlockBytes: 2, Slots: 3, Transport: "tcp", MAC: fill(MACBytes, 2)},
			nil},
		{"resp empty prov",
			&LookupResp{Epoch: 1, Round: 1, Hits: []bool{true, false}, Checksums: []uint32{7, 0}, Prov: []*Provenance{}},
			&LookupResp{Epoch: 1, Round: 1, Hits: []bool{true, false}, Checksums: []uint32{7, 0}}},
		{"resp all-nil prov",
			&LookupResp{Epoch: 1, Round: 1, Hits: []bool{true, false}, Checksums: []uint32{7, 0}, Prov: []*Provenance{nil, nil}},
			nil},
		{"prov empty slices",
			&LookupResp{Epoch: 1, Round: 1, Hits: []bool{true}, Checksums: []uint32{7},
				Prov: []*Provenance{{ParentHash: []byte{}, TokenIDs: []int32{}, ExtraKeys: []string{}}}},
			&LookupResp{Epoch: 1, Round: 1, Hits: []bool{true}, Checksums: []uint32{7}, Prov: []*Provenance{{}}}},
		{"refuse empty msg", &Refuse{Epoch: 1, Reason: "auth", Msg: ""}, nil},
	}
	for _, tc := range empty {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Encode(tc.in)
			require.NoError(t, err)
			want := tc.want
			if want == nil {
				want = tc.in
			}
			require.Equal(t, want, decodeOK(t, b))
		})
	}
}

// The wire format is pinned: a change to it must change this test (and
// docs/PROTOCOL.md, whose example this is).
func TestGoldenEncoding(t *testing.T) {
	b, err := Encode(&Ping{Epoch: 7, Seq: 1})
	require.NoError(t, err)
	require.Equal(t, "84a17603a26f70a470696e67a16507a373657101", hexs(b))
	b, err = Encode(&Lookup{Epoch: 7, Round: 2, Keys: []Key{{Namespace: "ns", Hash: []byte{0xab, 0xcd}, Group: 1}}})
	require.NoError(t, err)
	require.Equal(t, "85a17603a26f70a66c6f6f6b7570a16507a5726f756e6402a46b65797391"+"93a26e73c402abcd01", hexs(b))
	// Version 3's sizes, as Python's msgpack writes them (field order as ours).
	b, err = Encode(&LookupResp{Epoch: 7, Round: 2, Hits: []bool{true, false}, Checksums: []uint32{0xdeadbeef, 0}, Sizes: []int{12288, 0}})
	require.NoError(t, err)
	require.Equal(t, "87a17603a26f70ab6c6f6f6b75705f72657370a16507a5726f756e6402a468697473c4020100"+
		"a3637263c408efbeadde00000000a573697a657392cd300000", hexs(b))
	tok := make([]byte, TokenBytes)
	for i := range tok {
		tok[i] = byte(i)
	}
	b, err = Encode(&Fetch{Epoch: 7, Round: 2, Keys: []Key{{Namespace: "ns", Hash: []byte{0xab, 0xcd}, Group: 1}},
		Dest: []int{5}, Sizes: []int{4096}, Token: tok, TTLms: 2000})
	require.NoError(t, err)
	require.Equal(t, "89a17603a26f70a56665746368a16507a5726f756e6402a46b6579739193a26e73c402abcd01a4646573749105"+
		"a573697a657391cd1000a5746f6b656ec410000102030405060708090a0b0c0d0e0fa374746ccd07d0", hexs(b))
}

func hexs(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// Decoded byte slices never alias the caller's buffer.
func TestDecodeCopiesItsInput(t *testing.T) {
	b, err := Encode(testFetch(2))
	require.NoError(t, err)
	f := decodeOK(t, b).(*Fetch)
	for i := range b {
		b[i] = 0xff
	}
	require.Equal(t, testFetch(2), f)
}

// Frames written by another msgpack implementation decode: any integer
// width, any field order, arrays or maps as the schema says.
func TestDecodesThirdPartyEncoding(t *testing.T) {
	var buf []byte
	enc := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		require.NoError(t, err)
		return b
	}
	// Field order by hand: "e" and "keys" before "v" and "op" (decoded late).
	buf = append(buf, 0x85)
	buf = append(buf, enc("e")...)
	buf = append(buf, enc(uint64(9))...)
	buf = append(buf, enc("keys")...)
	buf = append(buf, enc([]any{[]any{testNS, hash(0), int64(1)}, []any{testNS, hash(1), uint16(2)}})...)
	buf = append(buf, enc("round")...)
	buf = append(buf, enc(int8(3))...)
	buf = append(buf, enc("op")...)
	buf = append(buf, enc("lookup")...)
	buf = append(buf, enc("v")...)
	buf = append(buf, enc(uint32(Version))...)
	want := &Lookup{Epoch: 9, Round: 3, Keys: []Key{{testNS, hash(0), 1}, {testNS, hash(1), 2}}}
	require.Equal(t, want, decodeOK(t, buf))

	f := decodeOK(t, enc(map[string]any{"v": Version, "op": "transfer_done", "e": uint64(1 << 63), "round": int32(4), "ok": false, "reason": "timeout"}))
	require.Equal(t, &TransferDone{Epoch: 1 << 63, Round: 4, Reason: "timeout"}, f)
}

// A Hello or Welcome of another version yields its node and epoch with
// ErrVersion; other frames of another version yield ErrVersion alone.
func TestOtherVersions(t *testing.T) {
	future := kv{"v", Version + 1, "op", "hello", "e", 77, "node", "node-z", "nonce", fill(64, 1),
		"ns", kv{"shape", "changed"}, "block_bytes", 1.5, "caps", []any{"x", kv{"deep", []any{1, 2}}},
		"ext", rawBin{0xd4, 0x01, 0x02}, "transport", nil}
	f, err := Decode(raw(future))
	require.ErrorIs(t, err, ErrVersion)
	require.False(t, errors.Is(err, ErrMalformed))
	require.Equal(t, ReasonVersion, Reason(err))
	require.Equal(t, &Hello{Version: Version + 1, Node: "node-z", Epoch: 77}, f)

	f, err = Decode(raw(with(with(future, "op", "welcome"), "v", 0)))
	require.ErrorIs(t, err, ErrVersion)
	require.Equal(t, &Welcome{Version: 0, Node: "node-z", Epoch: 77}, f)

	f, err = Decode(raw(with(future, "v", math.MaxUint32)))
	require.ErrorIs(t, err, ErrVersion)
	require.Equal(t, &Hello{Version: math.MaxUint32, Node: "node-z", Epoch: 77}, f)

	for name, m := range map[string]kv{
		"ping":          {"v", Version + 1, "op", "ping", "e", 1, "seq", "anything"},
		"unknown op":    {"v", Version + 1, "op", "gossip", "e", 1},
		"lookup v0":     {"v", 0, "op", "lookup", "e", 1, "round", 1, "keys", []any{}},
		"auth, garbage": {"v", Version + 2, "op", "auth", "what", kv{"x", nil}},
		"fetch v2":      {"v", 2, "op", "fetch", "e", 1, "round", 1},
	} {
		f, err := Decode(raw(m))
		require.ErrorIs(t, err, ErrVersion, name)
		require.Nil(t, f, name)
	}

	// The version-stable fields must be there and well-formed.
	for name, m := range map[string]kv{
		"no node":      without(future, "node"),
		"no epoch":     without(future, "e"),
		"node not str": with(future, "node", 5),
		"node spaced":  with(future, "node", "a b"),
		"epoch 0":      with(future, "e", 0),
		"too deep":     with(future, "caps", []any{[]any{[]any{[]any{[]any{[]any{[]any{[]any{[]any{1}}}}}}}}}),
		"v too big":    with(future, "v", uint64(1)<<32),
	} {
		f, err := Decode(raw(m))
		require.Error(t, err, name)
		require.False(t, errors.Is(err, ErrVersion), "%s: %v", name, err)
		require.Nil(t, f, name)
	}
}

func TestMalformedFrames(t *testing.T) {
	ping := kv{"v", Version, "op", "ping", "e", 7, "seq", 1}
	key := func(h []byte) []any { return []any{testNS, h, 0} }
	lookup := kv{"v", Version, "op", "lookup", "e", 7, "round", 1, "keys", []any{key(hash(0))}}
	fetch := kv{"v", Version, "op", "fetch", "e", 7, "round", 1, "keys", []any{key(hash(0)), key(hash(1))},
		"dest", []any{0, 1}, "token", fill(TokenBytes, 1), "ttl", 2000}
	resp := kv{"v", Version, "op", "lookup_resp", "e", 7, "round", 1, "hits", []byte{1, 0},
		"crc", le(5, 0), "prov", []any{kv{"tokens", le(1, 2)}, nil}}
	hello := kv{"v", Version, "op", "hello", "e", 7, "node", "a", "nonce", fill(NonceBytes, 1),
		"block_bytes", 4096, "slots", 8, "transport", "tcp"}
	welcome := with(with(hello, "op", "welcome"), "mac", fill(MACBytes, 1))
	for _, ok := range []kv{ping, lookup, fetch, resp, hello, welcome, with(fetch, "sizes", []any{1, MaxBlockBytes}),
		with(resp, "sizes", []any{12288, 0}), with(fetch, "sizes", []any{})} {
		decodeOK(t, raw(ok)) // the bases are valid
	}
	validLookup := raw(lookup)

	for _, tc := range []struct {
		name   string
		frame  []byte
		reason string
	}{
		{"empty", nil, ReasonMalformed},
		{"not a map", raw([]any{1, "ping"}), ReasonMalformed},
		{"nil", []byte{0xc0}, ReasonMalformed},
		{"truncated", validLookup[:len(validLookup)-3], ReasonMalformed},
		{"trailing bytes", append(raw(ping), 0xc0), ReasonMalformed},
		{"missing v", raw(without(ping, "v")), ReasonMalformed},
		{"fetch without ttl", raw(without(fetch, "ttl")), ReasonMalformed},
		{"fetch ttl 0", raw(with(fetch, "ttl", 0)), ReasonMalformed},
		{"fetch ttl over its bound", raw(with(fetch, "ttl", MaxFetchTTLms+1)), ReasonTooLarge},
		{"fetch ttl negative", raw(with(fetch, "ttl", -5)), ReasonMalformed},
		{"fetch sizes, one short", raw(with(fetch, "sizes", []any{4096})), ReasonMalformed},
		{"fetch size 0", raw(with(fetch, "sizes", []any{4096, 0})), ReasonMalformed},
		{"fetch size over its bound", raw(with(fetch, "sizes", []any{4096, MaxBlockBytes + 1})), ReasonTooLarge},
		{"fetch size negative", raw(with(fetch, "sizes", []any{4096, -1})), ReasonMalformed},
		{"fetch sizes as bin", raw(with(fetch, "sizes", []byte{1, 2})), ReasonMalformed},
		{"resp sizes, one short", raw(with(resp, "sizes", []any{4096})), ReasonMalformed},
		{"resp miss with a size", raw(with(resp, "sizes", []any{4096, 1})), ReasonMalformed},
		{"resp hit of size 0", raw(with(resp, "sizes", []any{0, 0})), ReasonMalformed},
		{"sizes on a lookup", raw(with(lookup, "sizes", []any{1})), ReasonMalformed},
		{"missing op", raw(without(ping, "op")), ReasonMalformed},
		{"v as string", raw(with(ping, "v", "1")), ReasonMalformed},
		{"v negative", raw(with(ping, "v", -1)), ReasonMalformed},
		{"v as float", raw(with(ping, "v", float64(Version))), ReasonMalformed},
		{"op as bin", raw(with(ping, "op", []byte("ping"))), ReasonMalformed},
		{"other version", raw(with(ping, "v", Version+1)), ReasonVersion},
		{"unknown op", raw(with(ping, "op", "pingg")), ReasonUnknownOp},
		{"unknown field", raw(with(ping, "extra", 1)), ReasonMalformed},
		{"unknown field before op", raw(append(kv{"zz", 1}, ping...)), ReasonMalformed},
		{"repeated field", raw(append(append(kv{}, ping...), "seq", 2)), ReasonMalformed},
		{"repeated v", raw(append(append(kv{}, ping...), "v", Version)), ReasonMalformed},
		{"field of another op", raw(with(ping, "round", 1)), ReasonMalformed},
		{"field of another op, early", raw(append(kv{"mac", fill(MACBytes, 1)}, ping...)), ReasonMalformed},
		{"missing required", raw(without(lookup, "keys")), ReasonMalformed},
		{"missing epoch", raw(without(ping, "e")), ReasonMalformed},
		{"epoch 0", raw(with(ping, "e", 0)), ReasonMalformed},
		{"epoch float", raw(with(ping, "e", 7.0)), ReasonMalformed},
		{"epoch nil", raw(with(ping, "e", nil)), ReasonMalformed},
		{"epoch negative", raw(with(ping, "e", -7)), ReasonMalformed},
		{"round 0", raw(with(lookup, "round", 0)), ReasonMalformed},
		{"no keys", raw(with(lookup, "keys", []any{})), ReasonMalformed},
		{"keys as map", raw(with(lookup, "keys", kv{"a", 1})), ReasonMalformed},
		{"key of 2", raw(with(lookup, "keys", []any{[]any{testNS, hash(0)}})), ReasonMalformed},
		{"key of 4", raw(with(lookup, "keys", []any{[]any{testNS, hash(0), 0, 0}})), ReasonMalformed},
		{"key as map", raw(with(lookup, "keys", []any{kv{"ns", testNS}})), ReasonMalformed},
		{"empty hash", raw(with(lookup, "keys", []any{key([]byte{})})), ReasonMalformed},
		{"hash as str", raw(with(lookup, "keys", []any{[]any{testNS, "h", 0}})), ReasonMalformed},
		{"hash of 65", raw(with(lookup, "keys", []any{key(fill(65, 1))})), ReasonTooLarge},
		{"namespace as bin", raw(with(lookup, "keys", []any{[]any{[]byte("ns"), hash(0), 0}})), ReasonMalformed},
		{"group negative", raw(with(lookup, "keys", []any{[]any{testNS, hash(0), -1}})), ReasonMalformed},
		{"group over uint32", raw(with(lookup, "keys", []any{[]any{testNS, hash(0), uint64(1) << 32}})), ReasonTooLarge},
		{"keys claimed beyond frame", raw(with(lookup, "keys", rawBin{0xdc, 0x1f, 0xff})), ReasonMalformed},
		{"keys claimed beyond bound", raw(with(lookup, "keys", rawBin{0xdd, 0xff, 0xff, 0xff, 0xff})), ReasonTooLarge},
		{"map claimed huge", []byte{0xdf, 0xff, 0xff, 0xff, 0xff}, ReasonTooLarge},
		{"map claimed beyond frame", []byte{0x8f, 0xa1, 'v', 0x01}, ReasonMalformed},
		{"string claimed huge", raw(with(ping, "op", rawBin{0xdb, 0x7f, 0xff, 0xff, 0xff})), ReasonTooLarge},
		{"field name too long", raw(append(kv{longString(65), 1}, ping...)), ReasonTooLarge},
		{"skip of a truncated ext", raw(append(kv{"zz", rawBin{0xc9, 0, 0, 0, 9, 1}}, ping...)), ReasonMalformed},
		{"skip of an invalid code", raw(append(kv{"zz", rawBin{0xc1}}, ping...)), ReasonMalformed},
		{"nonce of 31", raw(with(hello, "nonce", fill(31, 1))), ReasonMalformed},
		{"nonce of 33", raw(with(hello, "nonce", fill(33, 1))), ReasonMalformed},
		{"nonce as str", raw(with(hello, "nonce", longString(32))), ReasonMalformed},
		{"mac of 31", raw(with(welcome, "mac", fill(31, 1))), ReasonMalformed},
		{"welcome without mac", raw(without(welcome, "mac")), ReasonMalformed},
		{"hello with mac", raw(with(hello, "mac", fill(MACBytes, 1))), ReasonMalformed},
		{"token of 17", raw(with(fetch, "token", fill(17, 1))), ReasonMalformed},
		{"node empty", raw(with(hello, "node", "")), ReasonMalformed},
		{"node with space", raw(with(hello, "node", "a b")), ReasonMalformed},
		{"node with NUL", raw(with(hello, "node", "\x00a")), ReasonMalformed},
		{"node not UTF-8", raw(with(hello, "node", "a\xff")), ReasonMalformed},
		{"transport empty", raw(with(hello, "transport", "")), ReasonMalformed},
		{"block_bytes 0", raw(with(hello, "block_bytes", 0)), ReasonMalformed},
		{"slots 0", raw(with(hello, "slots", 0)), ReasonMalformed},
		{"duplicate namespaces", raw(with(hello, "ns", []any{"a", "b", "a"})), ReasonMalformed},
		{"namespaces of bin", raw(with(hello, "ns", []any{[]byte("a")})), ReasonMalformed},
		{"meta as str", raw(with(hello, "meta", "x")), ReasonMalformed},
		{"dest shorter than keys", raw(with(fetch, "dest", []any{0})), ReasonMalformed},
		{"dest longer than keys", raw(with(fetch, "dest", []any{0, 1, 2})), ReasonMalformed},
		{"dest negative", raw(with(fetch, "dest", []any{0, -1})), ReasonMalformed},
		{"dest over MaxSlots", raw(with(fetch, "dest", []any{0, MaxSlots})), ReasonTooLarge},
		{"hits of 2", raw(with(resp, "hits", []byte{1, 2})), ReasonMalformed},
		{"hits as array", raw(with(resp, "hits", []any{true, false})), ReasonMalformed},
		{"hits empty", raw(with(with(without(resp, "prov"), "hits", []byte{}), "crc", []byte{})), ReasonMalformed},
		{"crc not whole", raw(with(resp, "crc", fill(7, 0))), ReasonMalformed},
		{"crc count", raw(with(resp, "crc", le(5))), ReasonMalformed},
		{"prov count", raw(with(resp, "prov", []any{nil})), ReasonMalformed},
		{"miss with checksum", raw(with(resp, "crc", le(5, 6))), ReasonMalformed},
		{"miss with prov", raw(with(resp, "prov", []any{nil, kv{}})), ReasonMalformed},
		{"prov unknown field", raw(with(resp, "prov", []any{kv{"colour", 1}, nil})), ReasonMalformed},
		{"prov repeated field", raw(with(resp, "prov", []any{kv{"block_size", 1, "block_size", 1}, nil})), ReasonMalformed},
		{"prov tokens not whole", raw(with(resp, "prov", []any{kv{"tokens", fill(5, 0)}, nil})), ReasonMalformed},
		{"prov tokens as array", raw(with(resp, "prov", []any{kv{"tokens", []any{1}}, nil})), ReasonMalformed},
		{"prov lora_id over int32", raw(with(resp, "prov", []any{kv{"lora_id", uint64(1) << 31}, nil})), ReasonTooLarge},
		{"prov block_size negative", raw(with(resp, "prov", []any{kv{"block_size", -1}, nil})), ReasonMalformed},
		{"prov as array", raw(with(resp, "prov", []any{[]any{}, nil})), ReasonMalformed},
		{"ok as int", raw(kv{"v", Version, "op", "transfer_done", "e", 1, "round", 1, "ok", 1}), ReasonMalformed},
		{"refuse empty reason", raw(kv{"v", Version, "op", "refuse", "e", 1, "reason", ""}), ReasonMalformed},
		{"refuse without reason", raw(kv{"v", Version, "op", "refuse", "e", 1}), ReasonMalformed},
		{"too large", make([]byte, MaxFrameBytes+1), ReasonTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Decode(tc.frame)
			require.Error(t, err)
			require.Nil(t, f)
			var e *Error
			require.True(t, errors.As(err, &e), "%T: %v", err, err)
			require.Equal(t, tc.reason, Reason(err), "%v", err)
			if tc.reason != ReasonVersion {
				require.ErrorIs(t, err, ErrMalformed)
			}
		})
	}
}

// Every bound: a frame exactly at it encodes and decodes; one past it is
// refused by Encode and, written anyway, by Decode — as too_large.
func TestBounds(t *testing.T) {
	lookup := func(keys []Key) Frame { return &Lookup{Epoch: 1, Round: 1, Keys: keys} }
	keyNS := func(n int) []Key { return []Key{{Namespace: longString(n), Hash: []byte{1}}} }
	keyHash := func(n int) []Key { return []Key{{Hash: fill(n, 1)}} }
	hello := func(mod func(h *Hello)) Frame { h := testHello(); mod(h); return h }
	nsList := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = "ns-" + itoa(i)
		}
		return out
	}
	prov := func(p *Provenance) Frame {
		return &LookupResp{Epoch: 1, Round: 1, Hits: []bool{true}, Checksums: []uint32{1}, Prov: []*Provenance{p}}
	}
	extras := func(n int) []string { return make([]string, n) }
	for _, tc := range []struct {
		name  string
		bound int
		frame func(n int) Frame
	}{
		{"lookup keys", MaxKeys, func(n int) Frame { return lookup(testKeys(n)) }},
		{"fetch keys", MaxKeys, func(n int) Frame { return testFetch(n) }},
		{"resp entries", MaxKeys, func(n int) Frame { return testResp(n, true) }},
		{"resp entries without prov", MaxKeys, func(n int) Frame { return testResp(n, false) }},
		{"key namespace", MaxStringBytes, func(n int) Frame { return lookup(keyNS(n)) }},
		{"key hash", maxHash, func(n int) Frame { return lookup(keyHash(n)) }},
		{"node id", MaxNodeIDBytes, func(n int) Frame { return hello(func(h *Hello) { h.Node = longString(n) }) }},
		{"namespaces", MaxNamespaces, func(n int) Frame { return hello(func(h *Hello) { h.Namespaces = nsList(n) }) }},
		{"namespace", MaxStringBytes, func(n int) Frame { return hello(func(h *Hello) { h.Namespaces = []string{longString(n)} }) }},
		{"transport", MaxStringBytes, func(n int) Frame { return hello(func(h *Hello) { h.Transport = longString(n) }) }},
		{"meta", MaxMetaBytes, func(n int) Frame { return hello(func(h *Hello) { h.DataMeta = fill(n, 2) }) }},
		{"block bytes", MaxBlockBytes, func(n int) Frame { return hello(func(h *Hello) { h.BlockBytes = n }) }},
		{"slots", MaxSlots, func(n int) Frame { return hello(func(h *Hello) { h.Slots = n }) }},
		{"welcome slots", MaxSlots, func(n int) Frame { w := testWelcome(); w.Slots = n; return w }},
		{"dest slot", MaxSlots - 1, func(n int) Frame { f := testFetch(2); f.Dest[1] = n; return f }},
		{"refuse reason", MaxStringBytes, func(n int) Frame { return &Refuse{Epoch: 1, Reason: longString(n)} }},
		{"refuse msg", MaxStringBytes, func(n int) Frame { return &Refuse{Epoch: 1, Reason: "auth", Msg: longString(n)} }},
		{"transfer_done reason", MaxStringBytes, func(n int) Frame { return &TransferDone{Epoch: 1, Round: 1, Reason: longString(n)} }},
		{"bye reason", MaxStringBytes, func(n int) Frame { return &Bye{Epoch: 1, Reason: longString(n)} }},
		{"prov parent", maxHash, func(n int) Frame { return prov(&Provenance{ParentHash: fill(n, 3)}) }},
		{"prov tokens", MaxTokenIDs, func(n int) Frame { return prov(&Provenance{TokenIDs: make([]int32, n)}) }},
		{"prov block size", MaxTokenIDs, func(n int) Frame { return prov(&Provenance{BlockSize: n}) }},
		{"prov lora id", math.MaxInt32, func(n int) Frame { return prov(&Provenance{LoRAID: n}) }},
		{"prov lora name", MaxStringBytes, func(n int) Frame { return prov(&Provenance{LoRAName: longString(n)}) }},
		{"prov extra keys", MaxExtraKeys, func(n int) Frame { return prov(&Provenance{ExtraKeys: extras(n)}) }},
		{"prov extra key", MaxStringBytes, func(n int) Frame { return prov(&Provenance{ExtraKeys: []string{longString(n)}}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := tc.frame(tc.bound)
			b, err := Encode(at)
			require.NoError(t, err)
			require.Equal(t, at, decodeOK(t, b))

			over := tc.frame(tc.bound + 1)
			_, err = Encode(over)
			require.Equal(t, ReasonTooLarge, Reason(err), "%v", err)
			var w writer
			encode(&w, over)
			f, err := Decode(w.B)
			require.Nil(t, f)
			require.Equal(t, ReasonTooLarge, Reason(err), "%v", err)
		})
	}
}

// A frame of exactly MaxFrameBytes decodes; one byte more is refused.
func TestFrameSizeBound(t *testing.T) {
	keys := make([]Key, 7700)
	for i := range keys {
		keys[i] = Key{Namespace: longString(256), Hash: fill(maxHash, byte(i)), Group: 0}
	}
	f := &Lookup{Epoch: 1, Round: 1, Keys: keys}
	b, err := Encode(f)
	require.NoError(t, err)
	// Namespaces of 256..1024 bytes have a 3-byte header: growing one grows
	// the frame by exactly as much.
	need := MaxFrameBytes - len(b)
	for i := 0; need > 0; i++ {
		add := min(need, MaxStringBytes-256)
		keys[i].Namespace = longString(256 + add)
		need -= add
	}
	b, err = Encode(f)
	require.NoError(t, err)
	require.Len(t, b, MaxFrameBytes)
	require.Equal(t, f, decodeOK(t, b))

	keys[len(keys)-1].Namespace += "x"
	_, err = Encode(f)
	require.Equal(t, ReasonTooLarge, Reason(err), "%v", err)
	var w writer
	encode(&w, f)
	require.Len(t, w.B, MaxFrameBytes+1)
	_, err = Decode(w.B)
	require.Equal(t, ReasonTooLarge, Reason(err), "%v", err)
}

// Exact lengths: one short or one long is malformed, both ways.
func TestExactLengths(t *testing.T) {
	for _, tc := range []struct {
		name  string
		n     int
		frame func(n int) Frame
	}{
		{"hello nonce", NonceBytes, func(n int) Frame { h := testHello(); h.Nonce = fill(n, 1); return h }},
		{"welcome nonce", NonceBytes, func(n int) Frame { w := testWelcome(); w.Nonce = fill(n, 1); return w }},
		{"welcome mac", MACBytes, func(n int) Frame { w := testWelcome(); w.MAC = fill(n, 1); return w }},
		{"auth mac", MACBytes, func(n int) Frame { return &Auth{Epoch: 1, MAC: fill(n, 1)} }},
		{"fetch token", TokenBytes, func(n int) Frame { f := testFetch(1); f.Token = fill(n, 1); return f }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Encode(tc.frame(tc.n))
			require.NoError(t, err)
			decodeOK(t, b)
			for _, n := range []int{0, tc.n - 1, tc.n + 1} {
				_, err := Encode(tc.frame(n))
				require.Equal(t, ReasonMalformed, Reason(err), "%d: %v", n, err)
				var w writer
				encode(&w, tc.frame(n))
				_, err = Decode(w.B)
				require.Equal(t, ReasonMalformed, Reason(err), "%d: %v", n, err)
			}
		})
	}
}

func TestEncodeRefuses(t *testing.T) {
	for name, f := range map[string]Frame{
		"nil":                 nil,
		"nil hello":           (*Hello)(nil),
		"nil resp":            (*LookupResp)(nil),
		"epoch 0":             &Ping{},
		"round 0":             &Abort{Epoch: 1},
		"no keys":             &Lookup{Epoch: 1, Round: 1},
		"negative dest":       &Fetch{Epoch: 1, Round: 1, Keys: testKeys(1), Dest: []int{-1}, Token: fill(TokenBytes, 0), TTLms: 1},
		"zero ttl":            &Fetch{Epoch: 1, Round: 1, Keys: testKeys(1), Dest: []int{0}, Token: fill(TokenBytes, 0)},
		"negative slots":      func() Frame { h := testHello(); h.Slots = -1; return h }(),
		"negative block size": &LookupResp{Epoch: 1, Round: 1, Hits: []bool{true}, Checksums: []uint32{0}, Prov: []*Provenance{{BlockSize: -1}}},
	} {
		b, err := Encode(f)
		require.Nil(t, b, name)
		require.ErrorIs(t, err, ErrMalformed, name)
	}
	for _, v := range []int{0, Version - 1, Version + 1} {
		h := testHello()
		h.Version = v
		_, err := Encode(h)
		require.ErrorIs(t, err, ErrVersion)
		w := testWelcome()
		w.Version = v
		_, err = Encode(w)
		require.ErrorIs(t, err, ErrVersion)
	}
}

// Lengths a frame declares but does not hold cost nothing: allocation is
// bounded by the frame's real size, never by what it claims.
func TestDeclaredLengthsDoNotAllocate(t *testing.T) {
	hdr := kv{"v", Version, "op", "lookup_resp", "e", 1, "round", 1}
	for name, frame := range map[string][]byte{
		"keys":   raw(kv{"v", Version, "op", "lookup", "e", 1, "round", 1, "keys", rawBin{0xdc, 0x1f, 0xff, 0x93}}),
		"dest":   raw(kv{"v", Version, "op", "fetch", "e", 1, "round", 1, "dest", rawBin{0xdc, 0x1f, 0xff, 0x00}}),
		"prov":   raw(append(hdr, "prov", rawBin{0xdc, 0x1f, 0xff, 0xc0})),
		"hits":   raw(append(hdr, "hits", rawBin{0xc6, 0x00, 0x00, 0x1f, 0xff})),
		"tokens": raw(append(hdr, "prov", []any{kv{"tokens", rawBin{0xc6, 0x00, 0x00, 0x3f, 0xff}}})),
		"ns":     raw(kv{"v", Version, "op", "hello", "e", 1, "ns", rawBin{0xdc, 0x00, 0x40, 0xa0}}),
		"map":    {0xdf, 0x00, 0x00, 0x00, 0x40, 0xa1, 'v', 0x01},
	} {
		_, err := Decode(frame)
		require.Error(t, err, name)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		const runs = 200
		for range runs {
			_, _ = Decode(frame)
		}
		runtime.ReadMemStats(&after)
		perRun := (after.TotalAlloc - before.TotalAlloc) / runs
		require.Less(t, perRun, uint64(1024+4*len(frame)), "%s: %d bytes per decode", name, perRun)
	}
}

func TestReasonLabels(t *testing.T) {
	require.Equal(t, "", Reason(nil))
	require.Equal(t, ReasonOther, Reason(errors.New("x")))
	require.Equal(t, ReasonTooLarge, Reason(&Error{Kind: ErrTooLarge}))
	require.ErrorIs(t, &Error{Kind: ErrUnknownOp}, ErrMalformed)
	require.False(t, errors.Is(&Error{Kind: ErrVersion}, ErrMalformed))
	for _, r := range []string{RefuseVersion, RefuseAuth, RefuseNotAllow, RefuseNamespace, RefuseGeometry, RefuseTransport, RefuseBusy, RefuseShutdown} {
		require.Equal(t, r, RefuseLabel(r))
	}
	require.Equal(t, ReasonOther, RefuseLabel("made-up\x00reason"))
}

func TestErrorNamesWhere(t *testing.T) {
	_, err := Decode(raw(kv{"v", Version, "op", "lookup", "e", 7, "round", 1, "keys", []any{[]any{"ns", fill(65, 1), 0}}}))
	var e *Error
	require.True(t, errors.As(err, &e))
	require.Equal(t, "lookup", e.Op)
	require.Equal(t, "keys", e.Field)
	require.Contains(t, err.Error(), "element 0")
}

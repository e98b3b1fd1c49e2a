package wire

import (
	"errors"
	"fmt"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvtier/kvtier/messages"
)

// Keys of one namespace and hash length travel packed and decode to the
// same keys; keys that cannot be packed travel as "keys" even when asked.
func TestPackedKeysRoundTrip(t *testing.T) {
	oneGroup := testKeys(5)
	for i := range oneGroup {
		oneGroup[i].Group = 7
	}
	mixedLen := testKeys(3)
	mixedLen[1].Hash += "x"
	mixedNS := testKeys(3)
	mixedNS[2].Namespace = "other"
	for name, tc := range map[string]struct {
		keys   []messages.Key
		packed bool
	}{
		"groups per key": {testKeys(2000), true},
		"one group":      {oneGroup, true},
		"hash lengths":   {mixedLen, false},
		"namespaces":     {mixedNS, false},
	} {
		t.Run(name, func(t *testing.T) {
			q := Request{Op: OpLookup, ID: 3, Req: &messages.ReqContext{RequestID: "r"}, Keys: tc.keys, PackedKeys: true}
			frame := EncodeRequest(&q)
			var raw map[string]any
			require.NoError(t, msgpack.Unmarshal(frame, &raw))
			_, hasPacked := raw["pkeys"]
			require.Equal(t, tc.packed, hasPacked, "sent packed")
			got, err := DecodeRequest(frame)
			require.NoError(t, err)
			require.Equal(t, tc.keys, got.Keys)
			require.Equal(t, tc.packed, got.PackedKeys)
		})
	}
}

// pkeys as an independent msgpack encoder (Python's) writes them decode:
// the group as any integer width, the groups big-endian.
func TestPackedKeysFromAThirdPartyEncoder(t *testing.T) {
	b, err := msgpack.Marshal(map[string]any{"v": 1, "op": "lookup", "id": 9, "req": map[string]any{"id": "r"},
		"pkeys": map[string]any{"ns": "ns", "hash_len": 2, "hashes": []byte("aabbcc"), "groups": []byte{0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0}}})
	require.NoError(t, err)
	q, err := DecodeRequest(b)
	require.NoError(t, err)
	require.Equal(t, []messages.Key{{Namespace: "ns", Hash: "aa", Group: 1}, {Namespace: "ns", Hash: "bb", Group: 256}, {Namespace: "ns", Hash: "cc"}}, q.Keys)
	b, err = msgpack.Marshal(map[string]any{"v": 1, "op": "touch", "id": 9, "req": map[string]any{"id": "r"},
		"pkeys": map[string]any{"group": uint8(3), "hashes": []byte("abcd"), "hash_len": uint64(4), "ns": ""}})
	require.NoError(t, err)
	q, err = DecodeRequest(b)
	require.NoError(t, err)
	require.Equal(t, []messages.Key{{Hash: "abcd", Group: 3}}, q.Keys)
}

func TestPackedKeysErrors(t *testing.T) {
	frame := func(pk any) []byte {
		b, err := msgpack.Marshal(map[string]any{"v": 1, "op": "lookup", "id": 5, "req": map[string]any{"id": "r"}, "pkeys": pk})
		require.NoError(t, err)
		return b
	}
	ok := func() map[string]any { return map[string]any{"ns": "n", "hash_len": 2, "hashes": []byte("aabb")} }
	with := func(k string, v any) map[string]any { m := ok(); m[k] = v; return m }
	without := func(k string) map[string]any { m := ok(); delete(m, k); return m }
	ping, err := msgpack.Marshal(map[string]any{"v": 1, "op": "ping", "id": 5, "pkeys": ok()})
	require.NoError(t, err)
	both, err := msgpack.Marshal(map[string]any{"v": 1, "op": "lookup", "id": 5, "req": map[string]any{"id": "r"}, "pkeys": ok(),
		"keys": []any{[]any{"n", []byte("aa"), 0}}})
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		frame []byte
		code  Code
		is    error
	}{
		"not a map":             {frame([]byte("aabb")), CodeBadRequest, messages.ErrBadRequest},
		"no namespace":          {frame(without("ns")), CodeBadRequest, messages.ErrBadRequest},
		"no hash_len":           {frame(without("hash_len")), CodeBadRequest, messages.ErrBadRequest},
		"no hashes":             {frame(without("hashes")), CodeBadRequest, messages.ErrBadRequest},
		"hash_len 0":            {frame(with("hash_len", 0)), CodeBadKey, messages.ErrBadKey},
		"hash_len 65":           {frame(with("hash_len", 65)), CodeBadKey, messages.ErrBadKey},
		"hash_len 2^40":         {frame(with("hash_len", uint64(1)<<40)), CodeBadKey, messages.ErrBadKey},
		"hashes not a multiple": {frame(with("hashes", []byte("aab"))), CodeBadRequest, messages.ErrBadRequest},
		"no hashes at all":      {frame(with("hashes", []byte{})), CodeBadRequest, messages.ErrBadRequest},
		"groups short":          {frame(with("groups", []byte{0, 0, 0, 1})), CodeBadRequest, messages.ErrBadRequest},
		"unknown field":         {frame(with("hash", 1)), CodeBadRequest, messages.ErrBadRequest},
		"group over uint32":     {frame(with("group", uint64(1)<<32)), CodeBadRequest, messages.ErrBadRequest},
		"keys and pkeys":        {both, CodeBadRequest, messages.ErrBadRequest},
		"op without keys":       {ping, CodeBadRequest, messages.ErrBadRequest},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeRequest(tc.frame)
			var de *DecodeError
			require.True(t, errors.As(err, &de), "%v", err)
			require.Equal(t, tc.code, de.Code, "%v", err)
			require.ErrorIs(t, err, tc.is)
		})
	}
	gg := ok()
	gg["group"], gg["groups"] = 1, []byte{0, 0, 0, 1, 0, 0, 0, 2}
	_, err = DecodeRequest(frame(gg))
	require.ErrorContains(t, err, "one or the other")
}

// BenchmarkDecodeLookup2000 decodes a 2,000-key Lookup with its keys as a
// list per key and packed: the daemon's share of a long prefix's call.
func BenchmarkDecodeLookup2000(b *testing.B) {
	keys := make([]messages.Key, 2000)
	for i := range keys {
		keys[i] = messages.Key{Namespace: ns, Hash: fmt.Sprintf("%032d", i)}
	}
	for _, packed := range []bool{false, true} {
		frame := EncodeRequest(&Request{Op: OpLookup, ID: 1, Req: &messages.ReqContext{RequestID: "r"}, Keys: keys, Prefix: true, PackedKeys: packed})
		b.Run(map[bool]string{false: "keys", true: "pkeys"}[packed], func(b *testing.B) { benchDecode(b, frame) })
	}
}

// benchDecode decodes frame b.N times, with its bytes and allocations.
func benchDecode(b *testing.B, frame []byte) {
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	for range b.N {
		if _, err := DecodeRequest(frame); err != nil {
			b.Fatal(err)
		}
	}
}

// Keys decoded from different calls, packed or listed, share one copy of
// their namespace, so the tiers' maps compare namespaces by pointer; a
// namespace of its own keeps its own bytes.
func TestDecodedNamespacesShareOneCopy(t *testing.T) {
	decode := func(packed bool, keys []messages.Key) messages.Namespace {
		frame := EncodeRequest(&Request{Op: OpLookup, ID: 1, Req: &messages.ReqContext{RequestID: "r"}, Keys: keys, PackedKeys: packed})
		q, err := DecodeRequest(frame)
		require.NoError(t, err)
		return q.Keys[0].Namespace
	}
	first, second := decode(true, testKeys(3)), decode(false, testKeys(2))
	require.Equal(t, first, second)
	require.Same(t, unsafe.StringData(string(first)), unsafe.StringData(string(second)), "two calls' keys hold two copies of one namespace")
	other := testKeys(1)
	other[0].Namespace = "another-model"
	require.Equal(t, messages.Namespace("another-model"), decode(true, other))
}

// BenchmarkDecodeStepBatch decodes one engine step's batch as the vLLM
// connector sends it: eight calls (lookups, a store's prepare and
// completion, touches) of six packed keys each, with request contexts that
// carry a parent hash and a block's tokens. Most engine calls are this
// small: what it costs is per call, not per key.
func BenchmarkDecodeStepBatch(b *testing.B) {
	keys := make([]messages.Key, 6)
	for i := range keys {
		keys[i] = messages.Key{Namespace: ns, Hash: fmt.Sprintf("%032d", i)}
	}
	req := &messages.ReqContext{RequestID: "request-0001", Workers: 1, BlockSize: 16,
		ParentBlockHash: []byte(keys[0].Hash), TokenIDs: make([]int32, 96)}
	ops := []Op{OpLookup, OpLookup, OpPrepareStore, OpCompleteStore, OpTouch, OpLookup, OpPrepareStore, OpCompleteStore}
	calls := make([]Call, len(ops))
	for i, op := range ops {
		q := &Request{Op: op, ID: uint64(i + 2), Req: req, Keys: keys, PackedKeys: true, OK: op == OpCompleteStore, Quiet: op == OpCompleteStore}
		calls[i] = Call{Req: q}
	}
	benchDecode(b, EncodeRequest(&Request{Op: OpBatch, ID: 1, Calls: calls}))
}

// Every name reqFields lists is one decodeReqField reads: a field added to
// the switch but not to the list would be refused as unknown.
func TestReqFieldsAreTheOnesDecoded(t *testing.T) {
	for _, name := range reqFields {
		r := reader{B: []byte{0xc0}} // nil: wrong for most fields, never unknown
		err := decodeReqField(&r, &messages.ReqContext{}, name)
		if err != nil {
			require.NotContains(t, err.Error(), "unknown field", name)
		}
	}
	require.ErrorContains(t, decodeReqField(&reader{B: []byte{0xc0}}, &messages.ReqContext{}, "no_such_field"), "unknown field")
}

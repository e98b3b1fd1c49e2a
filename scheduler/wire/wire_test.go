package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvtier/kvtier/messages"
)

var ns = messages.Namespace("0123456789abcdef")

func testKeys(n int) []messages.Key {
	out := make([]messages.Key, n)
	for i := range out {
		out[i] = messages.Key{Namespace: ns, Hash: fmt.Sprintf("hash-%08d", i), Group: uint32(i % 3)}
	}
	return out
}

// Every op round-trips through EncodeRequest and DecodeRequest.
func TestRequestRoundTrip(t *testing.T) {
	ctx := &messages.ReqContext{RequestID: "req-1", Workers: 4, TierFilter: []string{"cpu", "fs"}, PeerSources: []string{"node-b"},
		ParentBlockHash: []byte{1, 2, 3}, TokenIDs: []int32{1, -2, 1 << 30}, BlockSize: 16,
		LoRAID: -7, LoRAName: "adapter", ExtraKeys: []string{"salt"}}
	for _, q := range []Request{
		{Op: OpHello, ID: 1, Client: "engine-0"},
		{Op: OpHello, ID: 1, Client: "engine-1", BlockBytes: 4096, Topic: "kv@10.0.0.7@meta-llama/Llama-3.1-8B-Instruct"},
		{Op: OpPing, ID: 2},
		{Op: OpLookup, ID: 3, Req: ctx, Keys: testKeys(2000), Prefix: true, Timeout: 1500 * time.Millisecond},
		{Op: OpPrepareStore, ID: 4, Req: &messages.ReqContext{RequestID: "r"}, Keys: testKeys(3)},
		{Op: OpCompleteStore, ID: 5, Req: ctx, Keys: testKeys(1), OK: true},
		{Op: OpJobDone, ID: 6, Job: 1 << 40, Worker: 1023, OK: false},
		{Op: OpPause, ID: 7, Clear: true},
		{Op: OpRequestFinished, ID: 1<<64 - 1, Req: ctx},
		{Op: OpLookup, ID: 8, Req: ctx, Keys: testKeys(3), Prefix: true, WantSlots: true},
		{Op: OpGrant, ID: 9, N: MaxKeys},
		{Op: OpCompleteStore, ID: 11, Req: ctx, Keys: testKeys(2), OK: true, NoReply: true},
		{Op: OpStoreCredited, ID: 10, Req: ctx, Keys: testKeys(3), Slots: []int{7, 0, 1<<31 - 1}},
		{Op: OpPrepareLoad, ID: 12, Req: ctx, Keys: testKeys(2), Quiet: true},
		{Op: OpBatch, ID: 13, Calls: []Call{
			{Req: &Request{Op: OpLookup, ID: 14, Req: ctx, Keys: testKeys(2), WantSlots: true}},
			{Req: &Request{Op: OpCompleteStore, ID: 15, Req: ctx, Keys: testKeys(1), OK: true, Quiet: true}},
			{Req: &Request{Op: OpRequestFinished, ID: 16, Req: ctx, NoReply: true}},
		}},
	} {
		t.Run(q.Op.String(), func(t *testing.T) {
			got, err := DecodeRequest(EncodeRequest(&q))
			require.NoError(t, err)
			require.Equal(t, q, *got)
		})
	}
}

// A request encoded by a third-party msgpack library (as Python's would be)
// decodes; integer widths are the encoder's business.
func TestDecodesThirdPartyEncoding(t *testing.T) {
	b, err := msgpack.Marshal(map[string]any{"v": uint64(1), "op": "job_done", "id": int64(9),
		"job": uint32(77), "worker": int8(2), "ok": true, "timeout_ms": 250})
	require.NoError(t, err)
	q, err := DecodeRequest(b)
	require.NoError(t, err)
	require.Equal(t, Request{Op: OpJobDone, ID: 9, Job: 77, Worker: 2, OK: true, Timeout: 250 * time.Millisecond}, *q)
}

func TestDecodeErrorsCarryTheirCodeAndID(t *testing.T) {
	pack := func(v any) []byte { b, _ := msgpack.Marshal(v); return b }
	for _, tc := range []struct {
		name  string
		frame []byte
		code  Code
		hasID bool
		is    error
	}{
		{"empty", nil, CodeBadRequest, false, messages.ErrBadRequest},
		{"trailing bytes", append(pack(map[string]any{"v": 1, "op": "ping", "id": 1}), 0xc0), CodeBadRequest, true, messages.ErrBadRequest},
		{"version", pack(map[string]any{"id": 5, "op": "ping", "v": 9}), CodeBadVersion, true, messages.ErrProtocolVersion},
		{"op", pack(map[string]any{"v": 1, "op": "nope", "id": 5}), CodeUnknownOp, true, messages.ErrUnknownOp},
		{"float id", pack(map[string]any{"v": 1, "op": "ping", "id": 1.5}), CodeBadRequest, false, messages.ErrBadRequest},
		{"negative worker", pack(map[string]any{"v": 1, "op": "job_done", "id": 5, "job": 1, "worker": -1, "ok": true}), CodeBadRequest, true, messages.ErrBadRequest},
		{"field of another op", pack(map[string]any{"v": 1, "op": "ping", "id": 5, "clear": true}), CodeBadRequest, true, messages.ErrBadRequest},
		{"hello without a reply", pack(map[string]any{"v": 1, "op": "hello", "id": 5, "noreply": true}), CodeBadRequest, true, messages.ErrBadRequest},
		{"grant too large", pack(map[string]any{"v": 1, "op": "grant", "id": 5, "n": MaxKeys + 1}), CodeBadRequest, true, messages.ErrBadRequest},
		{"store without slots", pack(map[string]any{"v": 1, "op": "store", "id": 5, "req": map[string]any{"id": "r"}, "keys": []any{}}), CodeBadRequest, true, messages.ErrBadRequest},
		{"negative slot", pack(map[string]any{"v": 1, "op": "store", "id": 5, "req": map[string]any{"id": "r"}, "keys": []any{}, "slots": []int{-1}}), CodeBadRequest, true, messages.ErrBadRequest},
		{"tokens not int32s", pack(map[string]any{"v": 1, "op": "request_finished", "id": 5, "req": map[string]any{"id": "r", "tokens": []byte{1, 2, 3}}}), CodeBadRequest, true, messages.ErrBadRequest},
		{"empty request id", pack(map[string]any{"v": 1, "op": "request_finished", "id": 5, "req": map[string]any{"id": ""}}), CodeBadRequest, true, messages.ErrBadRequest},
		// Field order is fixed by hand: map {"v":1, "zzz":1, "op":"ping", "id":7}.
		{"unknown field before id", []byte{0x84, 0xa1, 'v', 0x01, 0xa3, 'z', 'z', 'z', 0x01, 0xa2, 'o', 'p', 0xa4, 'p', 'i', 'n', 'g', 0xa2, 'i', 'd', 0x07}, CodeBadRequest, true, messages.ErrBadRequest},
		{"repeated field before id", []byte{0x85, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0xa8, 'j', 'o', 'b', '_', 'd', 'o', 'n', 'e', 0xa3, 'j', 'o', 'b', 0x01, 0xa3, 'j', 'o', 'b', 0x02, 0xa2, 'i', 'd', 0x07}, CodeBadRequest, true, messages.ErrBadRequest},
		{"array length beyond the frame", []byte{0x83, 0xa1, 'v', 0x01, 0xa2, 'i', 'd', 0x05, 0xa4, 'k', 'e', 'y', 's', 0xdd, 0x7f, 0xff, 0xff, 0xff}, CodeBadRequest, true, messages.ErrBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeRequest(tc.frame)
			var de *DecodeError
			require.True(t, errors.As(err, &de), "%v", err)
			require.Equal(t, tc.code, de.Code, "%v", err)
			require.Equal(t, tc.hasID, de.HasID, "%v", err)
			require.ErrorIs(t, err, tc.is)
		})
	}
}

// Every sentinel crosses the wire and back: errors.Is holds in the client.
func TestErrorCodesMapBackToSentinels(t *testing.T) {
	for _, c := range codes {
		err := fmt.Errorf("context: %w", c.err)
		frame := EncodeError(42, err)
		rp, derr := DecodeReply(frame, OpLookup)
		require.NoError(t, derr)
		require.Equal(t, uint64(42), rp.ID)
		require.NotNil(t, rp.Err)
		require.Equal(t, c.code, rp.Err.Code)
		require.ErrorIs(t, rp.Err, c.err)
	}
	require.Equal(t, CodeInternal, CodeOf(errors.New("something else")))
}

func TestReplyRoundTrip(t *testing.T) {
	ev := []messages.Event{{Kind: messages.BlockStored, Keys: testKeys(2), Medium: messages.MediumCPU,
		Ctx: &messages.ReqContext{RequestID: "\x1es3\x1freq-9", TokenIDs: []int32{5}}, At: time.Unix(0, 12345)}}
	rp := &Reply{ID: 7, Status: []messages.LookupStatus{messages.Hit, messages.Miss, messages.Retry},
		Job: 9, Slots: []int{0, 5}, Workers: 2, ToStore: testKeys(2), Evicted: testKeys(1), Events: ev,
		Pending: true, Stats: messages.Stats{Slots: 10, Paused: true, Evictions: 1 << 40, SessionOpen: 3, Sessions: 1,
			Engines: []messages.EngineSession{{ID: 4, Client: "vllm-scheduler", Topic: "kv@10.0.0.7@llama", Namespace: ns, BlockBytes: 4 << 20,
				Since: time.Unix(0, 99), Calls: 7, Lookups: 5, Hits: 2, Open: 1, InFlight: 3}},
			PoolBytes: 3 << 33, CommittedBytes: 1 << 33, UsedBytes: 1 << 32,
			Geometries: []messages.GeometryStats{{BlockBytes: 4096, Slots: 10, Committed: 4, Free: 1, Ready: 3},
				{BlockBytes: 12288, Slots: 3, Committed: 1, Ready: 1}}},
		Bound: []bool{true, false, true}}
	strip := func(s string) string { return s[len("\x1es3\x1f"):] }
	for _, op := range []Op{OpLookup, OpPrepareStore, OpTakeEvents, OpHasPendingWork, OpStats, OpGrant, OpStoreCredited} {
		got, err := DecodeReply(EncodeReply(op, rp, strip), op)
		require.NoError(t, err, op)
		switch op {
		case OpLookup:
			require.Equal(t, rp.Status, got.Status)
			require.Equal(t, rp.Slots, got.Slots, "a HIT's slot, with want_slots")
		case OpGrant:
			require.Equal(t, []any{rp.Slots, rp.Evicted}, []any{got.Slots, got.Evicted})
		case OpStoreCredited:
			require.Equal(t, []any{rp.Job, rp.Workers, rp.Bound}, []any{got.Job, got.Workers, got.Bound})
		case OpPrepareStore:
			require.Equal(t, []any{rp.Job, rp.Slots, rp.Workers, rp.ToStore, rp.Evicted}, []any{got.Job, got.Slots, got.Workers, got.ToStore, got.Evicted})
		case OpTakeEvents:
			require.Len(t, got.Events, 1)
			require.Equal(t, "req-9", got.Events[0].Ctx.RequestID, "session prefix stripped")
			require.Equal(t, ev[0].Keys, got.Events[0].Keys)
			require.True(t, ev[0].At.Equal(got.Events[0].At))
		case OpHasPendingWork:
			require.True(t, got.Pending)
		case OpStats:
			require.Equal(t, rp.Stats, got.Stats)
		}
	}
	h := Hello{Protocol: 1, Session: 3, PoolPath: "/dev/shm/x", BlockBytes: 4096, Slots: 8, Namespace: ns,
		Heartbeat: time.Second, Grace: 3 * time.Second, MaxKeys: MaxKeys, MaxFrameBytes: MaxFrameBytes, JobWorkers: 2, PackedKeys: true,
		IndexPath: "/dev/shm/x.index", IndexComplete: true, Credit: true}
	got, err := DecodeReply(EncodeReply(OpHello, &Reply{ID: 1, Hello: h}, nil), OpHello)
	require.NoError(t, err)
	require.Equal(t, h, got.Hello)
}

// The engine path's replies, key lists included, are written into the one
// buffer sized before encoding (two allocations: it and its writer, which
// the op table's encoder takes): a hint that misses the keys grows it.
func TestEnginePathRepliesEncodeInOneAllocation(t *testing.T) {
	keys := make([]messages.Key, 40)
	for i := range keys {
		keys[i] = messages.Key{Namespace: ns, Hash: strings.Repeat("h", 32), Group: 1 << 20}
	}
	slots := []int{1 << 20, 2 << 20, 3 << 20}
	for _, tc := range []struct {
		op Op
		rp Reply
	}{
		{OpGrant, Reply{ID: 1 << 40, Slots: slots, Evicted: keys}},
		{OpPrepareStore, Reply{ID: 1 << 40, Job: 1 << 40, Slots: slots, Workers: 8, ToStore: keys, Evicted: keys}},
		{OpStoreCredited, Reply{ID: 1 << 40, Job: 1 << 40, Workers: 8, Bound: make([]bool, 40)}},
		{OpLookup, Reply{ID: 1 << 40, Status: make([]messages.LookupStatus, 40), Slots: make([]int, 40)}},
	} {
		allocs := testing.AllocsPerRun(20, func() { EncodeReply(tc.op, &tc.rp, nil) })
		require.Equal(t, 2.0, allocs, "%v: allocations", tc.op)
	}
}

// A batch's calls decode one by one: a bad call is an error of its own,
// with its id where it was read, and its neighbours still decode. A batch
// inside a batch, and noreply or quiet on a batch or a hello, are refused.
func TestBatchDecodesEachCallOnItsOwn(t *testing.T) {
	good := EncodeRequest(&Request{Op: OpTouch, ID: 2, Req: &messages.ReqContext{RequestID: "r"}, Keys: testKeys(1), Quiet: true})
	unknownOp, err := msgpack.Marshal(map[string]any{"v": 1, "op": "teleport", "id": 3})
	require.NoError(t, err)
	nested := EncodeRequest(&Request{Op: OpBatch, ID: 4, Calls: []Call{{Req: &Request{Op: OpPing, ID: 5}}}})
	frame := []byte{0x83, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0xa5, 'b', 'a', 't', 'c', 'h', 0xa2, 'i', 'd', 0x01,
		0xa5, 'c', 'a', 'l', 'l', 's', 0x93}
	frame[0] = 0x84
	frame = append(append(append(frame, good...), unknownOp...), nested...)
	q, err := DecodeRequest(frame)
	require.NoError(t, err)
	require.Len(t, q.Calls, 3)
	require.NoError(t, q.Calls[0].Err)
	require.True(t, q.Calls[0].Req.Quiet)
	require.False(t, q.Calls[0].Req.Replies())
	require.True(t, q.Calls[0].Req.RepliesOnError())
	var de *DecodeError
	require.ErrorAs(t, q.Calls[1].Err, &de)
	require.Equal(t, CodeUnknownOp, de.Code)
	require.True(t, de.HasID)
	require.EqualValues(t, 3, de.ID, "the error names the bad call, not the batch")
	require.ErrorAs(t, q.Calls[2].Err, &de)
	require.Equal(t, CodeBadRequest, de.Code)
	require.EqualValues(t, 4, de.ID)

	for _, m := range []map[string]any{
		{"v": 1, "op": "hello", "id": 1, "quiet": true},
		{"v": 1, "op": "batch", "id": 1, "calls": []any{}, "noreply": true},
		{"v": 1, "op": "batch", "id": 1},
	} {
		b, err := msgpack.Marshal(m)
		require.NoError(t, err)
		_, err = DecodeRequest(b)
		require.ErrorAs(t, err, &de, "%v", m)
		require.Equal(t, CodeBadRequest, de.Code, "%v", m)
	}
}

// An error reply names the op when the endpoint knows it (a quiet call's
// caller reads nothing else); a client that does not know the field skips it.
func TestCallErrorNamesItsOp(t *testing.T) {
	frame := EncodeCallError(7, OpPrepareLoad, fmt.Errorf("%w: not held", messages.ErrUnknownKey))
	var m map[string]any
	require.NoError(t, msgpack.Unmarshal(frame, &m))
	require.Equal(t, "prepare_load", m["err"].(map[string]any)["op"])
	rp, err := DecodeReply(frame, OpPrepareLoad)
	require.NoError(t, err)
	require.EqualValues(t, 7, rp.ID)
	require.NotNil(t, rp.Err)
}

// FuzzDecodeRequest: no input panics, hangs or allocates beyond its frame;
// whatever decodes re-encodes to a frame that decodes to the same request.
// Seed corpus: testdata/fuzz/FuzzDecodeRequest (written by
// TestWriteFuzzCorpus when KVTIER_WRITE_CORPUS=1).
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range corpusSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		q, err := DecodeRequest(frame)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("decode error of type %T: %v", err, err)
			}
			return
		}
		again, err := DecodeRequest(EncodeRequest(q))
		if err != nil {
			t.Fatalf("re-encoded request does not decode: %v", err)
		}
		require.Equal(t, sameCalls(q), sameCalls(again))
	})
}

// sameCalls blurs a batch's call errors into one value: a call that did not
// decode re-encodes as nil, which does not decode either, with another
// message.
func sameCalls(q *Request) *Request {
	for i := range q.Calls {
		if q.Calls[i].Err != nil {
			q.Calls[i] = Call{Err: errBadCall}
		}
	}
	return q
}

var errBadCall = errors.New("a call that did not decode")

func corpusSeeds() [][]byte {
	ctx := &messages.ReqContext{RequestID: "r", TokenIDs: []int32{1, 2}, ParentBlockHash: []byte{9}}
	ctx033 := &messages.ReqContext{RequestID: "s", SpecKind: "sliding_window", SlidingWindow: 4096, SessionID: "chat-1"}
	var seeds [][]byte
	for _, q := range []Request{
		{Op: OpHello, ID: 1, Client: "x"}, {Op: OpLookup, ID: 2, Req: ctx, Keys: testKeys(3), Prefix: true},
		{Op: OpJobDone, ID: 3, Job: 4, Worker: 1, OK: true}, {Op: OpPause, ID: 4, Clear: true},
		{Op: OpCompleteStore, ID: 5, Req: ctx, Keys: testKeys(1), OK: true, Timeout: time.Second},
		{Op: OpPrepareStore, ID: 6, Req: ctx033, Keys: testKeys(2)},
		{Op: OpLookup, ID: 7, Req: ctx, Keys: testKeys(3), PackedKeys: true},
		{Op: OpTouch, ID: 8, Req: ctx, Keys: testKeys(1), PackedKeys: true},
		{Op: OpLookup, ID: 9, Req: ctx, Keys: testKeys(2), PackedKeys: true, WantSlots: true},
		{Op: OpGrant, ID: 10, N: 64},
		{Op: OpStoreCredited, ID: 11, Req: ctx, Keys: testKeys(2), Slots: []int{3, 4}, PackedKeys: true},
		{Op: OpBatch, ID: 12, Calls: []Call{{Req: &Request{Op: OpTouch, ID: 13, Req: ctx, Keys: testKeys(1), PackedKeys: true, Quiet: true}},
			{Req: &Request{Op: OpGrant, ID: 14, N: 8}}}},
	} {
		seeds = append(seeds, EncodeRequest(&q))
	}
	return append(seeds, []byte{}, []byte{0x80}, []byte{0xdf, 0xff, 0xff, 0xff, 0xff}, []byte("\x83\xa1v\x01\xa2op\xa4ping\xa2id\xcf"))
}

// TestWriteFuzzCorpus regenerates the checked-in seed corpus.
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("KVTIER_WRITE_CORPUS") == "" {
		t.Skip("set KVTIER_WRITE_CORPUS=1 to rewrite testdata/fuzz/FuzzDecodeRequest")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeRequest")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for i, s := range corpusSeeds() {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644))
	}
}

func TestStreamFrames(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, WriteFrame(&buf, []byte("abc")))
	require.NoError(t, WriteFrame(&buf, []byte{0xc0}))
	require.Equal(t, []byte{0, 0, 0, 3, 'a', 'b', 'c', 0, 0, 0, 1, 0xc0}, buf.Bytes(), "u32 big-endian length, then the frame")
	for _, want := range [][]byte{[]byte("abc"), {0xc0}} {
		got, err := ReadFrame(&buf)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err := ReadFrame(&buf)
	require.ErrorIs(t, err, io.EOF, "EOF at a frame boundary is the stream's end")

	for name, in := range map[string][]byte{
		"zero length":  {0, 0, 0, 0},
		"over the max": binary.BigEndian.AppendUint32(nil, MaxFrameBytes+1),
	} {
		_, err := ReadFrame(bytes.NewReader(in))
		require.ErrorIs(t, err, messages.ErrBadRequest, name)
	}
	_, err = ReadFrame(bytes.NewReader([]byte{0, 0, 0, 5, 1, 2}))
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "a frame cut short")
	require.ErrorIs(t, WriteFrame(io.Discard, nil), messages.ErrBadRequest)
}

func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0xc0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		frame, err := ReadFrame(bytes.NewReader(b))
		if err != nil {
			return
		}
		var out bytes.Buffer
		require.NoError(t, WriteFrame(&out, frame))
		require.Equal(t, b[:4+len(frame)], out.Bytes(), "a frame read writes back as it came")
	})
}

// The field table has one row per field bit but pkeys (which stands in for
// keys), in bit order: the order the encoder writes and the decoder checks.
func TestFieldTableCoversEveryField(t *testing.T) {
	want := fTimeout
	for _, fs := range requestFields {
		if want == fPKeys {
			want <<= 1
		}
		require.Equal(t, want, fs.f, "row %q", fs.name)
		require.Equal(t, fs.f, fieldByName[fs.name])
		require.NotNil(t, fs.set, fs.name)
		require.NotNil(t, fs.encode, fs.name)
		require.NotNil(t, fs.decode, fs.name)
		want <<= 1
	}
	require.Equal(t, fTopic<<1, want, "a field without a row")
}

// A stats reply from anywhere decodes or fails cleanly, never panics, and
// one that decodes encodes back to what decodes the same (the engine
// sessions' list included).
func FuzzDecodeStatsReply(f *testing.F) {
	f.Add(EncodeReply(OpStats, &Reply{ID: 1, Stats: messages.Stats{Slots: 3, Sessions: 1,
		Engines: []messages.EngineSession{{ID: 2, Client: "c", Namespace: "n", Calls: 1}}}}, nil))
	f.Add(EncodeReply(OpStats, &Reply{ID: 1}, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		rp, err := DecodeReply(b, OpStats)
		if err != nil || rp.Err != nil {
			return
		}
		again, err := DecodeReply(EncodeReply(OpStats, rp, nil), OpStats)
		require.NoError(t, err)
		require.Equal(t, rp.Stats, again.Stats)
	})
}

package events

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/internal/testutil/testclose"
	"github.com/kvtier/kvtier/internal/testutil/testleak"
	"github.com/kvtier/kvtier/messages"
)

func TestMain(m *testing.M) { testleak.VerifyTestMain(m) }

func key(h string, g uint32) messages.Key { return messages.Key{Namespace: "ns", Hash: h, Group: g} }

func TestWireHashIsLow64BitsBigEndian(t *testing.T) {
	assert.Equal(t, uint64(0x0102), WireHash("\x01\x02", HashInt).Int)
	long := "\xff\xff\x00\x00\x00\x00\x00\x00\x00\x2a"
	assert.Equal(t, uint64(42), WireHash(long, HashInt).Int, "only the last 8 bytes count")
	b := WireHash("abc", HashBytes)
	assert.True(t, b.IsBytes)
	assert.Equal(t, []byte("abc"), b.Bytes)
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	g, lora := uint32(3), int64(7)
	parent := Hash{Int: 9}
	in := Batch{TS: 1700000000.25, DPRank: 2, HasDPRank: true, Events: []Event{
		{Type: TypeBlockStored, BlockHashes: []Hash{{Int: 10}, {Int: 11}}, Parent: &parent,
			TokenIDs: []int32{1, 2, 3, 4}, BlockSize: 2, LoRAID: &lora, Medium: "CPU", LoRAName: "ad",
			ExtraKeys: [][]string{{"salt"}, {"salt"}}, GroupIdx: &g, Locality: "LOCAL", Ownership: "fs"},
		{Type: TypeBlockStored, BlockHashes: []Hash{{Bytes: []byte{1, 2}, IsBytes: true}}, TokenIDs: []int32{5, 6}, BlockSize: 2},
		{Type: TypeBlockRemoved, BlockHashes: []Hash{{Int: 10}}, Medium: "CPU", GroupIdx: &g},
		{Type: TypeAllBlocksCleared},
	}}
	payload, err := EncodeBatch(&in)
	require.NoError(t, err)
	out, err := DecodeBatch(payload)
	require.NoError(t, err)
	assert.Equal(t, in, *out)

	// The optional fields are absent, the always-present ones nil.
	var generic []any
	require.NoError(t, msgpack.Unmarshal(payload, &generic))
	stored := generic[1].([]any)[1].(map[string]any)
	assert.Len(t, stored, 8, "type + fields 1-7")
	for _, f := range []string{"parent_block_hash", "lora_id", "medium", "lora_name"} {
		v, present := stored[f]
		assert.True(t, present, f)
		assert.Nil(t, v, f)
	}
	assert.NotContains(t, stored, "group_idx")
	assert.Equal(t, map[string]any{"type": "AllBlocksCleared"}, generic[1].([]any)[3])
}

func TestDecodeLegacyAndMapForms(t *testing.T) {
	// vLLM ≤ 0.9: array batch of two, array events tagged by their first element.
	legacy, err := msgpack.Marshal([]any{1.5, []any{
		[]any{"BlockStored", []any{uint64(1), int64(-2)}, nil, []any{1, 2, 3, 4}, 2, nil},
		[]any{"BlockRemoved", []any{uint64(1)}},
		[]any{"AllBlocksCleared"},
	}})
	require.NoError(t, err)
	b, err := DecodeBatch(legacy)
	require.NoError(t, err)
	assert.False(t, b.HasDPRank)
	require.Len(t, b.Events, 3)
	assert.Equal(t, []Hash{{Int: 1}, {Int: ^uint64(1)}}, b.Events[0].BlockHashes)
	assert.Equal(t, []int32{1, 2, 3, 4}, b.Events[0].TokenIDs)
	assert.Equal(t, 2, b.Events[0].BlockSize)
	assert.Equal(t, TypeBlockRemoved, b.Events[1].Type)
	assert.Equal(t, TypeAllBlocksCleared, b.Events[2].Type)

	// Newest vLLM: the batch is a map too; unknown keys are skipped.
	newer, err := msgpack.Marshal(map[string]any{"ts": 2, "data_parallel_rank": 1, "events": []any{
		map[string]any{"type": "BlockRemoved", "block_hashes": []any{5}, "medium": "GPU", "kv_cache_spec_kind": "full"},
	}})
	require.NoError(t, err)
	b, err = DecodeBatch(newer)
	require.NoError(t, err)
	assert.Equal(t, 2.0, b.TS)
	assert.Equal(t, int64(1), b.DPRank)
	assert.Equal(t, "GPU", b.Events[0].Medium)

	for name, bad := range map[string]any{
		"scalar":        5,
		"short batch":   []any{1.0},
		"untyped event": []any{1.0, []any{map[string]any{"block_hashes": []any{}}}},
		"bad tokens":    []any{1.0, []any{map[string]any{"type": "BlockStored", "token_ids": "x"}}},
	} {
		p, err := msgpack.Marshal(bad)
		require.NoError(t, err)
		_, err = DecodeBatch(p)
		assert.ErrorIs(t, err, ErrMalformed, name)
	}
	_, err = DecodeBatch(append(legacy, 0xc0))
	assert.ErrorIs(t, err, ErrMalformed, "trailing bytes")
}

func ctxOf(blocks int, parent string) *messages.ReqContext {
	toks := make([]int32, blocks*2)
	for i := range toks {
		toks[i] = int32(100 + i)
	}
	return &messages.ReqContext{RequestID: "r", BlockSize: 2, TokenIDs: toks, ParentBlockHash: []byte(parent)}
}

func TestTranslatorSplitsStoredRunsAtGapsAndGroups(t *testing.T) {
	tr := NewTranslator(HashBytes)
	call := []messages.Key{key("a", 0), key("b", 0), key("c", 0), key("d", 0)}
	// b was already present (skipped by the store): a | c d.
	stored := []messages.Key{call[0], call[2], call[3]}
	ev := &messages.Event{Kind: messages.BlockStored, Medium: messages.MediumCPU, Keys: stored,
		Ctx: ctxOf(4, "p"), Place: messages.Place(call, stored, []byte("p"))}
	out := tr.Apply(ev)
	require.Len(t, out, 2)
	assert.Equal(t, []Hash{WireHash("a", HashBytes)}, out[0].BlockHashes)
	assert.Equal(t, WireHash("p", HashBytes), *out[0].Parent)
	assert.Equal(t, []int32{100, 101}, out[0].TokenIDs)
	assert.Equal(t, []Hash{WireHash("c", HashBytes), WireHash("d", HashBytes)}, out[1].BlockHashes)
	assert.Equal(t, WireHash("b", HashBytes), *out[1].Parent, "the skipped key is the parent")
	assert.Equal(t, []int32{104, 105, 106, 107}, out[1].TokenIDs)
	assert.Zero(t, tr.Placeholders)

	// Without provenance: one placeholder event per key, no parent claimed.
	out = tr.Apply(&messages.Event{Kind: messages.BlockStored, Medium: messages.MediumCPU,
		Keys: []messages.Key{key("x", 1), key("y", 1)}})
	require.Len(t, out, 2)
	assert.Nil(t, out[0].Parent)
	assert.Empty(t, out[0].TokenIDs)
	assert.Equal(t, uint64(2), tr.Placeholders)
}

func TestTranslatorAnnouncesFirstAndLastCopyPerMedium(t *testing.T) {
	tr := NewTranslator(HashInt)
	k := key("\x01", 0)
	one := []messages.Key{k}
	place := messages.Place(one, one, nil)
	store := func(med, owner string) []Event {
		return tr.Apply(&messages.Event{Kind: messages.BlockStored, Medium: med, Ownership: owner,
			Keys: one, Ctx: ctxOf(1, ""), Place: place})
	}
	remove := func(med, owner string) []Event {
		return tr.Apply(&messages.Event{Kind: messages.BlockRemoved, Medium: med, Ownership: owner, Keys: one})
	}
	assert.Len(t, store("STORAGE", "fs"), 1)
	assert.Empty(t, store("STORAGE", "obj"), "second copy in the medium: nothing new")
	assert.Len(t, store("CPU", ""), 1, "another medium is announced")
	assert.Empty(t, remove("STORAGE", "fs"), "obj still holds it")
	out := remove("STORAGE", "obj")
	require.Len(t, out, 1)
	assert.Equal(t, TypeBlockRemoved, out[0].Type)
	assert.Equal(t, "STORAGE", out[0].Medium)
	assert.Empty(t, remove("STORAGE", "obj"))
	assert.Equal(t, uint64(1), tr.UnknownRemovals)
	assert.Equal(t, map[string][]messages.Key{"CPU": one}, tr.Inventory())

	// Clearing CPU while STORAGE holds something is removals; clearing the
	// last medium is AllBlocksCleared.
	assert.Len(t, store("STORAGE", "fs"), 1)
	out = tr.Apply(&messages.Event{Kind: messages.AllBlocksCleared, Medium: "CPU"})
	require.Len(t, out, 1)
	assert.Equal(t, TypeBlockRemoved, out[0].Type)
	out = tr.Apply(&messages.Event{Kind: messages.AllBlocksCleared, Medium: "STORAGE", Ownership: "fs"})
	assert.Equal(t, []Event{{Type: TypeAllBlocksCleared}}, out)
	assert.Empty(t, tr.Inventory())
}

type chanSink chan Entry

func (c chanSink) Publish(e Entry) { c <- e }

func TestRingKeepsNewestWithinBounds(t *testing.T) {
	r := ring{maxN: 3, maxBytes: 10}
	for i := range uint64(5) {
		r.add(Entry{Seq: i, Payload: []byte{1, 2}})
	}
	got := r.from(0)
	require.Len(t, got, 3)
	assert.Equal(t, uint64(2), got[0].Seq)
	assert.Len(t, r.from(4), 1)
	assert.Empty(t, r.from(5))
	r.add(Entry{Seq: 5, Payload: make([]byte, 9)})
	assert.Len(t, r.from(0), 1, "the byte bound keeps only the newest")
}

// listen starts a publisher on loopback ephemeral ports.
func listen(t *testing.T, buffer int) *Publisher {
	t.Helper()
	return listenUntilCleanup(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0",
		Topic: "kv@t@m", BufferBatches: buffer, Linger: -1, Log: zerolog.Nop()})
}

// listenUntilCleanup starts a publisher with cfg, closed when the test
// ends.
func listenUntilCleanup(t *testing.T, cfg PublisherConfig) *Publisher {
	t.Helper()
	p, err := Listen(cfg)
	require.NoError(t, err)
	testclose.AtCleanup(t, 5*time.Second, p.Close)
	return p
}

// publishSeqs publishes batches 0 to n-1, each payload its own sequence
// number.
func publishSeqs(p *Publisher, n uint64) {
	for i := range n {
		p.Publish(Entry{Seq: i, Payload: []byte{byte(i)}})
	}
}

func TestPublisherReplaysBufferThenTerminator(t *testing.T) {
	p := listen(t, 4)
	publishSeqs(p, 6)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var seqs []uint64
	require.NoError(t, Replay(ctx, p.ReplayEndpoint(), 0, func(seq uint64, payload []byte) error {
		assert.Equal(t, []byte{byte(seq)}, payload)
		seqs = append(seqs, seq)
		return nil
	}))
	assert.Equal(t, []uint64{2, 3, 4, 5}, seqs, "the newest 4 batches")
	seqs = nil
	require.NoError(t, Replay(ctx, p.ReplayEndpoint(), 5, func(seq uint64, _ []byte) error {
		seqs = append(seqs, seq)
		return nil
	}))
	assert.Equal(t, []uint64{5}, seqs)

	// A raw request: frames as vLLM's subscriber sends and expects them
	// (vLLM ≥ 0.32's ZmqEventPublisher._service_replay: ["", topic, seq,
	// payload], then ["", "", END_SEQ, ""]).
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	require.NoError(t, d.Dial(p.ReplayEndpoint()))
	require.NoError(t, d.Send(zmq4.NewMsgFrom([]byte{}, []byte{0, 0, 0, 0, 0, 0, 0, 5})))
	m, err := d.Recv()
	require.NoError(t, err)
	require.Len(t, m.Frames, 4)
	assert.Empty(t, m.Frames[0])
	assert.Equal(t, "kv@t@m", string(m.Frames[1]), "the topic, as on the PUB socket")
	assert.Equal(t, uint64(5), binary.BigEndian.Uint64(m.Frames[2]))
	assert.Equal(t, []byte{5}, m.Frames[3])
	m, err = d.Recv()
	require.NoError(t, err)
	require.Len(t, m.Frames, 4)
	assert.Empty(t, m.Frames[0])
	assert.Empty(t, m.Frames[1])
	assert.Equal(t, EndSeq, binary.BigEndian.Uint64(m.Frames[2]), "then the terminator")
	assert.Empty(t, m.Frames[3])
	// A malformed request is dropped and counted, the socket keeps serving.
	// NB: the good request follows on the same connection, whose requests
	// are read in order: by its terminator the bad one has been counted
	// (another connection's request could be read before it).
	require.NoError(t, d.Send(zmq4.NewMsgFrom([]byte{}, []byte{1})))
	require.NoError(t, d.Send(zmq4.NewMsgFrom([]byte{}, []byte{0, 0, 0, 0, 0, 0, 0, 4})))
	var after []uint64
	for {
		m, err = d.Recv()
		require.NoError(t, err)
		require.Len(t, m.Frames, 4)
		seq := binary.BigEndian.Uint64(m.Frames[2])
		if seq == EndSeq {
			break
		}
		after = append(after, seq)
	}
	assert.Equal(t, []uint64{4, 5}, after, "served after the malformed request")
	assert.Equal(t, uint64(1), p.BadRequests.Load())
	require.NoError(t, Replay(ctx, p.ReplayEndpoint(), 4, func(uint64, []byte) error { return nil }))
}

func TestHubBatchesAndNumbersFromZero(t *testing.T) {
	sink := make(chanSink, 16)
	hubEvents := []*messages.Event{}
	call := []messages.Key{key("a", 0), key("b", 0)}
	hubEvents = append(hubEvents,
		&messages.Event{Kind: messages.BlockStored, Medium: "CPU", Keys: call, Ctx: ctxOf(2, ""), Place: messages.Place(call, call, nil)},
		&messages.Event{Kind: messages.BlockRemoved, Medium: "CPU", Keys: call[:1]})
	h := &Hub{cfg: HubConfig{Sink: sink, MaxBatchEvents: 1, Now: time.Now, Counters: &Counters{}, Log: zerolog.Nop()},
		st: &hubState{tr: NewTranslator(HashInt), flushQueued: true}}
	for _, e := range hubEvents {
		h.apply(nil, e) // flushQueued: apply sends nothing to itself
	}
	// MaxBatchEvents 1: each event closed its batch.
	for want := range uint64(2) {
		e := <-sink
		assert.Equal(t, want, e.Seq)
		b, err := DecodeBatch(e.Payload)
		require.NoError(t, err)
		assert.Len(t, b.Events, 1)
	}
	assert.Equal(t, uint64(2), h.cfg.Counters.Batches.Load())
}

// The publisher blocks on its inputs: it wakes once per batch or replay
// request and never on its own. A polling loop (a 100 ms ticker) would wake
// several times during the observation window below; the window is not a
// synchronisation, it is the measurement.
func TestPublisherHasNoIdleWakeups(t *testing.T) {
	p := listen(t, 16)
	publishSeqs(p, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := 0
	require.NoError(t, Replay(ctx, p.ReplayEndpoint(), 0, func(uint64, []byte) error { n++; return nil }))
	require.Equal(t, 3, n, "the replay sees every batch published before it")
	woke := p.Wakeups.Load()
	require.True(t, woke >= 1 && woke <= 4, "3 batches and 1 replay request: %d wakeups", woke)
	idle := time.NewTimer(500 * time.Millisecond)
	defer idle.Stop()
	<-idle.C
	assert.Equal(t, woke, p.Wakeups.Load(), "no wakeup while idle")
}

// A batch gathers every event that arrives within its window: a burst of
// stores is one batch (as vLLM publishes one per engine step), not one each.
// The window here is an hour, so the batch closes only on Flush: nothing in
// the test depends on how fast the events come.
func TestHubGathersEventsWithinItsWindowIntoOneBatch(t *testing.T) {
	sink := make(chanSink, 16)
	system := actors.NewSystem(zerolog.Nop())
	defer system.Shutdown()
	pid := system.Root.Spawn(HubProps(HubConfig{Format: HashInt, Sink: sink, BatchWindow: time.Hour, Log: zerolog.Nop()}))
	const n = 50
	for i := range n {
		k := key(string(rune('A'+i)), 0)
		system.Root.Send(pid, &messages.Event{Kind: messages.BlockStored, Medium: "CPU", Keys: []messages.Key{k},
			Ctx: ctxOf(1, ""), Place: messages.Place([]messages.Key{k}, []messages.Key{k}, nil)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	assert.Equal(t, uint64(1), flush(ctx, t, system, pid), "one batch for the burst")
	e := <-sink
	b, err := DecodeBatch(e.Payload)
	require.NoError(t, err)
	assert.Len(t, b.Events, n)
	require.NoError(t, actors.StopAndWait(ctx, system, pid))
}

// flush asks the hub to close its open batch and returns the next
// sequence number it answers.
func flush(ctx context.Context, t *testing.T, system *actor.ActorSystem, hub *actor.PID) uint64 {
	t.Helper()
	reply := messages.NewReply[uint64]()
	system.Root.Send(hub, &Flush{Reply: reply})
	select {
	case r := <-reply.C():
		require.NoError(t, r.Err)
		return r.Value
	case <-ctx.Done():
		t.Fatal("no answer to Flush")
		return 0
	}
}

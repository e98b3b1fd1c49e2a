// Package kvevents is the black-box suite of the node's KV events: a real
// node driven by the engine simulator, its ZeroMQ sockets read by raw zmq4
// sockets and by the `kvtier events tail` binary, every payload decoded by
// a decoder written here from docs/PROTOCOL.md alone (not the events
// package's).
package kvevents

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"os/exec"
	"reflect"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/internal/testutil/gobuild"
	"github.com/kvtier/kvtier/internal/testutil/testleak"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tools/sim"
)

// zmq4 v0.17.0 never ends a PUB socket's writer goroutine (a library leak,
// one per socket; see events/publisher.go).
func TestMain(m *testing.M) {
	testleak.VerifyTestMain(m)
}

// ---- an independent decoder of the documented format ----

type wireEvent struct {
	Type      string
	Hashes    []uint64
	Parent    *uint64
	Tokens    []int64
	BlockSize int64
	Medium    string
	Group     *uint64
	Locality  string
	Ownership string
	Fields    map[string]bool // map form: the keys present
}

type wireBatch struct {
	TS     float64
	Events []wireEvent
	DP     *int64
}

// num is a decoded msgpack number: an integer of any width (msgpack
// decoders pick the smallest) or a float.
func num(t *testing.T, v any) int64 {
	t.Helper()
	switch r := reflect.ValueOf(v); {
	case r.CanInt():
		return r.Int()
	case r.CanUint():
		return int64(r.Uint())
	case r.CanFloat():
		return int64(r.Float())
	}
	t.Fatalf("not a number: %T %v", v, v)
	return 0
}

// hashOf is a decoded block hash: an integer of any width, read as the
// unsigned 64 bits vLLM writes.
func hashOf(t *testing.T, v any) uint64 {
	t.Helper()
	if reflect.ValueOf(v).CanFloat() {
		t.Fatalf("not an integer: %T %v", v, v)
	}
	return uint64(num(t, v)) // NB: the same 64 bits, whichever sign num read them with
}

func decode(t *testing.T, payload []byte) wireBatch {
	t.Helper()
	var v any
	require.NoError(t, msgpack.Unmarshal(payload, &v))
	var b wireBatch
	var evs []any
	switch top := v.(type) {
	case []any:
		require.True(t, len(top) == 2 || len(top) == 3, "batch of %d", len(top))
		b.TS = float64(num(t, top[0]))
		if f, ok := top[0].(float64); ok {
			b.TS = f
		}
		evs = top[1].([]any)
		if len(top) == 3 && top[2] != nil {
			dp := num(t, top[2])
			b.DP = &dp
		}
	case map[string]any:
		b.TS = top["ts"].(float64)
		evs = top["events"].([]any)
	default:
		t.Fatalf("batch is %T", v)
	}
	for _, raw := range evs {
		var e wireEvent
		switch ev := raw.(type) {
		case map[string]any:
			e.Type = ev["type"].(string)
			e.Fields = map[string]bool{}
			for k := range ev {
				e.Fields[k] = true
			}
			fill(t, &e, ev)
		case []any: // legacy: [type, block_hashes, parent, token_ids, block_size, lora_id, medium...]
			e.Type = ev[0].(string)
			names := map[string][]string{
				"BlockStored":  {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"},
				"BlockRemoved": {"block_hashes", "medium"},
			}[e.Type]
			m := map[string]any{}
			for i, name := range names {
				if i+1 < len(ev) {
					m[name] = ev[i+1]
				}
			}
			fill(t, &e, m)
		default:
			t.Fatalf("event is %T", raw)
		}
		b.Events = append(b.Events, e)
	}
	return b
}

func fill(t *testing.T, e *wireEvent, m map[string]any) {
	t.Helper()
	if hs, ok := m["block_hashes"].([]any); ok {
		for _, h := range hs {
			e.Hashes = append(e.Hashes, hashOf(t, h))
		}
	}
	if p := m["parent_block_hash"]; p != nil {
		h := hashOf(t, p)
		e.Parent = &h
	}
	if ts, ok := m["token_ids"].([]any); ok {
		for _, tok := range ts {
			e.Tokens = append(e.Tokens, num(t, tok))
		}
	}
	if bs := m["block_size"]; bs != nil {
		e.BlockSize = num(t, bs)
	}
	if md, ok := m["medium"].(string); ok {
		e.Medium = md
	}
	if g := m["group_idx"]; g != nil {
		u := uint64(num(t, g))
		e.Group = &u
	}
	if l, ok := m["locality"].(string); ok {
		e.Locality = l
	}
	if o, ok := m["ownership"].(string); ok {
		e.Ownership = o
	}
}

func TestIndependentDecoderReadsLegacyArrays(t *testing.T) {
	p, err := msgpack.Marshal([]any{1.5, []any{[]any{"BlockStored", []any{7, 8}, 6, []any{1, 2, 3, 4}, 2, nil, "CPU"}}})
	require.NoError(t, err)
	b := decode(t, p)
	require.Len(t, b.Events, 1)
	assert.Equal(t, []uint64{7, 8}, b.Events[0].Hashes)
	assert.Equal(t, uint64(6), *b.Events[0].Parent)
	assert.Equal(t, int64(2), b.Events[0].BlockSize)
}

// ---- the scenario ----

type frame struct {
	seq     uint64
	topic   string
	payload []byte
}

// liveSub records what a SUB socket receives until ctx ends.
func liveSub(ctx context.Context, t *testing.T, addr string) (frames func() []frame, wait func()) {
	t.Helper()
	sub := zmq4.NewSub(ctx)
	require.NoError(t, sub.Dial(addr))
	require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, "kv@"))
	var mu sync.Mutex
	var got []frame
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer sub.Close()
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			if len(m.Frames) != 3 {
				t.Errorf("live message of %d frames", len(m.Frames))
				return
			}
			mu.Lock()
			got = append(got, frame{seq: binary.BigEndian.Uint64(m.Frames[1]), topic: string(m.Frames[0]), payload: m.Frames[2]})
			mu.Unlock()
		}
	}()
	return func() []frame {
			mu.Lock()
			defer mu.Unlock()
			return append([]frame(nil), got...)
		}, func() {
			<-done
		}
}

// replay asks the ROUTER for batches from `from` with a raw DEALER.
func replay(ctx context.Context, t *testing.T, addr string, from uint64) []frame {
	t.Helper()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	require.NoError(t, d.Dial(addr))
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	require.NoError(t, d.Send(zmq4.NewMsgFrom([]byte{}, start[:])))
	var out []frame
	for {
		m, err := d.Recv()
		require.NoError(t, err)
		// vLLM's (>= 0.32) replay form: ["", topic, seq, payload]; the
		// terminator's topic and payload are empty.
		require.Len(t, m.Frames, 4, "[\"\", topic, seq, payload]")
		require.Empty(t, m.Frames[0])
		seq := binary.BigEndian.Uint64(m.Frames[2])
		if seq == 0xFFFFFFFFFFFFFFFF {
			require.Empty(t, m.Frames[1], "terminator topic")
			require.Empty(t, m.Frames[3], "terminator payload")
			return out
		}
		require.NotEmpty(t, m.Frames[1], "the topic")
		out = append(out, frame{seq: seq, payload: m.Frames[3]})
	}
}

// inventory rebuilds stored-minus-removed per medium from decoded batches.
type inventory map[string]map[uint64]bool

func (inv inventory) apply(e wireEvent) {
	m := inv[e.Medium]
	if m == nil {
		m = map[uint64]bool{}
		inv[e.Medium] = m
	}
	switch e.Type {
	case "BlockStored":
		for _, h := range e.Hashes {
			m[h] = true
		}
	case "BlockRemoved":
		for _, h := range e.Hashes {
			delete(m, h)
		}
	case "AllBlocksCleared":
		for k := range inv {
			delete(inv, k)
		}
	}
}

func (inv inventory) sorted(medium string) []uint64 {
	var out []uint64
	for h := range inv[medium] {
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func nodeHashes(keys []messages.Key) []uint64 {
	out := make([]uint64, 0, len(keys))
	for _, k := range keys {
		out = append(out, binary.BigEndian.Uint64([]byte(k.Hash)))
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func TestSimulatorEventsMatchTheNodesInventory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const blockBytes, slots = 4 << 10, 600 // small enough to evict
	node, err := kvtier.Open(ctx, kvtier.Config{PoolBytes: slots * blockBytes, BlockBytes: blockBytes, JobWorkers: 2,
		Events: kvtier.EventsConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", NodeID: "n1", Model: "m"}})
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			_ = node.Close(context.Background())
		}
	}()
	subCtx, stopSub := context.WithCancel(ctx)
	live, waitSub := liveSub(subCtx, t, node.EventsEndpoint())

	reqs, sum := runSim(ctx, t, node, 3, 400, 64)
	stats, err := node.Manager().Stats(ctx)
	require.NoError(t, err)
	require.Positive(t, stats.Evictions, "the scenario must evict")

	next, err := node.FlushEvents(ctx)
	require.NoError(t, err)
	require.Positive(t, next)
	inv, err := node.Inventory(ctx)
	require.NoError(t, err)

	// A late subscriber replays from 0: every batch, in order, then the terminator.
	batches := replay(ctx, t, node.EventsReplayEndpoint(), 0)
	require.Len(t, batches, int(next))
	for i, b := range batches {
		require.Equal(t, uint64(i), b.seq, "sequence continuity from 0")
	}

	// Provenance: the predecessor of every block in the workload, by hash.
	pred := predecessors(reqs)
	rebuilt := inventory{}
	var storedBlocks, removedBlocks int
	for _, fr := range batches {
		b := decode(t, fr.payload)
		require.NotNil(t, b.DP)
		assert.Zero(t, *b.DP)
		require.NotEmpty(t, b.Events, "no empty batch")
		for _, e := range b.Events {
			assert.Equal(t, "CPU", e.Medium)
			switch e.Type {
			case "BlockStored":
				for _, f := range []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"} {
					require.True(t, e.Fields[f], "BlockStored field %s always present", f)
				}
				require.NotEmpty(t, e.Hashes)
				require.EqualValues(t, sim.TokensPerBlock, e.BlockSize, "block size")
				require.Len(t, e.Tokens, sim.TokensPerBlock*len(e.Hashes), "full token ids, no placeholder")
				want := pred[e.Hashes[0]]
				if want == nil {
					assert.Nil(t, e.Parent, "block %d starts its prompt", e.Hashes[0])
				} else {
					require.NotNil(t, e.Parent, "block %d has a parent", e.Hashes[0])
					assert.Equal(t, *want, *e.Parent, "parent of %d", e.Hashes[0])
				}
				for i := 1; i < len(e.Hashes); i++ {
					require.Equal(t, e.Hashes[i-1], *pred[e.Hashes[i]], "chain order within an event")
				}
				storedBlocks += len(e.Hashes)
			case "BlockRemoved":
				removedBlocks += len(e.Hashes)
			default:
				t.Fatalf("unexpected %s", e.Type)
			}
			rebuilt.apply(e)
		}
	}
	assert.Equal(t, sum.BlocksStored, storedBlocks, "every stored block announced once")
	assert.EqualValues(t, stats.Evictions, removedBlocks, "every eviction announced")
	// Batched per window, not per event (the figure, 0.04 batches per stored
	// block, is in docs/PROTOCOL.md; this bound only says batching happens).
	assert.Less(t, len(batches), storedBlocks/2, "%d batches for %d stored blocks", len(batches), storedBlocks)
	assert.Equal(t, nodeHashes(inv[messages.MediumCPU]), rebuilt.sorted("CPU"), "stored − removed = what the tier holds")
	assert.Zero(t, node.EventsCounters().Placeholders.Load())

	// The live subscriber saw a contiguous run (it may have joined late:
	// ZeroMQ's slow joiner), byte-identical to the replay, on the topic.
	stopSub()
	waitSub()
	got := live()
	require.NotEmpty(t, got)
	for i, f := range got {
		assert.Equal(t, "kv@n1@m", f.topic)
		if i > 0 {
			require.Equal(t, got[i-1].seq+1, f.seq, "no gap in the live stream")
		}
		require.True(t, bytes.Equal(batches[f.seq].payload, f.payload), "live and replayed seq %d differ", f.seq)
	}

	// Replay after a gap: from the middle, exactly the rest.
	mid := next / 2
	rest := replay(ctx, t, node.EventsReplayEndpoint(), mid)
	require.Len(t, rest, int(next-mid))
	assert.Equal(t, mid, rest[0].seq)

	// The tail logic (events.Subscribe) rebuilds the same inventory.
	tailed := inventory{}
	var seen uint64
	require.NoError(t, events.Subscribe(ctx, events.SubscriberConfig{Endpoint: node.EventsEndpoint(),
		Replay: node.EventsReplayEndpoint(), ReplayFrom: 0, NoFollow: true}, func(d events.Delivery) error {
		require.Equal(t, seen, d.Seq)
		seen++
		for _, e := range d.Batch.Events {
			we := wireEvent{Type: e.Type, Medium: e.Medium}
			for _, h := range e.BlockHashes {
				we.Hashes = append(we.Hashes, h.Int)
			}
			tailed.apply(we)
		}
		return nil
	}))
	assert.Equal(t, next, seen)
	assert.Equal(t, rebuilt.sorted("CPU"), tailed.sorted("CPU"))

	// And the CLI: `kvtier events tail --json` from 0, compared with the node.
	cli := tailJSON(ctx, t, node.EventsEndpoint(), node.EventsReplayEndpoint())
	assert.Equal(t, nodeHashes(inv[messages.MediumCPU]), cli.sorted("CPU"))

	closed = true
	require.NoError(t, node.Close(ctx))
}

// buildCLI compiles ./cmd/kvtier into a temporary directory.
func buildCLI(t *testing.T) string {
	t.Helper()
	return gobuild.Command(t, "github.com/kvtier/kvtier/cmd/kvtier", "kvtier")
}

// tailJSON runs `kvtier events tail --json --replay-from 0 --no-follow`
// and rebuilds the inventory from its lines.
func tailJSON(ctx context.Context, t *testing.T, endpoint, replayAddr string) inventory {
	t.Helper()
	bin := buildCLI(t)
	cmd := exec.CommandContext(ctx, bin, "events", "tail", endpoint, "--replay", replayAddr,
		"--replay-from", "0", "--no-follow", "--json")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	require.NoError(t, err, "tail: %s", stderr.String())
	inv := inventory{}
	sc := bufio.NewScanner(bytes.NewReader(stdout))
	sc.Buffer(nil, 16<<20)
	lines := 0
	for sc.Scan() {
		var line struct {
			Seq         uint64   `json:"seq"`
			Type        string   `json:"type"`
			BlockHashes []uint64 `json:"block_hashes"`
			Medium      string   `json:"medium"`
			TokenIDs    []int32  `json:"token_ids"`
			BlockSize   int      `json:"block_size"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line), "line %q", sc.Text())
		if line.Type == "BlockStored" {
			require.Len(t, line.TokenIDs, line.BlockSize*len(line.BlockHashes))
			require.Positive(t, line.BlockSize)
		}
		inv.apply(wireEvent{Type: line.Type, Hashes: line.BlockHashes, Medium: line.Medium})
		lines++
	}
	require.NoError(t, sc.Err())
	require.Positive(t, lines, fmt.Sprintf("stderr: %s", stderr.String()))
	return inv
}

// events.encoding: array writes vLLM's legacy positional arrays, which an
// independent decoder (a generic msgpack reader, field by position) reads,
// and which still add up to what the node holds.
func TestArrayEncodingIsVLLMsLegacyForm(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const blockBytes, slots = 4 << 10, 200
	node, err := kvtier.Open(ctx, kvtier.Config{PoolBytes: slots * blockBytes, BlockBytes: blockBytes,
		Events: kvtier.EventsConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", Encoding: "array"}})
	require.NoError(t, err)
	defer func() { require.NoError(t, node.Close(context.Background())) }()
	runSim(ctx, t, node, 4, 150, 32)
	_, err = node.FlushEvents(ctx)
	require.NoError(t, err)
	inv, err := node.Inventory(ctx)
	require.NoError(t, err)

	live := map[uint64]bool{}
	stored, removed := 0, 0
	for _, fr := range replay(ctx, t, node.EventsReplayEndpoint(), 0) {
		var batch []any
		require.NoError(t, msgpack.Unmarshal(fr.payload, &batch))
		require.Len(t, batch, 3)
		for _, raw := range batch[1].([]any) {
			ev, ok := raw.([]any)
			require.True(t, ok, "an event is an array, not a map: %T", raw)
			hashes := func(v any) []uint64 {
				var out []uint64
				for _, h := range v.([]any) {
					out = append(out, hashOf(t, h))
				}
				return out
			}
			switch ev[0] {
			case "BlockStored":
				require.Len(t, ev, 7, "type, hashes, parent, tokens, block_size, lora_id, medium")
				assert.Equal(t, "CPU", ev[6])
				assert.EqualValues(t, sim.TokensPerBlock, num(t, ev[4]))
				hs := hashes(ev[1])
				assert.Len(t, ev[3], sim.TokensPerBlock*len(hs))
				for _, h := range hs {
					live[h] = true
				}
				stored++
			case "BlockRemoved":
				require.Len(t, ev, 3, "type, hashes, medium")
				for _, h := range hashes(ev[1]) {
					delete(live, h)
				}
				removed++
			default:
				t.Fatalf("event %v", ev)
			}
		}
	}
	require.Positive(t, stored)
	require.Positive(t, removed, "the scenario must evict")
	assert.Equal(t, nodeHashes(inv["CPU"]), slices.Sorted(maps.Keys(live)), "stored − removed = what the node holds")
}

package events

import (
	"context"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/messages"
)

// rawHash is a 32-byte block hash (as an engine's key carries it) whose
// low 64 bits are low.
func rawHash(low uint64) string {
	return strings.Repeat("\xee", 24) + string(binary.BigEndian.AppendUint64(nil, low))
}

// engineBatch is what vLLM publishes when it caches blocks: one BlockStored
// run (medium GPU) with int hashes, its parent and the run's token ids.
func engineBatch(parent *Hash, size int, lows ...uint64) *Batch {
	ev := Event{Type: TypeBlockStored, Parent: parent, BlockSize: size, Medium: "GPU"}
	for i, l := range lows {
		ev.BlockHashes = append(ev.BlockHashes, Hash{Int: l})
		for j := range size {
			ev.TokenIDs = append(ev.TokenIDs, int32(100*i+j))
		}
	}
	return &Batch{Events: []Event{ev}}
}

func TestLearnedSplitsAnEnginesRunIntoChainedBlocks(t *testing.T) {
	l := NewLearned(16)
	root := Hash{Int: 7}
	assert.Equal(t, 2, l.Learn(engineBatch(&root, 4, 11, 12)))

	first := l.Lookup(rawHash(11))
	require.NotNil(t, first)
	assert.Equal(t, []int32{0, 1, 2, 3}, first.TokenIDs)
	assert.Equal(t, 4, first.BlockSize)
	assert.Equal(t, uint64(7), WireHash(string(first.ParentHash), HashInt).Int, "its parent is the run's")
	second := l.Lookup(rawHash(12))
	require.NotNil(t, second)
	assert.Equal(t, []int32{100, 101, 102, 103}, second.TokenIDs)
	assert.Equal(t, uint64(11), WireHash(string(second.ParentHash), HashInt).Int, "its parent is the block before it")
	assert.True(t, l.HasBlockSize(4))
	assert.False(t, l.HasBlockSize(8))
	assert.Nil(t, l.Lookup(rawHash(13)))

	// Bytes hashes are found by their low 64 bits too.
	b := &Batch{Events: []Event{{Type: TypeBlockStored, BlockSize: 1, TokenIDs: []int32{5},
		BlockHashes: []Hash{{Bytes: []byte(rawHash(21)), IsBytes: true}}}}}
	assert.Equal(t, 1, l.Learn(b))
	p := l.Lookup(rawHash(21))
	require.NotNil(t, p)
	assert.Nil(t, p.ParentHash, "the start of a prompt")

	// A run whose token ids are not BlockSize per block teaches nothing.
	bad := engineBatch(nil, 4, 31)
	bad.Events[0].TokenIDs = bad.Events[0].TokenIDs[:3]
	assert.Equal(t, 0, l.Learn(bad))
	assert.Equal(t, uint64(1), l.Skipped)
}

func TestLearnedForgetsTheOldestFirst(t *testing.T) {
	l := NewLearned(2)
	l.Learn(engineBatch(nil, 1, 1, 2))
	l.Learn(engineBatch(nil, 1, 1)) // learned again: keeps its place
	l.Learn(engineBatch(nil, 1, 3))
	assert.Nil(t, l.Lookup(rawHash(1)), "the oldest went")
	assert.NotNil(t, l.Lookup(rawHash(2)))
	assert.NotNil(t, l.Lookup(rawHash(3)))
	assert.Equal(t, 2, l.Len())
}

// engineStore is a store by an engine that sends keys only (vLLM's
// manager): the request's context, no token ids, no placement.
func engineStore(blockSize int, lows ...uint64) *messages.Event {
	e := &messages.Event{Kind: messages.BlockStored, Medium: messages.MediumCPU,
		Ctx: &messages.ReqContext{RequestID: "r", BlockSize: blockSize, SessionID: "conv-1"}}
	for _, l := range lows {
		e.Keys = append(e.Keys, messages.Key{Namespace: "ns", Hash: rawHash(l)})
	}
	return e
}

func TestTranslatorAnnouncesAnEnginesBlockWithWhatTheEngineAnnounced(t *testing.T) {
	tr := NewTranslator(HashInt)
	tr.Learned = NewLearned(16)
	root := Hash{Int: 7}
	tr.Learned.Learn(engineBatch(&root, 4, 11))

	stored := engineStore(4, 11)
	require.False(t, tr.AwaitsTokens(stored))
	out := tr.Apply(stored)
	require.Len(t, out, 1)
	ev := out[0]
	assert.Equal(t, []int32{0, 1, 2, 3}, ev.TokenIDs)
	assert.Equal(t, 4, ev.BlockSize)
	require.NotNil(t, ev.Parent)
	assert.Equal(t, uint64(7), ev.Parent.Int)
	assert.Equal(t, "conv-1", ev.SessionID, "the request's context still says whose it is")
	assert.Equal(t, uint64(1), tr.Filled)
	assert.Equal(t, uint64(0), tr.Placeholders)

	// Its cascade to storage (the tier's record: no token ids) too.
	cascade := &messages.Event{Kind: messages.BlockStored, Medium: messages.MediumStorage, Ownership: "fs",
		Keys: stored.Keys, Prov: []*messages.Provenance{{BlockSize: 4}}}
	out = tr.Apply(cascade)
	require.Len(t, out, 1)
	assert.Equal(t, []int32{0, 1, 2, 3}, out[0].TokenIDs)

	// A chunk of two engine blocks is not one learned block: not filled,
	// and not awaited.
	chunk := engineStore(8, 11)
	assert.False(t, tr.AwaitsTokens(chunk))
	// An engine block not learned yet is awaited.
	assert.True(t, tr.AwaitsTokens(engineStore(4, 12)))
}

// learningHub is a hub that learns from engines' events, its sink and
// counters; the actor system stops with the test.
func learningHub(t *testing.T, wait time.Duration) (*actor.ActorSystem, *actor.PID, chanSink, *Counters) {
	sink := make(chanSink, 16)
	system := actors.NewSystem(zerolog.Nop())
	t.Cleanup(system.Shutdown)
	counters := &Counters{}
	pid := system.Root.Spawn(HubProps(HubConfig{Format: HashInt, Sink: sink, Counters: counters,
		LearnCapacity: 16, LearnWait: wait, Log: zerolog.Nop()}))
	return system, pid, sink, counters
}

func TestHubHoldsAnEnginesStoreUntilTheEngineAnnouncesIt(t *testing.T) {
	system, pid, sink, counters := learningHub(t, time.Hour)
	// The store reaches the hub before the engine's announcement of its
	// blocks; a removal of another block follows it and must stay behind.
	system.Root.Send(pid, engineStore(4, 11))
	other := engineStore(4, 99)
	other.Ctx = nil
	other.Prov = []*messages.Provenance{{BlockSize: 4, TokenIDs: []int32{9, 9, 9, 9}}}
	system.Root.Send(pid, other)
	system.Root.Send(pid, &messages.Event{Kind: messages.BlockRemoved, Medium: messages.MediumCPU, Keys: other.Keys})
	system.Root.Send(pid, &Learn{Batch: engineBatch(nil, 4, 11)})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	flush(ctx, t, system, pid)
	var got []Event
	for len(sink) > 0 {
		b, err := DecodeBatch((<-sink).Payload)
		require.NoError(t, err)
		got = append(got, b.Events...)
	}
	require.Len(t, got, 3)
	assert.Equal(t, uint64(11), got[0].BlockHashes[0].Int, "the held store first: order kept")
	assert.Equal(t, []int32{0, 1, 2, 3}, got[0].TokenIDs, "announced with the engine's token ids")
	assert.Equal(t, TypeBlockStored, got[1].Type)
	assert.Equal(t, TypeBlockRemoved, got[2].Type)
	assert.Equal(t, uint64(1), counters.AwaitedTokens.Load())
	assert.Equal(t, uint64(0), counters.TokensLate.Load())
	assert.Equal(t, uint64(1), counters.Filled.Load())
	assert.Equal(t, uint64(1), counters.Learned.Load())
	require.NoError(t, actors.StopAndWait(ctx, system, pid))
}

func TestHubAnnouncesWithoutTokenIDsOnceTheWaitRunsOut(t *testing.T) {
	system, pid, sink, counters := learningHub(t, time.Millisecond)
	system.Root.Send(pid, &Learn{Batch: engineBatch(nil, 4, 1)}) // the engine's block size is known
	system.Root.Send(pid, engineStore(4, 12))                    // never announced by its engine

	select {
	case e := <-sink: // the wait ran out on its own: no Flush
		b, err := DecodeBatch(e.Payload)
		require.NoError(t, err)
		require.Len(t, b.Events, 1)
		assert.Empty(t, b.Events[0].TokenIDs, "a placeholder")
	case <-time.After(30 * time.Second):
		t.Fatal("the held store was never announced")
	}
	assert.Equal(t, uint64(1), counters.TokensLate.Load())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, actors.StopAndWait(ctx, system, pid))
}

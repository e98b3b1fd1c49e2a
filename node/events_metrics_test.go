package node

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/messages"
)

// TestEventsCountersAreScraped: with events on, a store shows up in the
// published-events counters on the node's registry.
func TestEventsCountersAreScraped(t *testing.T) {
	node, ctx := openReal(t, 30*time.Second, config.Config{PoolBytes: 16 * testBlock, BlockBytes: testBlock,
		Events: config.EventsConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", NodeID: "n1", Model: "m"}})

	m := node.Manager()
	req := &messages.ReqContext{RequestID: "r", BlockSize: 2, TokenIDs: []int32{1, 2, 3, 4}}
	plan, err := m.PrepareStore(ctx, req, keys(1, 2))
	require.NoError(t, err)
	require.NoError(t, m.JobDone(ctx, plan.Job, 0, true))
	_, err = node.FlushEvents(ctx)
	require.NoError(t, err)

	n, err := testutil.GatherAndCount(node.Registry(), "kvtier_events_total", "kvtier_events_batches_total", "kvtier_events_placeholders_total")
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, 1.0, gathered(t, node, "kvtier_events_total"), "one BlockStored event for the two blocks")
	require.Zero(t, gathered(t, node, "kvtier_events_placeholders_total"))
	require.Zero(t, gathered(t, node, "kvtier_events_dropped_total"))
}

// gathered reads one unlabelled counter from the node's registry.
func gathered(t *testing.T, node *Node, name string) float64 {
	t.Helper()
	families, err := node.Registry().Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestANodeLearnsTokenIDsFromAnEnginesOwnEvents: an engine that stores keys
// only (as vLLM's manager does) publishes its blocks' token ids on its own
// KV events; the node, learning from that publisher (events.learn_from),
// announces the engine's stores with them.
func TestANodeLearnsTokenIDsFromAnEnginesOwnEvents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	engine, err := events.Listen(events.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "vllm",
		Linger: -1, Log: zerolog.Nop()})
	require.NoError(t, err)
	defer func() { require.NoError(t, engine.Close(ctx)) }()
	node, err := Open(ctx, config.Config{PoolBytes: 16 * testBlock, BlockBytes: testBlock,
		Events: config.EventsConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", NodeID: "n1", Model: "m",
			LearnFrom: []string{engine.Endpoint()}, LearnWait: time.Hour}})
	require.NoError(t, err)
	defer func() { require.NoError(t, node.Close(ctx)) }()

	// The engine's announcement of blocks 1 and 2 (GPU, int hashes: key(i)'s
	// low 64 bits are i), repeated until the node heard it (a subscriber
	// misses what was sent before it joined).
	gpu := events.Batch{Events: []events.Event{{Type: events.TypeBlockStored, Medium: "GPU", BlockSize: 2,
		BlockHashes: []events.Hash{{Int: 1}, {Int: 2}}, TokenIDs: []int32{10, 11, 20, 21}}}}
	payload, err := events.EncodeBatch(&gpu)
	require.NoError(t, err)
	for seq := uint64(0); node.EventsCounters().Learned.Load() == 0; seq++ {
		require.NoError(t, ctx.Err(), "the node never learned the engine's blocks")
		engine.Publish(events.Entry{Seq: seq, Payload: payload})
		time.Sleep(20 * time.Millisecond) // NB: the pace of a publisher waiting for a slow joiner
	}

	m := node.Manager()
	plan, err := m.PrepareStore(ctx, &messages.ReqContext{RequestID: "r", BlockSize: 2}, keys(1, 2))
	require.NoError(t, err)
	require.NoError(t, m.JobDone(ctx, plan.Job, 0, true))
	next, err := node.FlushEvents(ctx)
	require.NoError(t, err)
	var stored []events.Event
	require.NoError(t, events.Replay(ctx, node.EventsReplayEndpoint(), 0, func(seq uint64, p []byte) error {
		b, err := events.DecodeBatch(p)
		if err == nil && seq < next {
			stored = append(stored, b.Events...)
		}
		return err
	}))
	require.Len(t, stored, 1)
	assert.Equal(t, []int32{10, 11, 20, 21}, stored[0].TokenIDs, "the engine's token ids")
	assert.Equal(t, uint64(2), node.EventsCounters().Filled.Load())
	require.Zero(t, gathered(t, node, "kvtier_events_placeholders_total"))
}

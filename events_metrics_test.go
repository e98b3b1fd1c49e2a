package kvtier

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

// TestEventsCountersAreScraped: with events on, a store shows up in the
// published-events counters on the node's registry.
func TestEventsCountersAreScraped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node, err := Open(ctx, Config{PoolBytes: 16 * testBlock, BlockBytes: testBlock,
		Events: EventsConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", NodeID: "n1", Model: "m"}})
	require.NoError(t, err)
	defer func() { require.NoError(t, node.Close(ctx)) }()

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

package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/internal/testutil/testetcd"
)

// A small fleet runs the whole scenario: both runs converge, the ask-all
// run asks every other node on each miss, the directory asks fewer and
// finds as much.
func TestFleetScenarioRuns(t *testing.T) {
	o := DefaultFleetOptions()
	o.Etcd = testetcd.Need(t)
	o.Nodes, o.Requests, o.IdleWindow, o.Timeout = 3, 80, 100*time.Millisecond, 2*time.Minute
	r, err := RunFleet(context.Background(), o)
	require.NoError(t, err)
	require.Equal(t, 3, r.Nodes)
	require.InDelta(t, 2.0, r.AskAllMessagesPerMiss, 1e-9, "ask-all asks both other nodes on every miss")
	require.Less(t, r.MessagesPerMiss, r.AskAllMessagesPerMiss)
	require.Greater(t, r.AskAllPeerHitRate, 0.0, "turns land on other nodes than the last: some blocks come from peers")
	require.InDelta(t, r.AskAllPeerHitRate, r.PeerHitRate, 0.05)
	require.Greater(t, r.DirectoryBytesPerNode, 0.0)
}

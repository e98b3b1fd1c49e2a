package node

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/messages"
)

// TestALoadSentRightBehindItsCommitFindsTheBlocks: an engine that does not
// wait for its store's completion (a quiet complete_store, pipelined) and
// loads the same keys at once must find them committed — the commit's
// checksum runs off the bridge's mailbox, and a load must not overtake it.
// The load's own later calls, pipelined too (its completion, its request's
// end), must not overtake it either: the node ends with no request state,
// pin or lease left (scheduler/order.go).
func TestALoadSentRightBehindItsCommitFindsTheBlocks(t *testing.T) {
	node, ctx := openReal(t, 60*time.Second, config.Config{PoolBytes: 64 * testBlock, BlockBytes: testBlock})
	m, bridge := node.Manager(), node.pidOf("bridge")

	for i := range 40 {
		ks := keys(2*i+1, 2*i+2)
		writer := &messages.ReqContext{RequestID: "w"}
		_, err := m.PrepareStore(ctx, writer, ks)
		require.NoError(t, err)
		stored := messages.NewReply[struct{}]()
		node.system.Root.Send(bridge, &messages.CompleteStore{Req: writer, Keys: ks, OK: true, Reply: stored})
		reader := &messages.ReqContext{RequestID: "r"}
		load := messages.NewReply[messages.LoadJob]()
		node.system.Root.Send(bridge, &messages.PrepareLoad{Req: reader, Keys: ks, Reply: load})
		loaded := messages.NewReply[struct{}]()
		node.system.Root.Send(bridge, &messages.CompleteLoad{Req: reader, Keys: ks, Reply: loaded})
		finished := messages.NewReply[struct{}]()
		node.system.Root.Send(bridge, &messages.RequestFinished{Req: reader, Reply: finished})
		res := <-load.C()
		require.NoError(t, res.Err, "round %d: the load overtook its commit", i)
		require.NoError(t, (<-stored.C()).Err)
		require.NoError(t, (<-loaded.C()).Err, "round %d: the load's completion overtook it", i)
		require.NoError(t, (<-finished.C()).Err)
		require.NoError(t, m.RequestFinished(ctx, writer))
	}
	st, err := m.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Requests, "no request state left")
	require.Zero(t, st.JobsInFlight)
	require.Zero(t, st.Pinned)
	require.Zero(t, st.Leased)
}

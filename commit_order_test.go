package kvtier

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

// TestALoadSentRightBehindItsCommitFindsTheBlocks: an engine that does not
// wait for its store's completion (a quiet complete_store, pipelined) and
// loads the same keys at once must find them committed — the commit's
// checksum runs off the bridge's mailbox, and a load must not overtake it.
func TestALoadSentRightBehindItsCommitFindsTheBlocks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	node, err := Open(ctx, Config{PoolBytes: 64 * testBlock, BlockBytes: testBlock})
	require.NoError(t, err)
	defer func() { require.NoError(t, node.Close(ctx)) }()
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
		res := <-load
		require.NoError(t, res.Err, "round %d: the load overtook its commit", i)
		require.NoError(t, (<-stored).Err)
		require.NoError(t, m.CompleteLoad(ctx, reader, ks))
		require.NoError(t, m.RequestFinished(ctx, reader))
		require.NoError(t, m.RequestFinished(ctx, writer))
	}
}

package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/internal/testutil/freeport"
	"github.com/kvtier/kvtier/messages"
)

// TestANodeInLLMDsTopology: every socket connects the other way round from
// the default, as in llm-d. The router binds a SUB and the node's PUB
// connects to it (events.mode: connect); the engine's PUB connects to the
// node, whose learning SUB binds (events.learn_mode: auto with a wildcard
// address). The engine's token ids reach the router on the node's events.
func TestANodeInLLMDsTopology(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ports, err := freeport.Ports(2)
	require.NoError(t, err)
	routerAddr := fmt.Sprintf("tcp://127.0.0.1:%d", ports[0])

	routerCtx, routerCancel := context.WithCancel(ctx)
	router := zmq4.NewSub(routerCtx)
	defer func() { routerCancel(); _ = router.Close() }()
	require.NoError(t, router.SetOption(zmq4.OptionSubscribe, "kv@n1@m"))
	require.NoError(t, router.Listen(routerAddr))
	heard := make(chan *events.Batch, 64)
	go func() {
		for {
			msg, err := router.Recv()
			if err != nil {
				if routerCtx.Err() != nil {
					return
				}
				continue // a publisher's connection ended
			}
			if b, err := events.DecodeBatch(msg.Frames[len(msg.Frames)-1]); err == nil {
				select {
				case heard <- b:
				case <-routerCtx.Done():
					return
				}
			}
		}
	}()

	node, err := Open(ctx, config.Config{PoolBytes: 16 * testBlock, BlockBytes: testBlock,
		Events: config.EventsConfig{Endpoint: routerAddr, Mode: events.ModeConnect, NodeID: "n1", Model: "m",
			LearnFrom: []string{fmt.Sprintf("tcp://*:%d", ports[1])}, LearnWait: time.Hour}})
	require.NoError(t, err)
	defer func() { require.NoError(t, node.Close(ctx)) }()
	assert.Equal(t, routerAddr, node.EventsEndpoint())

	engine, err := events.Listen(events.PublisherConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", ports[1]),
		Mode: events.ModeAuto, Topic: "kv@10.0.0.7@m", Linger: -1, ReconnectMin: 10 * time.Millisecond, Log: zerolog.Nop()})
	require.NoError(t, err)
	defer func() { require.NoError(t, engine.Close(ctx)) }()
	require.True(t, engine.Connecting(), "vLLM's rule: a host address connects")

	// Round i: the engine announces blocks 2i+1 and 2i+2 (GPU, int hashes:
	// key(j)'s low 64 bits are j) until the node learned them, then the
	// node stores them and announces them with the engine's token ids.
	// Rounds go on until the router heard one: a PUB's first messages are
	// lost until the subscriber has joined.
	m := node.Manager()
	for i := 0; ; i++ {
		require.NoError(t, ctx.Err(), "the router never heard the node")
		a, b := 2*i+1, 2*i+2
		tokens := tokensOf(a)
		gpu := events.Batch{Events: []events.Event{{Type: events.TypeBlockStored, Medium: "GPU", BlockSize: 2,
			BlockHashes: []events.Hash{{Int: uint64(a)}, {Int: uint64(b)}}, TokenIDs: tokens}}}
		payload, err := events.EncodeBatch(&gpu)
		require.NoError(t, err)
		for seq, learned := uint64(0), node.EventsCounters().Learned.Load(); node.EventsCounters().Learned.Load() == learned; seq++ {
			require.NoError(t, ctx.Err(), "the node never learned the engine's blocks")
			engine.Publish(events.Entry{Seq: seq, Payload: payload})
			time.Sleep(20 * time.Millisecond) // NB: the pace of a publisher waiting for a slow joiner
		}
		plan, err := m.PrepareStore(ctx, &messages.ReqContext{RequestID: "r", BlockSize: 2}, keys(a, b))
		require.NoError(t, err)
		require.NoError(t, m.JobDone(ctx, plan.Job, 0, true))
		_, err = node.FlushEvents(ctx)
		require.NoError(t, err)
		select {
		case got := <-heard: // this round's, or a late one's
			require.NotEmpty(t, got.Events)
			ev := got.Events[0]
			require.Equal(t, events.TypeBlockStored, ev.Type)
			require.Len(t, ev.BlockHashes, 2)
			assert.Equal(t, tokensOf(int(ev.BlockHashes[0].Int)), ev.TokenIDs, "the engine's token ids, on the router")
			return
		case <-time.After(100 * time.Millisecond): // NB: the slow joiner's pace
		}
	}
}

// tokensOf is the token ids the engine announces for blocks a and a+1.
func tokensOf(a int) []int32 {
	return []int32{int32(10 * a), int32(10*a + 1), int32(10 * (a + 1)), int32(10*(a+1) + 1)}
}

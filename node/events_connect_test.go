package node

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/internal/testutil/freeport"
	"github.com/kvtier/kvtier/internal/zmqx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/client"
)

// TestANodeInLLMDsTopology: every socket connects the other way round from
// the default, as in llm-d. The router binds a SUB and the node's PUB
// connects to it (events.mode: connect); the engine's PUB connects to the
// node, whose learning SUB binds (events.learn_mode: auto with a wildcard
// address). The engine's token ids reach the router on the node's events,
// under the engine's own topic (the one its stream came under): the router
// credits the engine's pod, not the node, with kvtier's blocks.
func TestANodeInLLMDsTopology(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ports, err := freeport.Ports(2)
	require.NoError(t, err)
	routerAddr := fmt.Sprintf("tcp://127.0.0.1:%d", ports[0])
	heard := bindRouter(t, ctx, routerAddr)

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
		case h := <-heard: // this round's, or a late one's
			assert.Equal(t, "kv@10.0.0.7@m", h.topic, "the engine's own topic, not the node's")
			got := h.b
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

// TestEachEngineIsCreditedUnderItsOwnTopic: two engines of one model on
// one node, each with the topic of its own KV events in its hello (as
// kvtier's vLLM connector sends vLLM's kv_events_config topic): a router
// bound the llm-d way hears every block one of them stores under both
// engines' topics — either can load it — and nothing under the node's own.
func TestEachEngineIsCreditedUnderItsOwnTopic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node, heard := openRoutedNode(t, ctx)
	defer func() { require.NoError(t, node.Close(ctx)) }()
	engines := map[string]*client.Client{}
	for _, pod := range []string{"10.0.0.1", "10.0.0.2"} {
		engines["kv@"+pod+"@llama"] = dialEngine(t, ctx, node, pod)
	}
	// Round i stores blocks 2i+1, 2i+2 through the first engine until the
	// router heard a round under both topics (a PUB's first messages are
	// lost until the subscriber joined).
	writer := engines["kv@10.0.0.1@llama"]
	seen := map[string]bool{}
	for i := 0; len(seen) < 2; i++ {
		require.NoError(t, ctx.Err(), "the router heard only %v", seen)
		storeRound(t, ctx, writer, i)
		_, err := node.FlushEvents(ctx)
		require.NoError(t, err)
		deadline := time.After(100 * time.Millisecond) // NB: the slow joiner's pace
	drain:
		for {
			select {
			case h := <-heard:
				for _, ev := range h.b.Events {
					if ev.Type == events.TypeBlockStored {
						require.NotEqual(t, "kv@n1@kvtier", h.topic, "the engines' namespace has topics of its own")
						require.Contains(t, engines, h.topic)
						seen[h.topic] = true
					}
				}
			case <-deadline:
				break drain
			}
		}
	}
}

// openRoutedNode opens a node whose engines dial it on a unix socket and
// whose events go to a router bound the llm-d way (events.mode: connect),
// and returns it with what the router hears. The caller closes the node.
func openRoutedNode(t *testing.T, ctx context.Context) (*Node, <-chan topicBatch) {
	t.Helper()
	ports, err := freeport.Ports(1)
	require.NoError(t, err)
	routerAddr := fmt.Sprintf("tcp://127.0.0.1:%d", ports[0])
	heard := bindRouter(t, ctx, routerAddr)
	dir := t.TempDir()
	node, err := Open(ctx, config.Config{PoolBytes: 64 * testBlock, BlockBytes: testBlock,
		PoolPath: filepath.Join(dir, "pool"), EngineListen: "unix://" + filepath.Join(dir, "engine.sock"),
		Events: config.EventsConfig{Endpoint: routerAddr, Mode: events.ModeConnect, NodeID: "n1", Model: "kvtier"}})
	require.NoError(t, err)
	return node, heard
}

// dialEngine connects pod's engine to node, with the topic of its own KV
// events (kv@<pod>@llama) in its hello, until the test ends.
func dialEngine(t *testing.T, ctx context.Context, node *Node, pod string) *client.Client {
	t.Helper()
	c, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: pod, Topic: "kv@" + pod + "@llama"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) }) // NB: the node closes it anyway
	// NB: its first keyed call tells the node its namespace.
	_, err = c.Lookup(ctx, &messages.ReqContext{RequestID: "hello-" + pod}, keys(1000), true)
	require.NoError(t, err)
	return c
}

// storeRound stores blocks 2i+1 and 2i+2 through c, as request w<i>, and
// returns their keys.
func storeRound(t *testing.T, ctx context.Context, c *client.Client, i int) []messages.Key {
	t.Helper()
	ks := keys(2*i+1, 2*i+2)
	req := &messages.ReqContext{RequestID: fmt.Sprint("w", i)}
	_, err := c.PrepareStore(ctx, req, ks)
	require.NoError(t, err)
	require.NoError(t, c.CompleteStore(ctx, req, ks, true))
	require.NoError(t, c.RequestFinished(ctx, req))
	return ks
}

// topicBatch is a batch a router heard, and the topic it came under.
type topicBatch struct {
	topic string
	b     *events.Batch
}

// bindRouter binds a SUB at addr for every kv@ topic, as llm-d's router
// does, and hands over what it hears until the test ends.
func bindRouter(t *testing.T, ctx context.Context, addr string) <-chan topicBatch {
	t.Helper()
	routerCtx, routerCancel := context.WithCancel(ctx)
	router := zmq4.NewSub(routerCtx)
	require.NoError(t, router.SetOption(zmq4.OptionSubscribe, "kv@"))
	require.NoError(t, router.Listen(addr))
	heard := make(chan topicBatch, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		zmqx.Serve(router, func(msg zmq4.Msg) bool {
			b, err := events.DecodeBatch(msg.Frames[len(msg.Frames)-1])
			if err != nil {
				return true
			}
			select {
			case heard <- topicBatch{string(msg.Frames[0]), b}:
				return true
			case <-routerCtx.Done():
				return false
			}
		}, nil) // NB: a publisher's connection ended: serve the others
	}()
	t.Cleanup(func() { routerCancel(); _ = router.Close(); <-done })
	return heard
}

// TestAnEngineThatJoinsLaterIsCreditedForWhatTheNodeHolds: a pod that
// comes to a node whose CPU tier is warm (a restart, a rollout) is told of
// the blocks of its namespace the node already holds, under its own topic
// only; the pod that stored them is not told twice.
func TestAnEngineThatJoinsLaterIsCreditedForWhatTheNodeHolds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node, heard := openRoutedNode(t, ctx)
	defer func() { require.NoError(t, node.Close(ctx)) }()
	// hear counts, per topic, the stored blocks the router hears (by their
	// wire hash) until it heard every key of until under topic. The node
	// publishes on one socket, in order: by then whatever it sent before
	// is in too.
	hear := func(got map[string]map[uint64]int, topic string, until []messages.Key) {
		_, err := node.FlushEvents(ctx)
		require.NoError(t, err)
		want := map[uint64]bool{}
		for _, k := range until {
			want[events.WireHash(k.Hash, events.HashInt).Int] = true
		}
		for len(want) > 0 {
			select {
			case h := <-heard:
				for _, ev := range h.b.Events {
					if ev.Type != events.TypeBlockStored {
						continue
					}
					for _, hh := range ev.BlockHashes {
						if got[h.topic] == nil {
							got[h.topic] = map[uint64]int{}
						}
						got[h.topic][hh.Int]++
						if h.topic == topic {
							delete(want, hh.Int)
						}
					}
				}
			case <-ctx.Done():
				t.Fatalf("%s never heard %d of its keys; heard %v", topic, len(want), got)
			}
		}
	}

	first := dialEngine(t, ctx, node, "10.0.0.1")
	// Store until the router heard a round (a PUB's first messages are
	// lost until the subscriber joined; 100 ms is only the pace of the
	// tries), then one more, which it hears for sure: once it has, nothing
	// of the first pod's is still on its way.
	var stored []messages.Key
	for i := 0; ; i++ {
		require.NoError(t, ctx.Err(), "the router heard nothing")
		stored = append(stored, storeRound(t, ctx, first, i)...)
		_, err := node.FlushEvents(ctx)
		require.NoError(t, err)
		select {
		case <-heard:
		case <-time.After(100 * time.Millisecond):
			continue
		}
		break
	}
	sentinel := storeRound(t, ctx, first, 1000)
	stored = append(stored, sentinel...)
	hear(map[string]map[uint64]int{}, "kv@10.0.0.1@llama", sentinel)

	dialEngine(t, ctx, node, "10.0.0.2")
	got := map[string]map[uint64]int{}
	hear(got, "kv@10.0.0.2@llama", stored)
	// A last round by the first pod, announced to both: when the first pod
	// heard it, anything the node sent it before (a repeat of what it
	// stored) is in.
	last := storeRound(t, ctx, first, 1001)
	hear(got, "kv@10.0.0.1@llama", last)

	want := map[string]map[uint64]int{"kv@10.0.0.1@llama": {}, "kv@10.0.0.2@llama": {}}
	for _, k := range stored {
		want["kv@10.0.0.2@llama"][events.WireHash(k.Hash, events.HashInt).Int] = 1
	}
	for _, k := range last {
		h := events.WireHash(k.Hash, events.HashInt).Int
		want["kv@10.0.0.1@llama"][h] = 1
		if n, ok := got["kv@10.0.0.2@llama"][h]; ok { // NB: its part of that flush may come after
			want["kv@10.0.0.2@llama"][h] = n
		}
	}
	require.Equal(t, want, got, "the new pod hears every block the node holds, once; the first pod nothing again")
}

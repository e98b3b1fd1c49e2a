package events

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
)

// stored is a CPU BlockStored event of keys.
func stored(keys ...messages.Key) *messages.Event {
	return &messages.Event{Kind: messages.BlockStored, Medium: "CPU", Keys: keys, Ctx: ctxOf(1, ""),
		Place: messages.Place(keys, keys, nil)}
}

func nsKey(ns messages.Namespace, h string) messages.Key {
	return messages.Key{Namespace: ns, Hash: h}
}

// byTopic closes the hub's open batch and returns what each topic got: the
// number of blocks in each event type; each event is checked first.
func byTopic(ctx context.Context, t *testing.T, system *actor.ActorSystem, hub *actor.PID, sink chanSink,
	check ...func(Event)) map[string]map[string]int {
	t.Helper()
	flush(ctx, t, system, hub)
	got := map[string]map[string]int{}
	for {
		select {
		case e := <-sink:
			b, err := DecodeBatch(e.Payload)
			require.NoError(t, err)
			if got[e.Topic] == nil {
				got[e.Topic] = map[string]int{}
			}
			for _, ev := range b.Events {
				for _, c := range check {
					c(ev)
				}
				got[e.Topic][ev.Type] += max(len(ev.BlockHashes), 1)
			}
		default:
			return got
		}
	}
}

// Engines that declared their events' topic are told of the blocks of
// their key namespace, each under its own topic: two engines of one model
// both get its blocks, another model's engine only its own, a namespace
// no engine declared goes out under the publisher's topic, a removal of
// blocks of two namespaces is split between their engines, a clear goes to
// every topic, and an engine gone is told nothing more. Sequence numbers
// stay one sequence over every topic.
func TestHubAnnouncesEachEnginesBlocksUnderItsTopic(t *testing.T) {
	sink := make(chanSink, 64)
	system := actors.NewSystem(zerolog.Nop())
	defer system.Shutdown()
	hub := system.Root.Spawn(HubProps(HubConfig{Format: HashInt, Sink: sink, BatchWindow: time.Hour, Log: zerolog.Nop()}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	send := func(m any) { system.Root.Send(hub, m) }
	batch := func() map[string]map[string]int { return byTopic(ctx, t, system, hub, sink) }

	send(&messages.EngineTopic{Session: 1, Namespace: "a", Topic: "kv@pod1@model-a"})
	send(&messages.EngineTopic{Session: 2, Namespace: "a", Topic: "kv@pod2@model-a"})
	send(&messages.EngineTopic{Session: 3, Namespace: "b", Topic: "kv@pod3@model-b"})
	send(stored(nsKey("a", "a1"), nsKey("a", "a2")))
	send(stored(nsKey("b", "b1"), nsKey("b", "b2"), nsKey("b", "b3")))
	send(stored(nsKey("c", "c1")))
	require.Equal(t, map[string]map[string]int{
		"kv@pod1@model-a": {TypeBlockStored: 2},
		"kv@pod2@model-a": {TypeBlockStored: 2},
		"kv@pod3@model-b": {TypeBlockStored: 3},
		"":                {TypeBlockStored: 1},
	}, batch())

	send(&messages.Event{Kind: messages.BlockRemoved, Medium: "CPU",
		Keys: []messages.Key{nsKey("a", "a2"), nsKey("b", "b3"), nsKey("b", "b2")}})
	require.Equal(t, map[string]map[string]int{
		"kv@pod1@model-a": {TypeBlockRemoved: 1},
		"kv@pod2@model-a": {TypeBlockRemoved: 1},
		"kv@pod3@model-b": {TypeBlockRemoved: 2},
	}, batch(), "a removal across namespaces goes to each namespace's engines")

	send(&messages.EngineTopic{Session: 2, Gone: true})
	send(stored(nsKey("a", "a3")))
	require.Equal(t, map[string]map[string]int{"kv@pod1@model-a": {TypeBlockStored: 1}}, batch(),
		"the engine gone is told nothing more")

	send(&messages.Event{Kind: messages.AllBlocksCleared, Medium: "CPU"})
	cleared := batch()
	require.Len(t, cleared, 3, "a clear goes to every topic: %v", cleared)
	for topic, got := range cleared {
		require.Equal(t, map[string]int{TypeAllBlocksCleared: 1}, got, topic)
	}
	require.Equal(t, uint64(4+3+1+3), flush(ctx, t, system, hub), "one sequence over every topic")
	require.NoError(t, actors.StopAndWait(ctx, system, hub))
}

// splitByNamespace keeps each key's placement beside it.
func TestSplitByNamespaceKeepsPlacements(t *testing.T) {
	ks := []messages.Key{nsKey("a", "1"), nsKey("b", "2"), nsKey("a", "3")}
	e := stored(ks...)
	parts := splitByNamespace(e)
	require.Len(t, parts, 2)
	require.Equal(t, []messages.Key{ks[0], ks[2]}, parts[0].Keys)
	require.Equal(t, []messages.Placement{e.Place[0], e.Place[2]}, parts[0].Place)
	require.Equal(t, []messages.Key{ks[1]}, parts[1].Keys)
	require.Equal(t, []messages.Placement{e.Place[1]}, parts[1].Place)
	one := stored(ks[0], ks[2])
	require.Equal(t, []*messages.Event{one}, splitByNamespace(one), "one namespace: the event itself")
}

// A hub learning from an engine's own stream takes the engine's topic
// from it: once the node stores a block that stream announced, the
// engine's namespace goes out under the stream's topic (the engine's pod
// and model), not the publisher's own.
func TestHubTakesAnEnginesTopicFromItsOwnStream(t *testing.T) {
	system, pid, sink, _ := learningHub(t, time.Hour)
	system.Root.Send(pid, &Learn{Batch: engineBatch(nil, 4, 11), Topic: "kv@10.0.0.7@llama"})
	system.Root.Send(pid, engineStore(4, 11))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	flush(ctx, t, system, pid)
	require.Len(t, sink, 1)
	e := <-sink
	require.Equal(t, "kv@10.0.0.7@llama", e.Topic)
	b, err := DecodeBatch(e.Payload)
	require.NoError(t, err)
	require.Len(t, b.Events, 1)
	require.Equal(t, []int32{0, 1, 2, 3}, b.Events[0].TokenIDs)
	require.NoError(t, actors.StopAndWait(ctx, system, pid))
}

// countingSink counts what a hub publishes.
type countingSink struct {
	batches, bytes int
}

func (s *countingSink) Publish(e Entry) {
	s.batches++
	s.bytes += len(e.Payload)
}

// BenchmarkHubEngineTopics: what announcing each block under every engine
// of its namespace costs, against one topic for the node: the hub's time
// per stored block and the batches and bytes it publishes per stored block,
// with 0 (the node's topic), 1, 4 and 8 engines of one namespace.
//
//	go test -run '^$' -bench BenchmarkHubEngineTopics -benchtime 20000x ./events/
func BenchmarkHubEngineTopics(b *testing.B) {
	for _, engines := range []int{0, 1, 4, 8} {
		b.Run(fmt.Sprintf("engines=%d", engines), func(b *testing.B) {
			sink := &countingSink{}
			system := actors.NewSystem(zerolog.Nop())
			defer system.Shutdown()
			hub := system.Root.Spawn(HubProps(HubConfig{Format: HashInt, Sink: sink, BatchWindow: time.Hour,
				MaxBatchEvents: 64, Log: zerolog.Nop()}))
			for i := range engines {
				system.Root.Send(hub, &messages.EngineTopic{Session: uint64(i + 1), Namespace: "a",
					Topic: fmt.Sprintf("kv@10.0.0.%d@llama", i+1)})
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			b.ResetTimer()
			for i := range b.N {
				// NB: one block a store, 64 stores a batch (the hub's bound)
				system.Root.Send(hub, stored(nsKey("a", fmt.Sprintf("%016x", i))))
			}
			reply := messages.NewReply[uint64]()
			system.Root.Send(hub, &Flush{Reply: reply})
			select {
			case <-reply.C():
			case <-ctx.Done():
				b.Fatal("no answer to Flush")
			}
			b.StopTimer()
			b.ReportMetric(float64(sink.batches)/float64(b.N), "batches/block")
			b.ReportMetric(float64(sink.bytes)/float64(b.N), "bytes/block")
		})
	}
}

// resident stands in for the CPU tier: it answers a ResidentOf with the
// blocks of its namespace it was given, then says it did (its answer is
// in the hub's mailbox by then).
type resident struct {
	held  map[messages.Namespace]messages.Event
	asked chan *cpumsg.ResidentOf
}

func (r *resident) Receive(ctx actor.Context) {
	if m, ok := ctx.Message().(*cpumsg.ResidentOf); ok {
		ctx.Respond(&cpumsg.Resident{Topic: m.Topic, Event: r.held[m.Namespace]})
		r.asked <- m
	}
}

// heldEvent is the CPU tier's answer for keys of one chain: each with its
// provenance, as State.Resident gives it.
func heldEvent(keys ...messages.Key) messages.Event {
	c := ctxOf(len(keys), "")
	place := messages.Place(keys, keys, nil)
	prov := make([]*messages.Provenance, len(keys))
	for i := range keys {
		prov[i] = messages.NewProvenance(c, place[i])
	}
	return messages.Event{Kind: messages.BlockStored, Medium: messages.MediumCPU, Keys: keys, Prov: prov}
}

// An engine that joins after blocks of its namespace were announced is
// told of those the CPU tier still holds, under its topic only, once per
// topic new to the namespace; blocks the hub never announced (or no
// longer does) are left out, the hub's own record does not change (a
// later removal goes out once per topic), and an engine gone before the
// answer came is told nothing.
func TestHubAnnouncesTheResidentBlocksToAnEngineThatJoinsLater(t *testing.T) {
	sink := make(chanSink, 64)
	system := actors.NewSystem(zerolog.Nop())
	defer system.Shutdown()
	a1, a2, b1 := nsKey("a", "a1"), nsKey("a", "a2"), nsKey("b", "b1")
	tier := &resident{asked: make(chan *cpumsg.ResidentOf, 8), held: map[messages.Namespace]messages.Event{
		"a": heldEvent(a1, a2, nsKey("a", "a9")), // a9: never announced
		"c": heldEvent(nsKey("c", "c1")),
	}}
	tierPID := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return tier }))
	counters := &Counters{}
	hub := system.Root.Spawn(HubProps(HubConfig{Format: HashInt, Sink: sink, BatchWindow: time.Hour, Log: zerolog.Nop(),
		Resident: tierPID, Counters: counters}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	send := func(m any) { system.Root.Send(hub, m) }
	batch := func() map[string]map[string]int {
		return byTopic(ctx, t, system, hub, sink, func(ev Event) {
			if ev.Type == TypeBlockStored {
				require.NotEmpty(t, ev.TokenIDs, "announced with its tokens, not as a placeholder")
			}
		})
	}
	joined := func(want cpumsg.ResidentOf) {
		t.Helper()
		select {
		case got := <-tier.asked:
			require.Equal(t, want, *got)
		case <-ctx.Done():
			t.Fatal("the CPU tier was not asked")
		}
	}

	chain := func(keys ...messages.Key) *messages.Event {
		return &messages.Event{Kind: messages.BlockStored, Medium: "CPU", Keys: keys, Ctx: ctxOf(len(keys), ""),
			Place: messages.Place(keys, keys, nil)}
	}
	send(chain(a1, a2))
	send(chain(b1))
	require.Equal(t, map[string]map[string]int{"": {TypeBlockStored: 3}}, batch(), "no engine yet: the node's topic")

	send(&messages.EngineTopic{Session: 1, Namespace: "a", Topic: "kv@pod1@model-a"})
	joined(cpumsg.ResidentOf{Namespace: "a", Topic: "kv@pod1@model-a"})
	require.Equal(t, map[string]map[string]int{"kv@pod1@model-a": {TypeBlockStored: 2}}, batch(),
		"the blocks it can load already, under its topic only")
	require.Equal(t, uint64(2), counters.Reannounced.Load())

	send(&messages.EngineTopic{Session: 2, Namespace: "a", Topic: "kv@pod1@model-a"})
	require.Empty(t, batch(), "a second engine under a topic the namespace has: nothing to tell")
	require.Empty(t, tier.asked)

	send(&messages.EngineTopic{Session: 3, Namespace: "a", Topic: "kv@pod3@model-a"})
	joined(cpumsg.ResidentOf{Namespace: "a", Topic: "kv@pod3@model-a"})
	require.Equal(t, map[string]map[string]int{"kv@pod3@model-a": {TypeBlockStored: 2}}, batch())

	send(&messages.Event{Kind: messages.BlockRemoved, Medium: "CPU", Keys: []messages.Key{a1}})
	require.Equal(t, map[string]map[string]int{
		"kv@pod1@model-a": {TypeBlockRemoved: 1},
		"kv@pod3@model-a": {TypeBlockRemoved: 1},
	}, batch(), "announcing again changed nothing of the hub's record")

	send(&messages.EngineTopic{Session: 4, Namespace: "c", Topic: "kv@pod4@model-c"})
	send(&messages.EngineTopic{Session: 4, Gone: true})
	joined(cpumsg.ResidentOf{Namespace: "c", Topic: "kv@pod4@model-c"})
	require.Empty(t, batch(), "the engine left before the answer came")
	require.NoError(t, actors.StopAndWait(ctx, system, hub))
}

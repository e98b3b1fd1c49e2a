package events

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
)

// Hub is the events actor: tiers send it their events (*messages.Event),
// and notes of the writes they start and abort (so a block whose parent is
// still being written waits for it: Translator); it translates them,
// gathers what arrives back to back into one batch, numbers the batch and
// hands its encoded payload to the sink.
//
// Invariants:
//   - hub state (translator, next sequence number, the open batch) outlives
//     the actor: a supervisor restart neither rewinds sequence numbers nor
//     forgets which blocks are announced.
//   - sequence numbers start at 0 and grow by exactly 1 per batch handed to
//     the sink; a batch is never empty.
//   - a batch closes when the flushBatch the hub sent itself on opening it
//     comes back through the mailbox (so every event queued behind the first
//     joins it), or at MaxBatchEvents. No timer, no polling: an idle hub
//     receives nothing and does nothing.
//   - Receive never blocks: the sink's Publish does not.
//   - an event of a key namespace that engines declared topics for
//     (*messages.EngineTopic) goes out under each of those topics, and under
//     the publisher's own topic only when no engine declared one; a batch
//     is encoded once per topic it has events for, each numbered in turn.
//   - with learning on (HubConfig.LearnCapacity), a stored event whose
//     engine blocks have no token ids yet waits at most LearnWait for the
//     engine's own announcement of them (a *Learn); events behind it wait
//     with it, so the translator sees every event in arrival order. Flush
//     and stopping release every waiting event first.
type Hub struct {
	cfg HubConfig
	st  *hubState
}

// Sink takes published batches; Publish must not block.
type Sink interface {
	Publish(Entry)
}

// Entry is one published batch: its sequence number, msgpack payload and
// topic ("": the publisher's own). Payloads are immutable once built.
type Entry struct {
	Seq     uint64
	Payload []byte
	Topic   string
}

// HubConfig is what the hub needs.
type HubConfig struct {
	Format         HashFormat       // block hash form on the wire
	SpecKind       string           // kv_cache_spec_kind of stored blocks whose request does not say; "" = omitted
	DPRank         int64            // data_parallel_rank of every batch
	MaxBatchEvents int              // events per batch at most; 0 = DefaultMaxBatchEvents
	BatchWindow    time.Duration    // how long a batch gathers events after its first; ≤ 0 = what the mailbox holds at once
	Encoding       Encoding         // events as tagged maps (default) or legacy arrays
	Sink           Sink             // where batches go
	Now            func() time.Time // batch timestamps
	Counters       *Counters        // shared with the node; may be nil
	Log            zerolog.Logger
	// LearnCapacity turns learning on: the hub remembers up to this many
	// blocks from engines' own KV events (*Learn) and announces the blocks
	// those engines stored in kvtier with their token ids (Learned). 0: off.
	LearnCapacity int
	// LearnWait bounds how long a stored event waits for its engine's
	// announcement; ≤ 0 = DefaultLearnWait.
	LearnWait time.Duration
	// Resident is the tier asked for the blocks an engine joining under a
	// topic new to its namespace can load already (*cpumsg.ResidentOf;
	// the CPU tier): they are announced again under that topic only. nil:
	// an engine is told of what happens after it came, no more.
	Resident *actor.PID
}

// DefaultLearnWait is how long a stored block waits for its token ids by
// default: its engine announced it a step or more before it stored it, so
// only a delayed engine publisher (or one kvtierd does not hear) waits.
const DefaultLearnWait = 500 * time.Millisecond

// DefaultMaxBatchEvents bounds a batch.
const DefaultMaxBatchEvents = 1024

// DefaultBatchWindow is how long a batch gathers events by default.
const DefaultBatchWindow = 10 * time.Millisecond

// Counters are the hub's monotonic counters, readable from any goroutine.
type Counters struct {
	Batches         atomic.Uint64 // batches handed to the sink
	Events          atomic.Uint64 // wire events in them
	Placeholders    atomic.Uint64 // stored blocks without full provenance
	UnknownRemovals atomic.Uint64 // removals of blocks never announced stored
	HeldForParent   atomic.Uint64 // stored blocks held back until their parent (being written) was announced
	EncodeErrors    atomic.Uint64 // batches that failed to encode (dropped)
	Learned         atomic.Uint64 // blocks learned from engines' events
	Filled          atomic.Uint64 // stored blocks announced with learned token ids
	AwaitedTokens   atomic.Uint64 // stored events that waited for their engine's announcement
	TokensLate      atomic.Uint64 // ... of which the wait ran out (announced without them)
	Reannounced     atomic.Uint64 // resident blocks announced again to an engine that joined after them
}

type hubState struct {
	tr        *Translator
	seq       uint64 // next sequence number
	pending   []Event
	pendingNS []messages.Namespace // each pending event's key namespace ("": every namespace's, a clear)
	engines   engineTopics
	// told is, per engine topic whose resident blocks were asked for, the
	// blocks announced under it already (the stored event its topic was
	// learned from): left out of the answer.
	told        map[engineTopic][]messages.Key
	flushQueued bool
	window      *time.Timer // armed while a batch gathers (BatchWindow > 0)
	warned      bool        // a placeholder was logged once
	waiting     []awaiting  // events held while the first awaits its token ids, in arrival order
	waitTimer   *time.Timer // armed while waiting is not empty
}

// awaiting is an event held back, and until when its first may wait.
type awaiting struct {
	e     *messages.Event
	until time.Time
}

// Messages the hub takes besides *messages.Event.
type (
	// Flush closes the open batch now and answers, once the batch is with
	// the sink, the sequence number the next batch will get. The node asks
	// it from outside the actors, so it carries its reply.
	Flush struct{ Reply messages.Reply[uint64] }
	// flushBatch is the hub's note to itself to close the open batch.
	flushBatch struct{}
	// Learn is a batch of an engine's own KV events (vLLM's, as its
	// publisher sent them, under Topic): what they say of the blocks the
	// engine caches is remembered (Learned), and events waiting for it are
	// released. A block the engine stored in kvtier is then announced under
	// Topic too: the engine can load every block of its namespace.
	Learn struct {
		Batch *Batch
		Topic string // the topic the engine published it under ("" = unknown)
	}
	// waitOver is the hub's note to itself that the first waiting event's
	// time may be up.
	waitOver struct{}
)

// HubProps builds the hub's props; its state is made here, once, so that
// restarts keep it.
func HubProps(cfg HubConfig) *actor.Props {
	if cfg.MaxBatchEvents <= 0 {
		cfg.MaxBatchEvents = DefaultMaxBatchEvents
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Counters == nil {
		cfg.Counters = &Counters{}
	}
	if cfg.LearnWait <= 0 {
		cfg.LearnWait = DefaultLearnWait
	}
	st := &hubState{tr: NewTranslator(cfg.Format)}
	st.tr.SpecKind = cfg.SpecKind
	if cfg.LearnCapacity > 0 {
		st.tr.Learned = NewLearned(cfg.LearnCapacity)
	}
	return actor.PropsFromProducer(func() actor.Actor { return &Hub{cfg: cfg, st: st} },
		actor.WithReceiverMiddleware(supervision.Faults))
}

// Receive handles one message.
func (h *Hub) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *messages.Event:
		h.receive(ctx, m)
	case *Learn:
		h.learn(ctx, m)
	case *messages.EngineTopic:
		if h.st.engines.apply(m) {
			h.askResident(ctx, m.Namespace, m.Topic)
		}
	case *cpumsg.Resident:
		h.reannounce(m)
	case waitOver, *waitOver:
		h.release(ctx, false)
	case flushBatch, *flushBatch:
		h.st.flushQueued = false
		h.flush()
	case *Flush:
		h.release(ctx, true)
		h.flush()
		m.Reply.Answer(h.st.seq, nil)
	case *actor.Started:
		// After a restart the note that would close the open batch (or end
		// a wait) may have been the message that failed.
		if len(h.st.pending) > 0 {
			h.st.flushQueued = true
			ctx.Send(ctx.Self(), &flushBatch{})
		}
		if len(h.st.waiting) > 0 {
			ctx.Send(ctx.Self(), &waitOver{})
		}
	case *actor.Stopping:
		h.release(ctx, true)
		if h.st.window != nil {
			h.st.window.Stop()
		}
		h.flush()
	case *actor.Stopped, *actor.Restarting, *actor.Restart:
	default:
		h.cfg.Log.Warn().Str("type", fmt.Sprintf("%T", m)).Msg("events hub: unknown message dropped")
	}
}

// receive translates e now, or holds it (with learning on) while it, or
// an event before it, awaits its engine's token ids.
func (h *Hub) receive(ctx actor.Context, e *messages.Event) {
	awaits := h.st.tr.AwaitsTokens(e)
	if len(h.st.waiting) == 0 && !awaits {
		h.apply(ctx, e)
		return
	}
	if awaits {
		h.cfg.Counters.AwaitedTokens.Add(1)
	}
	// NB: wall time, as the batch window: waiting decides a payload, never
	// whether or in which order blocks are announced.
	h.st.waiting = append(h.st.waiting, awaiting{e: e, until: time.Now().Add(h.cfg.LearnWait)})
	h.release(ctx, false)
}

// learn remembers what an engine's batch says and releases what it
// completed.
func (h *Hub) learn(ctx actor.Context, m *Learn) {
	l := h.st.tr.Learned
	if l == nil || m.Batch == nil {
		return
	}
	h.cfg.Counters.Learned.Add(uint64(l.LearnFrom(m.Batch, m.Topic)))
	h.release(ctx, false)
}

// release translates the waiting events in order, up to the first that
// still awaits token ids and has time left (all of them when force).
func (h *Hub) release(ctx actor.Context, force bool) {
	now := time.Now()
	for len(h.st.waiting) > 0 {
		w := h.st.waiting[0]
		if awaits := h.st.tr.AwaitsTokens(w.e); awaits {
			if !force && now.Before(w.until) {
				h.armWait(ctx, w.until.Sub(now))
				return
			}
			h.cfg.Counters.TokensLate.Add(1)
		}
		h.st.waiting[0] = awaiting{}
		h.st.waiting = h.st.waiting[1:]
		h.apply(ctx, w.e)
	}
	h.st.waiting = nil
	if h.st.waitTimer != nil {
		h.st.waitTimer.Stop()
		h.st.waitTimer = nil
	}
}

// armWait (re)arms the note that ends the first waiting event's wait.
func (h *Hub) armWait(ctx actor.Context, d time.Duration) {
	if h.st.waitTimer != nil {
		h.st.waitTimer.Stop()
	}
	self, root := ctx.Self(), ctx.ActorSystem().Root
	h.st.waitTimer = time.AfterFunc(d, func() { root.Send(self, &waitOver{}) })
}

func (h *Hub) apply(ctx actor.Context, e *messages.Event) {
	if l := h.st.tr.Learned; l != nil && e.Kind == messages.BlockStored && len(e.Keys) > 0 {
		// NB: an engine's own stream named the topic of a block it stored:
		// the engine's namespace goes out under that topic from now on.
		if topic := l.TopicOf(e.Keys[0].Hash); topic != "" && h.st.engines.learned(e.Keys[0].Namespace, topic) {
			h.askResident(ctx, e.Keys[0].Namespace, topic, e.Keys...)
		}
	}
	if len(h.st.engines.byNS) == 0 {
		h.translate(ctx, e, namespaceOf(e))
		return
	}
	for _, part := range splitByNamespace(e) {
		h.translate(ctx, part, namespaceOf(part))
	}
}

// askResident asks the resident tier for the blocks of ns, to announce
// them under topic (but told, announced there already): an engine that
// came after them can load them too.
func (h *Hub) askResident(ctx actor.Context, ns messages.Namespace, topic string, told ...messages.Key) {
	if h.cfg.Resident == nil {
		return
	}
	if len(told) > 0 {
		if h.st.told == nil {
			h.st.told = map[engineTopic][]messages.Key{}
		}
		h.st.told[engineTopic{ns, topic}] = told
	}
	ctx.Request(h.cfg.Resident, &cpumsg.ResidentOf{Namespace: ns, Topic: topic})
}

// reannounce announces the resident blocks m names under m's topic only,
// after what was pending (which went out under the topic already). Blocks
// the translator no longer holds announced are left out; the translator's
// own record does not change (they are announced, once, already).
func (h *Hub) reannounce(m *cpumsg.Resident) {
	ns := namespaceOf(&m.Event)
	et := engineTopic{ns, m.Topic}
	told := h.st.told[et]
	delete(h.st.told, et)
	if !h.st.engines.has(ns, m.Topic) {
		return // the engine left meanwhile
	}
	wire := h.st.tr.Restate(&m.Event, told...)
	if len(wire) == 0 {
		return
	}
	h.flush()
	blocks := 0
	for _, ev := range wire {
		blocks += len(ev.BlockHashes)
	}
	for len(wire) > 0 {
		take := min(h.cfg.MaxBatchEvents, len(wire))
		h.publish(wire[:take], m.Topic)
		wire = wire[take:]
	}
	h.cfg.Counters.Reannounced.Add(uint64(blocks))
}

// translate turns e (keys of namespace ns; "" for a clear) into wire
// events and adds them to the open batch.
func (h *Hub) translate(ctx actor.Context, e *messages.Event, ns messages.Namespace) {
	tr := h.st.tr
	before, filled := tr.Placeholders, tr.Filled
	wire := tr.Apply(e)
	h.cfg.Counters.Filled.Add(tr.Filled - filled)
	h.cfg.Counters.UnknownRemovals.Store(tr.UnknownRemovals)
	h.cfg.Counters.HeldForParent.Store(tr.Held)
	if n := tr.Placeholders - before; n > 0 {
		h.cfg.Counters.Placeholders.Add(n)
		if !h.st.warned {
			h.st.warned = true
			req := ""
			if e.Ctx != nil {
				req = e.Ctx.RequestID
			}
			h.cfg.Log.Warn().Uint64("blocks", n).Str("request", req).
				Msg("events hub: stored blocks without token ids or block size (placeholders); counting the rest silently")
		}
	}
	for len(wire) > 0 {
		room := h.cfg.MaxBatchEvents - len(h.st.pending)
		take := min(room, len(wire))
		h.st.pending = append(h.st.pending, wire[:take]...)
		for range take {
			h.st.pendingNS = append(h.st.pendingNS, ns)
		}
		wire = wire[take:]
		if len(h.st.pending) >= h.cfg.MaxBatchEvents {
			h.flush()
		}
	}
	if len(h.st.pending) > 0 && !h.st.flushQueued {
		h.st.flushQueued = true
		if h.cfg.BatchWindow <= 0 {
			ctx.Send(ctx.Self(), &flushBatch{})
			return
		}
		// NB: wall time, not the node's clock: batching is not semantics, and
		// a test's manual clock must not hold events back.
		self, root := ctx.Self(), ctx.ActorSystem().Root
		h.st.window = time.AfterFunc(h.cfg.BatchWindow, func() { root.Send(self, &flushBatch{}) })
	}
}

// flush encodes the open batch and hands it to the sink: once, or once per
// topic it has events for when engines declared topics.
func (h *Hub) flush() {
	if len(h.st.pending) == 0 {
		return
	}
	events, spaces := h.st.pending, h.st.pendingNS
	h.st.pending, h.st.pendingNS = nil, nil
	if len(h.st.engines.byNS) == 0 {
		h.publish(events, "")
		return
	}
	ts := Timestamp(h.cfg.Now())
	var encoded []topicGroup // NB: the engines of one namespace get one payload
	for _, g := range h.st.engines.route(events, spaces) {
		var payload []byte
		for _, e := range encoded {
			if slices.Equal(e.places, g.places) {
				payload = e.payload
				break
			}
		}
		if payload == nil {
			if payload = h.encode(g.events, ts); payload == nil {
				continue
			}
			g.payload = payload
			encoded = append(encoded, g)
		}
		h.hand(payload, g.topic, len(g.events))
	}
}

// publish encodes events as one batch under topic and hands it to the sink.
func (h *Hub) publish(events []Event, topic string) {
	if payload := h.encode(events, Timestamp(h.cfg.Now())); payload != nil {
		h.hand(payload, topic, len(events))
	}
}

// encode is events as one batch's payload; nil (counted, logged) when
// they do not encode.
func (h *Hub) encode(events []Event, ts float64) []byte {
	b := Batch{TS: ts, Events: events, DPRank: h.cfg.DPRank, HasDPRank: true}
	payload, err := EncodeBatchAs(&b, h.cfg.Encoding)
	if err != nil {
		h.cfg.Counters.EncodeErrors.Add(1)
		h.cfg.Log.Error().Err(err).Int("events", len(b.Events)).Msg("events hub: batch dropped")
		return nil
	}
	return payload
}

// hand numbers a batch's payload and hands it to the sink under topic.
func (h *Hub) hand(payload []byte, topic string, events int) {
	seq := h.st.seq
	h.st.seq++
	h.cfg.Counters.Batches.Add(1)
	h.cfg.Counters.Events.Add(uint64(events))
	h.cfg.Sink.Publish(Entry{Seq: seq, Payload: payload, Topic: topic})
}

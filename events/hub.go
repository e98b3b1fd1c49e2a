package events

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
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
type Hub struct {
	cfg HubConfig
	st  *hubState
}

// Sink takes published batches; Publish must not block.
type Sink interface {
	Publish(Entry)
}

// Entry is one published batch: its sequence number and msgpack payload.
// Payloads are immutable once built.
type Entry struct {
	Seq     uint64
	Payload []byte
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
}

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
}

type hubState struct {
	tr          *Translator
	seq         uint64 // next sequence number
	pending     []Event
	flushQueued bool
	window      *time.Timer // armed while a batch gathers (BatchWindow > 0)
	warned      bool        // a placeholder was logged once
}

// Messages the hub takes besides *messages.Event.
type (
	// Flush closes the open batch now; the hub answers *Flushed to the
	// sender once the batch is with the sink.
	Flush struct{}
	// Flushed answers Flush.
	Flushed struct{ Seq uint64 } // the next sequence number
	// flushBatch is the hub's note to itself to close the open batch.
	flushBatch struct{}
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
	st := &hubState{tr: NewTranslator(cfg.Format)}
	st.tr.SpecKind = cfg.SpecKind
	return actor.PropsFromProducer(func() actor.Actor { return &Hub{cfg: cfg, st: st} },
		actor.WithReceiverMiddleware(supervision.Faults))
}

// Receive handles one message.
func (h *Hub) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *messages.Event:
		h.apply(ctx, m)
	case flushBatch, *flushBatch:
		h.st.flushQueued = false
		h.flush()
	case *Flush:
		h.flush()
		ctx.Respond(&Flushed{Seq: h.st.seq})
	case *actor.Started:
		// After a restart the note that would close the open batch may have
		// been the message that failed.
		if len(h.st.pending) > 0 {
			h.st.flushQueued = true
			ctx.Send(ctx.Self(), &flushBatch{})
		}
	case *actor.Stopping:
		if h.st.window != nil {
			h.st.window.Stop()
		}
		h.flush()
	case *actor.Stopped, *actor.Restarting, *actor.Restart:
	default:
		h.cfg.Log.Warn().Str("type", fmt.Sprintf("%T", m)).Msg("events hub: unknown message dropped")
	}
}

func (h *Hub) apply(ctx actor.Context, e *messages.Event) {
	tr := h.st.tr
	before := tr.Placeholders
	wire := tr.Apply(e)
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

// flush encodes the open batch and hands it to the sink.
func (h *Hub) flush() {
	if len(h.st.pending) == 0 {
		return
	}
	b := Batch{TS: Timestamp(h.cfg.Now()), Events: h.st.pending, DPRank: h.cfg.DPRank, HasDPRank: true}
	h.st.pending = nil
	payload, err := EncodeBatchAs(&b, h.cfg.Encoding)
	if err != nil {
		h.cfg.Counters.EncodeErrors.Add(1)
		h.cfg.Log.Error().Err(err).Int("events", len(b.Events)).Msg("events hub: batch dropped")
		return
	}
	seq := h.st.seq
	h.st.seq++
	h.cfg.Counters.Batches.Add(1)
	h.cfg.Counters.Events.Add(uint64(len(b.Events)))
	h.cfg.Sink.Publish(Entry{Seq: seq, Payload: payload})
}

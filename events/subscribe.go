package events

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/go-zeromq/zmq4"

	"github.com/kvtier/kvtier/internal/zmqx"
)

// SubscriberConfig is what `kvtier events tail` and a node learning from
// engines (events.learn_from) subscribe with.
type SubscriberConfig struct {
	Endpoint string // the publisher's PUB address, or the address to bind (Mode)
	// Mode is how the SUB opens Endpoint: ModeConnect ("" too), ModeBind
	// (publishers connect to it: engines whose PUB connects), or ModeAuto
	// (SubscriberBinds). A bound SUB may hear many publishers, each
	// numbering its own batches, coming and going: it delivers every batch
	// as it comes, with no sequence tracking (Missed is 0), takes no
	// Replay, and hands what one publisher got wrong (its connection's end,
	// a malformed message) to Skipped instead of ending.
	Mode string
	// Skipped, when set, hears what a bound SUB skipped. It must not block
	// (two of Subscribe's goroutines may call it at once).
	Skipped func(error)
	Replay  string // the node's replay ROUTER address; "" = no replay
	Topic   string // topic prefix to subscribe to; "" = every topic
	// ReplayFrom, when Replay is set and it is ≥ 0, first replays the
	// buffered batches from that sequence number; -1 starts live.
	ReplayFrom int64
	// NoFollow stops after the replay (needs ReplayFrom ≥ 0).
	NoFollow bool
	// Replayed, when set, is called once the first replay ended, with how
	// many batches it delivered, before any live batch is delivered. A
	// replay from 0 that delivered none means the publisher has published
	// nothing yet (it always keeps its newest batches).
	Replayed func(delivered int)
}

// Delivery is one batch handed to the subscriber's callback.
type Delivery struct {
	Seq      uint64
	Topic    string // "" for replayed batches (the replay socket sends none)
	Batch    *Batch
	Replayed bool
	// Missed is how many batches before this one were neither received nor
	// replayable (lost to a full replay buffer or no replay socket).
	Missed uint64
}

// Subscribe delivers batches in sequence order to fn until ctx ends, fn
// fails or (NoFollow) the replay ends. Live batches are read while a replay
// runs and queued; duplicates (seen in the replay) are dropped; a gap in
// the live sequence is filled from the replay socket when there is one.
// Undecodable payloads end it with ErrMalformed. A bound SUB (Mode)
// delivers in arrival order and skips what it cannot decode.
func Subscribe(ctx context.Context, cfg SubscriberConfig, fn func(Delivery) error) error {
	binds, err := SubscriberBinds(cfg.Mode, cfg.Endpoint)
	if err != nil {
		return err
	}
	if binds && cfg.Replay != "" {
		return fmt.Errorf("%w: a bound subscriber takes no replay endpoint (its publishers are many)", ErrBadConfig)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, cfg.Topic); err != nil {
		return fmt.Errorf("events: subscribe: %w", err)
	}
	if binds {
		// NB: through zmqx's bounded listening transport, so a peer that
		// connects and never greets cannot hold zmq4's one accept loop.
		if err := sub.Listen(zmqx.BoundedListenAddr(cfg.Endpoint)); err != nil {
			return fmt.Errorf("events: bind sub %s: %w", cfg.Endpoint, err)
		}
	} else if err := sub.Dial(zmqx.ClosingDialAddr(cfg.Endpoint)); err != nil {
		// NB: through zmqx's closing transport, so a publisher that accepts
		// and never greets cannot hold Dial (or this function) past the
		// cancel.
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("events: dial %s: %w", cfg.Endpoint, err)
	}
	s := &subscriber{cfg: cfg, fn: fn, unordered: binds}
	live := make(chan zmq4.Msg, 1024)
	readErr := make(chan error, 1)
	go func() {
		defer close(live)
		for {
			m, err := sub.Recv()
			if err != nil && binds && ctx.Err() == nil {
				s.skip(fmt.Errorf("events: a publisher's connection ended: %w", err))
				continue // NB: zmq4 hands a connection's end to Recv once
			}
			if err != nil {
				readErr <- err
				return
			}
			select {
			case live <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	if cfg.Replay != "" && cfg.ReplayFrom >= 0 {
		if err := s.replay(ctx, uint64(cfg.ReplayFrom)); err != nil {
			return err
		}
		if cfg.Replayed != nil {
			cfg.Replayed(s.delivered)
		}
		if cfg.NoFollow {
			return nil
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m, ok := <-live:
			if !ok {
				err := <-readErr
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("events: receive: %w", err)
			}
			if err := s.live(ctx, m); err != nil {
				return err
			}
		}
	}
}

type subscriber struct {
	cfg       SubscriberConfig
	fn        func(Delivery) error
	unordered bool   // bound: many publishers, no sequence tracking
	next      uint64 // next sequence number expected
	started   bool   // next is meaningful
	delivered int    // batches delivered so far
}

func (s *subscriber) deliver(d Delivery) error {
	if s.unordered {
		s.delivered++
		return s.fn(d)
	}
	if s.started && d.Seq > s.next {
		d.Missed = d.Seq - s.next
	}
	s.next, s.started = d.Seq+1, true
	s.delivered++
	return s.fn(d)
}

func (s *subscriber) live(ctx context.Context, m zmq4.Msg) error {
	if len(m.Frames) != 3 || len(m.Frames[1]) != 8 {
		return s.malformed(fmt.Errorf("%w: message of %d frames", ErrMalformed, len(m.Frames)))
	}
	seq := binary.BigEndian.Uint64(m.Frames[1])
	if !s.unordered && s.started && seq < s.next {
		return nil // already delivered by a replay
	}
	if !s.unordered && s.started && seq > s.next && s.cfg.Replay != "" {
		if err := s.replayUpTo(ctx, s.next, seq); err != nil {
			return err
		}
		if seq < s.next {
			return nil
		}
	}
	b, err := DecodeBatch(m.Frames[2])
	if err != nil {
		return s.malformed(fmt.Errorf("seq %d: %w", seq, err))
	}
	return s.deliver(Delivery{Seq: seq, Topic: string(m.Frames[0]), Batch: b})
}

// malformed is err, which ends the subscription, or (bound) nil once err
// is skipped: one publisher's bad message does not deafen the others.
func (s *subscriber) malformed(err error) error {
	if !s.unordered {
		return err
	}
	s.skip(err)
	return nil
}

// skip hands err to Skipped, when set.
func (s *subscriber) skip(err error) {
	if s.cfg.Skipped != nil {
		s.cfg.Skipped(err)
	}
}

func (s *subscriber) replay(ctx context.Context, from uint64) error {
	return s.replayUpTo(ctx, from, EndSeq)
}

// replayUpTo asks the replay socket for the batches from `from` and
// delivers those below `upTo`.
func (s *subscriber) replayUpTo(ctx context.Context, from, upTo uint64) error {
	return Replay(ctx, s.cfg.Replay, from, func(seq uint64, payload []byte) error {
		if seq >= upTo || (s.started && seq < s.next) {
			return nil
		}
		b, err := DecodeBatch(payload)
		if err != nil {
			return fmt.Errorf("replayed seq %d: %w", seq, err)
		}
		return s.deliver(Delivery{Seq: seq, Batch: b, Replayed: true})
	})
}

// Replay asks the replay socket at addr for the buffered batches from
// `from` on and hands each to fn, until the terminator.
func Replay(ctx context.Context, addr string, from uint64, fn func(seq uint64, payload []byte) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dealer := zmq4.NewDealer(ctx)
	defer dealer.Close()
	if err := dealer.Dial(zmqx.ClosingDialAddr(addr)); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("events: dial replay %s: %w", addr, err)
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	if err := dealer.Send(zmq4.NewMsgFrom(nil, start[:])); err != nil {
		return fmt.Errorf("events: replay request: %w", err)
	}
	for {
		m, err := dealer.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("events: replay: %w", err)
		}
		frames := m.Frames
		if len(frames) == 4 {
			// vLLM ≥ 0.32 (and kvtierd): ["", topic, seq, payload]; older
			// publishers send no topic.
			frames = append(frames[:1:1], frames[2:]...)
		}
		if len(frames) != 3 || len(frames[0]) != 0 || len(frames[1]) != 8 {
			return fmt.Errorf("%w: replay message of %d frames", ErrMalformed, len(m.Frames))
		}
		seq := binary.BigEndian.Uint64(frames[1])
		if seq == EndSeq {
			return nil
		}
		if err := fn(seq, frames[2]); err != nil {
			return err
		}
	}
}

package events

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/internal/defaults"
)

// EndSeq is the sequence number of the replay terminator (-1 as int64).
const EndSeq = ^uint64(0)

// Publisher owns the ZeroMQ sockets: batches handed to Publish go out on the
// PUB socket as [topic, seq (8 bytes big endian), payload] and into a
// bounded replay buffer that the ROUTER socket serves.
//
// The PUB socket binds its endpoint, or connects to a subscriber that bound
// it (Mode; a router that reads many engines' events, as llm-d's does).
//
// Goroutines (all ended by Close):
//   - loop: owns the PUB socket and the replay buffer; blocks on the
//     publish queue, replay requests and Close.
//   - dialer (a connecting PUB): connects, blocks until the connection
//     ends or Close, and connects again after a backoff (ReconnectMin
//     doubling to ReconnectMax, by timer; back to ReconnectMin once
//     connected). Batches published while it is not connected are sent to
//     no one (as ZeroMQ's PUB does) and stay in the replay buffer.
//   - replay reader (with a replay endpoint): owns the ROUTER socket; blocks
//     in Recv, asks loop for the buffered batches from the requested
//     sequence number, and sends them to the requester, so a slow replay
//     client delays other replays but never publishing.
//
// Invariants:
//   - Publish never blocks: beyond QueueBatches waiting batches it drops
//     (counted; subscribers see the sequence gap and can replay what the
//     buffer still holds).
//   - the replay buffer holds at most BufferBatches batches and BufferBytes
//     bytes of payload, the newest ones, in sequence order.
//   - Close sends every batch already handed to Publish, then waits up to
//     Linger after the last send (zmq4 queues PUB messages without telling
//     when they have left, and closing drops what is queued), all bounded
//     by Close's context.
type Publisher struct {
	cfg    PublisherConfig
	pub    zmq4.Socket
	router zmq4.Socket // nil without a replay endpoint
	link   *link       // the connecting PUB's connection; nil when it binds
	out    chan Entry
	asks   chan replayAsk
	stop   chan struct{}
	closed atomic.Bool

	stopCtx  context.Context // set before stop closes
	loopDone chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
	closeErr error

	buf ring // owned by loop

	Published    atomic.Uint64 // batches sent on the PUB socket
	Dropped      atomic.Uint64 // batches dropped because the queue was full or closed
	Replays      atomic.Uint64 // replay requests served
	BadRequests  atomic.Uint64 // malformed replay requests dropped
	ReplayFrames atomic.Uint64 // batches sent by replays
	Wakeups      atomic.Uint64 // times loop woke: a batch, a replay request or Close; nothing else wakes it
	Connects     atomic.Uint64 // connections a connecting PUB made (its first, then each after a loss)
}

// PublisherConfig configures the sockets.
type PublisherConfig struct {
	Endpoint string // PUB address to bind (tcp://*:5557) or connect to (tcp://router:5557) (required)
	// Mode is how the PUB opens Endpoint: ModeBind ("" too), ModeConnect,
	// or ModeAuto (vLLM's rule, VLLMBinds).
	Mode          string
	Replay        string        // ROUTER address to bind; "" = no replay socket
	Topic         string        // first frame of every published message
	BufferBatches int           // replay buffer, batches; 0 = DefaultBufferBatches
	BufferBytes   int           // replay buffer, payload bytes; 0 = DefaultBufferBytes
	QueueBatches  int           // batches waiting to be sent; 0 = DefaultQueueBatches
	HWM           int           // zmq4 PUB queue bound (messages); 0 = DefaultHWM
	Linger        time.Duration // Close waits this long after the last send; 0 = DefaultLinger, <0 = none
	// ReconnectMin and ReconnectMax bound a connecting PUB's backoff
	// between dials (0: DefaultReconnectMin, DefaultReconnectMax).
	ReconnectMin, ReconnectMax time.Duration
	// HandshakeTimeout bounds a connecting PUB's ZMTP handshake: a router
	// that accepts and never greets is dialled again after the backoff (0:
	// DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	Log              zerolog.Logger
}

// Defaults.
const (
	DefaultBufferBatches = 10_000
	DefaultBufferBytes   = 256 << 20
	DefaultQueueBatches  = 65_536
	DefaultHWM           = 100_000
	DefaultLinger        = 100 * time.Millisecond
	// As libzmq's ZMQ_RECONNECT_IVL (100ms); its default has no maximum,
	// a dead router is asked every 5s here.
	DefaultReconnectMin     = 100 * time.Millisecond
	DefaultReconnectMax     = 5 * time.Second
	DefaultHandshakeTimeout = 5 * time.Second
	// dialTimeout bounds one TCP connect of a connecting PUB.
	dialTimeout = 2 * time.Second
)

type replayAsk struct {
	from  uint64
	reply chan []Entry // capacity 1
}

// Listen opens the sockets (the PUB binds or connects, as cfg.Mode says;
// the replay ROUTER binds) and starts the goroutines. A connecting PUB
// returns at once: it connects in the background, and again whenever the
// connection ends.
func Listen(cfg PublisherConfig) (*Publisher, error) {
	if cfg.Endpoint == "" {
		return nil, fmt.Errorf("%w: events endpoint is empty", ErrBadConfig)
	}
	binds, err := PublisherBinds(cfg.Mode, cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	p := &Publisher{cfg: cfg, out: make(chan Entry, cfg.QueueBatches), asks: make(chan replayAsk),
		stop: make(chan struct{}), loopDone: make(chan struct{}),
		buf: ring{maxN: cfg.BufferBatches, maxBytes: cfg.BufferBytes}}
	ctx := context.Background()
	if !binds {
		p.link = newLink(cfg.HandshakeTimeout)
		ctx = p.link.context(ctx)
	}
	// NB: a connecting PUB's Dial tries once (the dialer retries, by
	// timer) and each TCP connect is bounded.
	p.pub = zmq4.NewPub(ctx, zmq4.WithLogger(zmqLogger(cfg.Log)), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(dialTimeout))
	if err := p.pub.SetOption(zmq4.OptionHWM, cfg.HWM); err != nil {
		_ = p.pub.Close()
		return nil, fmt.Errorf("events: pub hwm: %w", err)
	}
	if binds {
		if err := p.pub.Listen(cfg.Endpoint); err != nil {
			_ = p.pub.Close()
			return nil, fmt.Errorf("events: bind pub %s: %w", cfg.Endpoint, err)
		}
	}
	if cfg.Replay != "" {
		p.router = zmq4.NewRouter(context.Background(), zmq4.WithLogger(zmqLogger(cfg.Log)))
		if err := p.router.Listen(cfg.Replay); err != nil {
			_ = p.router.Close()
			_ = p.pub.Close()
			return nil, fmt.Errorf("events: bind replay %s: %w", cfg.Replay, err)
		}
		p.wg.Add(1)
		go p.replayReader()
	}
	if !binds {
		p.wg.Add(1)
		go p.dialer()
	}
	go p.loop()
	cfg.Log.Info().Str("endpoint", p.Endpoint()).Bool("connect", !binds).Str("replay", p.ReplayEndpoint()).
		Str("topic", cfg.Topic).Int("buffer_batches", cfg.BufferBatches).Msg("events publisher open")
	return p, nil
}

func (c PublisherConfig) withDefaults() PublisherConfig {
	defaults.FillNonPositive(&c, PublisherConfig{
		BufferBatches: DefaultBufferBatches,
		BufferBytes:   DefaultBufferBytes,
		QueueBatches:  DefaultQueueBatches,
		HWM:           DefaultHWM,
	})
	if c.Linger == 0 { // negative: none
		c.Linger = DefaultLinger
	}
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = DefaultReconnectMin
	}
	if c.ReconnectMax <= 0 {
		c.ReconnectMax = max(DefaultReconnectMax, c.ReconnectMin)
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	return c
}

// Endpoint is the bound PUB address (a tcp port 0 resolved), or the one a
// connecting PUB connects to.
func (p *Publisher) Endpoint() string { return boundAddr(p.pub, p.cfg.Endpoint) }

// Connecting reports whether the PUB connects to its endpoint (rather than
// binding it).
func (p *Publisher) Connecting() bool { return p.link != nil }

// dialer owns a connecting PUB's connection: one at a time, made again
// after a backoff whenever it ends, until Close.
func (p *Publisher) dialer() {
	defer p.wg.Done()
	addr, wait, failures := linkAddr(p.cfg.Endpoint), p.cfg.ReconnectMin, 0
	for {
		p.link.reset()
		if err := p.pub.Dial(addr); err != nil {
			p.link.abandon()
			if failures++; failures == 1 {
				p.cfg.Log.Warn().Err(err).Str("endpoint", p.cfg.Endpoint).
					Msg("events publisher: cannot connect; trying again until it can")
			}
		} else {
			p.link.established()
			p.Connects.Add(1)
			p.cfg.Log.Info().Str("endpoint", p.cfg.Endpoint).Int("failed_dials", failures).Msg("events publisher connected")
			wait, failures = p.cfg.ReconnectMin, 0
			select {
			case <-p.link.ended:
				p.cfg.Log.Warn().Str("endpoint", p.cfg.Endpoint).Msg("events publisher: connection lost; connecting again")
			case <-p.stop:
				return
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-p.stop:
			t.Stop()
			return
		}
		wait = min(2*wait, p.cfg.ReconnectMax)
	}
}

// ReplayEndpoint is the bound ROUTER address, "" without one.
func (p *Publisher) ReplayEndpoint() string {
	if p.router == nil {
		return ""
	}
	return boundAddr(p.router, p.cfg.Replay)
}

func boundAddr(s zmq4.Socket, ep string) string {
	if !strings.HasPrefix(ep, "tcp://") || s.Addr() == nil {
		return ep
	}
	return "tcp://" + s.Addr().String()
}

// Publish queues a batch for sending; it never blocks.
func (p *Publisher) Publish(e Entry) {
	if p.closed.Load() {
		p.Dropped.Add(1)
		return
	}
	select {
	case p.out <- e:
	default:
		if p.Dropped.Add(1) == 1 {
			p.cfg.Log.Error().Uint64("seq", e.Seq).Msg("events publisher: queue full, batch dropped (counting the rest silently)")
		}
	}
}

// loop owns the PUB socket and the replay buffer.
func (p *Publisher) loop() {
	defer close(p.loopDone)
	var last time.Time
	for {
		select {
		case e := <-p.out:
			p.Wakeups.Add(1)
			p.send(e)
			last = time.Now()
		case a := <-p.asks:
			p.Wakeups.Add(1)
			// A batch handed to Publish before the request must be in the
			// answer: drain the queue first (select picks cases at random).
			last = p.sendQueued(last)
			a.reply <- p.buf.from(a.from)
		case <-p.stop:
			p.Wakeups.Add(1)
			p.drain(last)
			return
		}
	}
}

func (p *Publisher) send(e Entry) {
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], e.Seq)
	if err := p.pub.Send(zmq4.NewMsgFrom([]byte(p.topic(e)), seq[:], e.Payload)); err != nil {
		p.cfg.Log.Error().Err(err).Uint64("seq", e.Seq).Msg("events publisher: send failed")
	} else {
		p.Published.Add(1)
	}
	p.buf.add(e)
}

// topic is e's topic: its own, else the configured one.
func (p *Publisher) topic(e Entry) string {
	if e.Topic != "" {
		return e.Topic
	}
	return p.cfg.Topic
}

// drain sends what is queued, then lingers after the last send, within
// stopCtx.
func (p *Publisher) drain(last time.Time) {
	last = p.sendQueued(last)
	if last.IsZero() || p.cfg.Linger < 0 {
		return
	}
	wait := time.Until(last.Add(p.cfg.Linger))
	if wait <= 0 {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-p.stopCtx.Done():
	}
}

// sendQueued sends every batch already queued; it returns the time of the
// last send (last when there was none).
func (p *Publisher) sendQueued(last time.Time) time.Time {
	for {
		select {
		case e := <-p.out:
			p.send(e)
			last = time.Now()
		default:
			return last
		}
	}
}

// replayReader owns the ROUTER socket: one request at a time.
func (p *Publisher) replayReader() {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if !p.closed.Load() {
				p.cfg.Log.Error().Err(err).Msg("events replay: receive failed; replay stopped")
			}
			return
		}
		id, from, ok := parseReplay(msg.Frames)
		if !ok {
			p.BadRequests.Add(1)
			continue
		}
		reply := make(chan []Entry, 1)
		select {
		case p.asks <- replayAsk{from: from, reply: reply}:
		case <-p.loopDone:
			return
		}
		p.Replays.Add(1)
		entries := <-reply
		var seq [8]byte
		// NB: as vLLM's publisher replies (since 0.32): [topic, seq,
		// payload] after the envelope, and a terminator with an empty topic
		// and payload.
		for _, e := range entries {
			binary.BigEndian.PutUint64(seq[:], e.Seq)
			if err := p.router.Send(zmq4.NewMsgFrom(id, nil, []byte(p.topic(e)), seq[:], e.Payload)); err != nil {
				break
			}
			p.ReplayFrames.Add(1)
		}
		binary.BigEndian.PutUint64(seq[:], EndSeq)
		_ = p.router.Send(zmq4.NewMsgFrom(id, nil, nil, seq[:], nil))
	}
}

// parseReplay checks a request [identity, "", start_seq (8 bytes BE)].
func parseReplay(frames [][]byte) (id []byte, from uint64, ok bool) {
	if len(frames) != 3 || len(frames[1]) != 0 || len(frames[2]) != 8 {
		return nil, 0, false
	}
	return frames[0], binary.BigEndian.Uint64(frames[2]), true
}

// Close flushes and closes the sockets and ends the goroutines, within
// ctx. Calls after the first return the first's result.
func (p *Publisher) Close(ctx context.Context) error {
	p.once.Do(func() {
		p.stopCtx = ctx
		p.closed.Store(true)
		close(p.stop)
		var errs []error
		select {
		case <-p.loopDone:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("events: flush: %w", ctx.Err()))
		}
		// NB: zmq4 v0.17.0 never ends a PUB socket's writer goroutine
		// ((*pubMWriter).run): its Close is not called by the socket's.
		// Closing the socket also ends a dial in flight (its context).
		if err := p.pub.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("events: close pub: %w", err))
		}
		if p.router != nil {
			// A peer that went away left its connection closed already.
			if err := p.router.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, fmt.Errorf("events: close replay: %w", err))
			}
		}
		done := make(chan struct{})
		go func() { p.wg.Wait(); <-p.loopDone; close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("events: stop goroutines: %w", ctx.Err()))
		}
		p.closeErr = errors.Join(errs...)
		p.cfg.Log.Info().Uint64("published", p.Published.Load()).Uint64("dropped", p.Dropped.Load()).
			Uint64("replays", p.Replays.Load()).Msg("events publisher closed")
	})
	return p.closeErr
}

// ring is the replay buffer: the newest batches in sequence order, bounded
// by count and bytes. Owned by the loop goroutine.
type ring struct {
	entries  []Entry
	start    int // entries[start:] are live
	bytes    int
	maxN     int
	maxBytes int
}

func (r *ring) add(e Entry) {
	r.entries = append(r.entries, e)
	r.bytes += len(e.Payload)
	for len(r.entries)-r.start > 1 && (len(r.entries)-r.start > r.maxN || r.bytes > r.maxBytes) {
		r.bytes -= len(r.entries[r.start].Payload)
		r.entries[r.start] = Entry{}
		r.start++
	}
	if r.start > 1024 && r.start > len(r.entries)/2 {
		n := copy(r.entries, r.entries[r.start:])
		clear(r.entries[n:])
		r.entries, r.start = r.entries[:n], 0
	}
}

// from copies the live entries with Seq ≥ seq (payloads shared).
func (r *ring) from(seq uint64) []Entry {
	live := r.entries[r.start:]
	lo, hi := 0, len(live)
	for lo < hi {
		mid := (lo + hi) / 2
		if live[mid].Seq < seq {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return append([]Entry(nil), live[lo:]...)
}

package endpoint

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/internal/defaults"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
	"github.com/kvtier/kvtier/supervision"
)

// Endpoint serves the manager API to out-of-process engines on a ZeroMQ
// ROUTER socket (standalone mode, docs/DESIGN.md §3.2; docs/PROTOCOL.md).
//
// Three parts, one owner each:
//   - the reader goroutine owns Recv: it decodes each frame (off any
//     mailbox) and sends the endpoint actor one message per frame;
//   - the endpoint actor (endpointActor) owns the sessions: it forwards
//     calls to the bridge, releases a session whose connection ended, and
//     arms a liveness timer for a session while it holds requests;
//   - the writer goroutine owns Send: replies reach it through a bounded
//     queue; when the queue is full a reply is dropped and counted (the
//     client's deadline covers it), so a blocking ROUTER send never stalls
//     the actor or a bridge reply.
//
// A call's answer comes back to the actor as a message (the bridge answers
// through a messages.ReplyFunc); its deadline is kept in the endpoint's
// calls in flight (calls.go), one timer for the earliest: a call costs no
// goroutine and no timer, and the actor never waits.
type Endpoint struct {
	cfg     Config
	ln      *listener
	table   *sessionTable
	calls   *flights
	out     chan outbound
	done    chan struct{}
	track   tracker
	system  *actor.ActorSystem
	pid     *actor.PID
	events  *actor.PID // the KV-event hub, told the engines' topics; nil = none
	metrics *endpointMetrics
	closed  atomic.Bool

	// Connection ends heard before Start (no actor yet), for Start to send.
	earlyMu sync.Mutex
	started bool
	early   []string
}

// Config is what the endpoint needs from the node.
type Config struct {
	Listen      ListenOptions
	Bridge      *actor.PID        // the bridge, where calls go
	Clock       supervision.Clock // session liveness timers and call deadlines
	NodeClock   supervision.Clock // drain deadlines (the bridge's clock)
	Grace       time.Duration     // a session silent this long is released
	CallTimeout time.Duration     // a call with no timeout_ms
	MaxInFlight int               // calls of one session in flight at once
	MaxOpen     int               // unfinished request ids one session may hold
	Hello       wire.Hello        // geometry and limits told to every session
	// Geometry, when set, gives the pool's region of the slots for blocks
	// of the size an engine's hello declares (the region of that exact
	// size, else of that size rounded up to SlotAlign, made on first use):
	// a session maps its file and is answered slot numbers of it. Unset,
	// every session is told Hello's.
	Geometry func(blockBytes int) (Geometry, error)
	// Geometries, when set, is how many block sizes the pool serves now.
	Geometries func() int
	// Quarantine keeps an ended session's slot credit and the slots of its
	// jobs in flight out of use this long (a worker may still be copying
	// through them); default Grace.
	Quarantine time.Duration
	Log        zerolog.Logger
}

// Defaults for an endpoint.
const (
	// DefaultMaxInFlight: a connector sends a step's ~100 calls in one
	// batch, most of them noreply or quiet; a daemon a few dozen steps
	// behind must not refuse them (a refused quiet pin is a load without
	// its pin). Each costs an entry in the calls in flight while served.
	DefaultMaxInFlight = 8192
	DefaultMaxOpen     = 1 << 16
	outQueue           = 4096
	// badFrameLimit: a session that sends this many malformed frames in a
	// row is released, as if it had gone away.
	badFrameLimit = 64
)

// New binds the socket; Start begins serving once the actor from
// Props is spawned. A bind error is returned here, before any actor runs.
func New(cfg Config) (*Endpoint, error) {
	defaults.FillNonPositive(&cfg, Config{
		MaxInFlight: DefaultMaxInFlight,
		MaxOpen:     DefaultMaxOpen,
		Clock:       supervision.RealClock{},
		NodeClock:   supervision.RealClock{},
	})
	cfg.Hello.Protocol = wire.Version
	cfg.Hello.Grace = cfg.Grace
	cfg.Hello.Heartbeat = max(cfg.Grace/3, time.Millisecond)
	cfg.Hello.MaxKeys, cfg.Hello.MaxFrameBytes = wire.MaxKeys, wire.MaxFrameBytes
	cfg.Hello.PackedKeys = true
	cfg.Hello.Credit = true
	cfg.Hello.Batch = true
	if cfg.Quarantine <= 0 {
		cfg.Quarantine = cfg.Grace
	}
	e := &Endpoint{cfg: cfg, table: newSessionTable(), calls: newFlights(), out: make(chan outbound, outQueue),
		done: make(chan struct{}), metrics: newEndpointMetrics()}
	ln, err := listen(cfg.Listen, cfg.Log, e.connLost)
	if err != nil {
		return nil, err
	}
	e.ln = ln
	return e, nil
}

// connLost hears that an engine connection ended (internal/zmqx/listen.go) and
// tells the actor, which releases that engine's session at once.
func (e *Endpoint) connLost(peer string) {
	e.earlyMu.Lock()
	if !e.started {
		e.early = append(e.early, peer)
		e.earlyMu.Unlock()
		return
	}
	e.earlyMu.Unlock()
	select {
	case <-e.done:
		// Closing: the node drains everything itself.
	default:
		e.system.Root.Send(e.pid, &connLost{peer: peer})
	}
}

// Addr is the bound address (a tcp port of 0 resolved).
func (e *Endpoint) Addr() string { return e.ln.addr }

// Collectors are the endpoint's Prometheus metrics.
func (e *Endpoint) Collectors() []prometheus.Collector { return e.metrics.collectors() }

// Props builds the endpoint actor. Its session table outlives restarts.
func (e *Endpoint) Props() *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &endpointActor{ep: e, t: e.table} },
		actor.WithReceiverMiddleware(supervision.Faults))
}

// AnnounceTo has the endpoint tell the KV-event hub each engine's events
// topic and key namespace (*messages.EngineTopic), so that the hub announces
// the blocks an engine can load under the engine's own topic. Call it
// before Start.
func (e *Endpoint) AnnounceTo(events *actor.PID) { e.events = events }

// Start begins reading and writing the socket; pid is the spawned endpoint
// actor, bridge where it sends calls.
func (e *Endpoint) Start(system *actor.ActorSystem, pid, bridge *actor.PID) {
	e.system, e.pid, e.cfg.Bridge = system, pid, bridge
	e.earlyMu.Lock()
	e.started = true
	for _, peer := range e.early {
		system.Root.Send(pid, &connLost{peer: peer})
	}
	e.early = nil
	e.earlyMu.Unlock()
	e.track.goTracked(e.readLoop)
	e.track.goTracked(e.writeLoop)
	e.cfg.Log.Info().Str("engine_listen", e.ln.addr).Dur("grace", e.cfg.Grace).Msg("engine endpoint serving")
}

// Close stops serving: the socket closes (in-flight replies are dropped,
// clients time out on their deadlines), every goroutine the endpoint started
// ends before it returns. Sessions are not released here: the node is
// closing and drains everything itself.
func (e *Endpoint) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(e.done)
	err := e.ln.close()
	e.track.closeAndWait()
	return err
}

// readLoop serves the socket's frames until it closes.
func (e *Endpoint) readLoop() {
	err := e.ln.sock.serve(e.deliver)
	select {
	case <-e.done:
	default:
		e.cfg.Log.Error().Err(err).Msg("engine endpoint: receive failed; endpoint stops reading")
	}
}

// deliver decodes one frame (on the goroutine that read it, never in a
// mailbox) and hands it to the actor.
func (e *Endpoint) deliver(in inFrame) {
	if in.parts != 1 {
		e.metrics.badFrames.WithLabelValues(string(wire.CodeBadRequest)).Inc()
		e.reply(in.peer, wire.EncodeError(0, fmt.Errorf("%w: a request is exactly one frame, got %d", messages.ErrBadRequest, in.parts)))
		return
	}
	q, err := wire.DecodeRequest(in.body)
	if err == nil && q.Op == wire.OpBatch {
		// Each call as if it had come in a frame of its own, in order.
		for _, c := range q.Calls {
			e.system.Root.Send(e.pid, &inbound{peer: in.peer, req: c.Req, err: c.Err})
		}
		return
	}
	e.system.Root.Send(e.pid, &inbound{peer: in.peer, req: q, err: err})
}

// writeLoop sends queued replies until Close. Replies queued meanwhile go
// out with the one it took, a connection's in one write (in the order
// queued): an engine that sent a step's calls in one write reads their
// replies in a few reads, not one each.
func (e *Endpoint) writeLoop() {
	var batch outBatch
	for {
		select {
		case <-e.done:
			return
		case o := <-e.out:
			batch.add(o)
		more:
			for batch.n < maxRepliesPerWrite {
				select {
				case o := <-e.out:
					batch.add(o)
				default:
					break more
				}
			}
			for _, peer := range batch.order {
				if err := e.ln.sock.send(peer, batch.byPeer[peer]...); err != nil {
					e.metrics.repliesDropped.Add(float64(len(batch.byPeer[peer])))
					e.cfg.Log.Debug().Err(err).Msg("engine endpoint: reply not sent")
				}
			}
			batch.reset()
		}
	}
}

// maxRepliesPerWrite bounds a coalesced write: one engine's burst does not
// hold back another's replies for long.
const maxRepliesPerWrite = 256

// outBatch is the replies a writeLoop round sends, by connection.
type outBatch struct {
	order  []string            // connections in the order first seen
	byPeer map[string][][]byte // each connection's frames, in order
	n      int
}

func (b *outBatch) add(o outbound) {
	if b.byPeer == nil {
		b.byPeer = map[string][][]byte{}
	}
	p := string(o.peer)
	if _, ok := b.byPeer[p]; !ok {
		b.order = append(b.order, p)
	}
	b.byPeer[p] = append(b.byPeer[p], o.body)
	b.n++
}

func (b *outBatch) reset() {
	clear(b.byPeer)
	b.order, b.n = b.order[:0], 0
}

// reply queues a frame for peer without blocking; a full queue drops it.
func (e *Endpoint) reply(peer string, body []byte) {
	select {
	case e.out <- outbound{peer: []byte(peer), body: body}:
	default:
		e.metrics.repliesDropped.Inc()
	}
}

// Messages of the endpoint actor.
type (
	// inbound is one decoded frame (or its decode error) from peer.
	inbound struct {
		peer string
		req  *wire.Request
		err  error
	}
	// answered: the bridge answered call id; encode makes its reply frame
	// (send false: the call wants none).
	answered struct {
		id     uint64
		encode func() (body []byte, send bool)
	}
	// deadlinesDue: the calls' deadline timer of generation gen fired.
	deadlinesDue struct{ gen uint64 }
	// sessionTimer: session's liveness timer fired.
	sessionTimer struct{ session, gen uint64 }
	// connLost: the connection of the engine whose routing id is peer ended.
	connLost struct{ peer string }
	// released: the bridge released session's holds.
	released struct {
		session uint64
		res     messages.SessionReleased
		err     error
	}
)

// endpointMetrics are the endpoint's Prometheus metrics.
type endpointMetrics struct {
	sessions       prometheus.Gauge
	released       *prometheus.CounterVec
	badFrames      *prometheus.CounterVec
	repliesDropped prometheus.Counter
}

func newEndpointMetrics() *endpointMetrics {
	return &endpointMetrics{
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvtier", Name: "engine_sessions",
			Help: "Live engine sessions on the engine endpoint."}),
		released: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvtier", Name: "engine_sessions_released_total",
			Help: "Engine sessions ended, by reason: lost (its connection ended, or silent past the grace period while holding requests), bye, hello (replaced by a new Hello), bad_frames."}, []string{"reason"}),
		badFrames: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvtier", Name: "engine_bad_frames_total",
			Help: "Engine frames refused, by error code."}, []string{"code"}),
		repliesDropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvtier", Name: "engine_replies_dropped_total",
			Help: "Replies not sent: the send queue was full or the peer was gone."}),
	}
}

func (m *endpointMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.sessions, m.released, m.badFrames, m.repliesDropped}
}

// sessionPrefix is the request-id prefix of session id: it isolates the
// request ids of different engines (two engines may both say "req-1") and
// names everything a session holds at the bridge. No wire request id can
// produce another session's prefix: every wire id gets its own prefixed.
func sessionPrefix(id uint64) string { return "\x1es" + strconv.FormatUint(id, 10) + "\x1f" }

// stripSession removes a session prefix from a request id, if it has one.
func stripSession(id string) string {
	if !strings.HasPrefix(id, "\x1es") {
		return id
	}
	if i := strings.IndexByte(id, '\x1f'); i > 0 {
		return id[i+1:]
	}
	return id
}

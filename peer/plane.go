package peer

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/go-zeromq/zmq4"

	"github.com/kvtier/kvtier/internal/zmqx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer/peermsg"
	"github.com/kvtier/kvtier/peer/wire"
	"github.com/kvtier/kvtier/supervision"
)

// Listener is the bound ROUTER socket of the control plane, opened before
// the actors start so that a bad address fails Open, and handed to Plane.
type Listener struct {
	io   *sockIO
	addr string
	// gone, once the plane runs, hears of every peer connection that ended.
	gone atomic.Pointer[func(identity string)]
}

// Listen binds the control plane's ROUTER at cfg.Listen.
func Listen(cfg Config, ctr *Counters) (*Listener, error) {
	if !strings.HasPrefix(cfg.Listen, "tcp://") {
		return nil, fmt.Errorf("%w: peer listen %q: want tcp://host:port", messages.ErrBadConfig, cfg.Listen)
	}
	ln := &Listener{}
	// A consumer that dies takes its connection with it: the watch tells its
	// session, which releases what the consumer's rounds held at once.
	watch := zmqx.WithConnWatch(context.Background(), func(identity string) {
		if f := ln.gone.Load(); f != nil {
			(*f)(identity)
		}
	})
	sock := zmq4.NewRouter(watch, zmq4.WithID(zmq4.SocketIdentity(cfg.Node)),
		zmq4.WithLogger(zlogger(cfg.Log)), zmq4.WithTimeout(sendTimeout))
	// NB: through a transport that bounds each connection's ZMTP handshake,
	// so one peer that connects and never greets cannot block the others.
	if err := sock.Listen(zmqx.BoundedListenAddr(cfg.Listen)); err != nil {
		sock.Close()
		return nil, fmt.Errorf("peer listen %s: %w", cfg.Listen, err)
	}
	addr := "tcp://" + sock.Addr().String()
	if a, ok := sock.Addr().(*net.TCPAddr); ok && a.IP.IsUnspecified() {
		addr = fmt.Sprintf("tcp://127.0.0.1:%d", a.Port)
	}
	ln.io, ln.addr = newSockIO(sock, cfg.WithDefaults().SendQueue, ctr.drop), addr
	return ln, nil
}

// Addr is the bound address (a port of 0 resolved).
func (l *Listener) Addr() string { return l.addr }

// Close closes the socket; the plane does it when it stops. Idempotent.
func (l *Listener) Close() { l.io.close() }

// routerIn is a frame that arrived on the ROUTER, decoded off the mailbox.
type routerIn struct {
	from  string     // the sender's identity (its node id, to be proven)
	frame wire.Frame // nil when err is set and nothing decoded
	err   error
	raw   []byte // the frame as received, for its seal
	seal  []byte // the message's seal part; nil when it came unsealed
}

// Plane is the control-plane actor.
//
// Invariants:
//   - it alone owns the ROUTER socket's lifetime; sends go through the
//     socket's writer queue (sessions enqueue directly: never blocking);
//   - at most one session actor per remote node id, a child of the plane,
//     so its supervisor restarts it and stops it with the plane;
//   - a frame from an identity with no session starts one only when it is
//     a Hello from an allowed node, within MaxSessions;
//   - a discovered member (members) has a session that dials it, or is in
//     unspawned until its old session's name is free; a static peer is
//     never a member: the configured address wins.
type Plane struct {
	cfg      Config
	ctr      *Counters
	ln       *Listener
	sessions map[string]*actor.PID
	// direct mirrors sessions for the ROUTER's reader goroutine, which hands
	// a known peer's frames straight to its session (one mailbox hop less
	// on every peer lookup); frames of unknown identities come here.
	direct  *sync.Map
	static  map[string]string // configured peers: node → address
	members map[string]string // discovered peers we dial: node → address
	// unspawned are members whose session could not be spawned yet: the
	// session they had is still stopping under the same name.
	unspawned map[string]bool
	shutdown  *shutdown // non-nil once peermsg.Shutdown came
}

// MemberUp tells the plane that discovery found a live member whose
// control plane is at Addr. The plane dials it as it dials a static peer,
// and the handshake still proves who it is (secret, allow-list): etcd says
// where, the handshake says who. Ignored for this node, for a static peer
// (the configured address wins), for a node the allow-list leaves out, and
// once shutdown began. A member dialed at another address (it restarted
// elsewhere) is dialed at the new one.
type MemberUp struct {
	Node string
	Addr string
	// Events and EventsReplay are where it publishes its KV events ("" =
	// not registered), handed to the P2P tier as EventsAt.
	Events, EventsReplay string
}

// MemberDown tells the plane that a member left: its key was deleted, or
// its lease expired, while etcd answered — never because etcd went away.
// Its session stops dialing it at once (outbound rounds fail, the P2P tier
// hears Down); what the member's own rounds hold here is released when its
// connection to us ends (a dead node's at once, else at its Bye), and the
// session stops once nothing is left. Static peers are unaffected.
type MemberDown struct{ Node string }

// shutdown is a peermsg.Shutdown in progress.
type shutdown struct {
	req     *peermsg.Shutdown
	waiting map[string]bool
	res     peermsg.ShutdownResult
	timer   supervision.Timer
}

// Plane-internal messages.
type (
	// drain asks a session to finish its rounds by deadline, then say Bye.
	drain struct{ deadline time.Time }
	// drained is a session's answer to drain.
	drained struct {
		node    string
		aborted int
	}
	shutdownDeadline struct{}
	// connGone: a peer's connection to our ROUTER ended.
	connGone struct{ node string }
	// inboundGone tells a session its peer's connection to us ended.
	inboundGone struct{}
)

// Props returns the plane's props; it takes ownership of ln.
func Props(cfg Config, ln *Listener, ctr *Counters) *actor.Props {
	cfg = cfg.WithDefaults()
	return actor.PropsFromProducer(func() actor.Actor {
		return &Plane{cfg: cfg, ctr: ctr, ln: ln, sessions: map[string]*actor.PID{}, static: map[string]string{},
			members: map[string]string{}, unspawned: map[string]bool{}, direct: &sync.Map{}}
	}, actor.WithReceiverMiddleware(supervision.Faults), actor.WithSupervisor(sessionSupervisor{}))
}

// Receive handles the plane's messages.
func (p *Plane) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		p.start(ctx)
	case *routerIn:
		p.route(ctx, m)
	case *peermsg.GetStats:
		m.Reply.Answer(p.ctr.Peers(), nil)
	case *peermsg.Shutdown:
		p.beginShutdown(ctx, m)
	case *drained:
		p.onDrained(m)
	case *connGone:
		if pid := p.sessions[m.node]; pid != nil {
			ctx.Send(pid, &inboundGone{})
		}
	case *sessionIdle:
		if p.sessions[m.node].Equal(m.pid) && p.shutdown == nil {
			delete(p.sessions, m.node)
			p.direct.Delete(m.node)
			ctx.Stop(m.pid)
			if _, member := p.members[m.node]; member {
				p.unspawned[m.node] = true // it came back meanwhile: a new session once this one stopped
			}
		}
	case *MemberUp:
		p.memberUp(ctx, m)
	case *MemberDown:
		p.memberDown(ctx, m)
	case *sessionRestarted:
		p.redial(ctx, m.pid)
	case *actor.Terminated:
		p.spawnUnspawned(ctx)
	case *shutdownDeadline:
		if p.shutdown != nil {
			p.finishShutdown()
		}
	case *actor.Stopped:
		if p.cfg.Members != nil {
			p.cfg.Members.Subscribe(nil)
		}
		p.ln.Close()
	case *actor.Stopping, *actor.Restarting, *actor.Restart:
	default:
		p.cfg.Log.Warn().Str("type", fmt.Sprintf("%T", m)).Msg("peer: control plane dropped an unknown message")
	}
}

// start runs the socket goroutines and a session per configured peer.
func (p *Plane) start(ctx actor.Context) {
	self, root := ctx.Self(), ctx.ActorSystem().Root
	gone := func(identity string) { root.Send(self, &connGone{node: identity}) }
	p.ln.gone.Store(&gone)
	p.ln.io.startWriter()
	direct := p.direct
	p.ln.io.startReader(func(m zmq4.Msg) {
		in := decodeRouter(m)
		if pid, ok := direct.Load(in.from); ok {
			root.Send(pid.(*actor.PID), in.forSession())
			return
		}
		root.Send(self, in)
	}, nil)
	for _, a := range p.cfg.Peers {
		p.static[a.Node] = a.Addr
		p.eventsAt(ctx, a.Node, a.Events, a.EventsReplay)
		if pid := p.spawn(ctx, a.Node, a.Addr); pid != nil {
			p.publish(a.Node, pid) // nothing of it was queued here yet
		}
	}
	if p.cfg.Members != nil {
		// NB: discovery replays every member it knows: a restarted plane
		// (which lost its sessions) dials them all again.
		p.cfg.Members.Subscribe(func(m any) { root.Send(self, m) })
	}
}

// decodeRouter turns a ROUTER message into a routerIn (on the reader
// goroutine: decoding never runs in a mailbox).
func decodeRouter(m zmq4.Msg) *routerIn {
	if len(m.Frames) != 2 && len(m.Frames) != 3 {
		var from string
		if len(m.Frames) > 0 {
			from = string(m.Frames[0])
		}
		return &routerIn{from: from, err: fmt.Errorf("%w: %d message parts, want 1 or 2", wire.ErrMalformed, len(m.Frames)-1)}
	}
	f, err := wire.Decode(m.Frames[1])
	return &routerIn{from: string(m.Frames[0]), frame: f, err: err, raw: m.Frames[1], seal: sealPart(m.Frames[1:])}
}

func (in *routerIn) forSession() *inboundFrame {
	return &inboundFrame{frame: in.frame, err: in.err, raw: in.raw, seal: in.seal}
}

func (p *Plane) route(ctx actor.Context, m *routerIn) {
	pid := p.sessions[m.from]
	if pid == nil && p.shutdown != nil {
		if h, ok := m.frame.(*wire.Hello); ok {
			p.ctr.refuse(wire.RefuseShutdown)
			p.refuse(m.from, h.Epoch, wire.RefuseShutdown)
		}
		return
	}
	if pid == nil {
		if _, hello := m.frame.(*wire.Hello); !hello || !validNode(m.from) {
			p.ctr.drop("no_session")
			return
		}
		if !p.cfg.allowed(m.from) {
			// Refused by the session would cost an actor per stranger: answer here.
			p.ctr.refuse(wire.RefuseNotAllow)
			p.refuse(m.from, m.frame.(*wire.Hello).Epoch, wire.RefuseNotAllow)
			return
		}
		if len(p.sessions) >= p.cfg.MaxSessions {
			p.ctr.refuse(wire.RefuseBusy)
			p.refuse(m.from, m.frame.(*wire.Hello).Epoch, wire.RefuseBusy)
			return
		}
		if pid = p.spawn(ctx, m.from, ""); pid == nil {
			return
		}
	}
	ctx.Send(pid, m.forSession())
	p.publish(m.from, pid)
}

func (p *Plane) refuse(to string, epoch uint64, reason string) {
	b, err := wire.Encode(&wire.Refuse{Epoch: epoch, Reason: reason})
	if err == nil {
		p.ln.io.send(zmq4.NewMsgFrom([]byte(to), b))
	}
}

func (p *Plane) spawn(ctx actor.Context, node, addr string) *actor.PID {
	io := p.ln.io
	sendIn := func(b, seal []byte) bool {
		return io.send(zmq4.NewMsgFrom(append([][]byte{[]byte(node)}, message(b, seal)...)...))
	}
	pid, err := ctx.SpawnNamed(sessionProps(&p.cfg, p.ctr, node, addr, sendIn), "peer-"+node)
	if err != nil {
		// Only a name clash with a stopping session; the peer retries its Hello.
		p.cfg.Log.Warn().Err(err).Str("peer", node).Msg("peer: session not spawned")
		return nil
	}
	p.sessions[node] = pid
	return pid
}

// publish lets the reader goroutine deliver node's frames straight to its
// session — after the frame that created it was forwarded, so no later
// frame can overtake it.
func (p *Plane) publish(node string, pid *actor.PID) { p.direct.Store(node, pid) }

// validNode reports whether an identity can be a node id at all.
func validNode(id string) bool {
	return id != "" && len(id) <= wire.MaxNodeIDBytes
}

// beginShutdown drains every session; new sessions are refused from now on.
func (p *Plane) beginShutdown(ctx actor.Context, m *peermsg.Shutdown) {
	if p.shutdown != nil {
		m.Reply.Answer(peermsg.ShutdownResult{}, fmt.Errorf("%w: peer shutdown already in progress", messages.ErrClosed))
		return
	}
	sd := &shutdown{req: m, waiting: map[string]bool{}}
	p.shutdown = sd
	for node, pid := range p.sessions {
		sd.waiting[node] = true
		ctx.Request(pid, &drain{deadline: m.Deadline})
	}
	if len(sd.waiting) == 0 {
		p.finishShutdown()
		return
	}
	// The plane's own guard: sessions answer at their deadline, this catches
	// one that cannot (stopped).
	self, root := ctx.Self(), ctx.ActorSystem().Root
	sd.timer = p.cfg.Clock.AfterFunc(m.Deadline.Sub(p.cfg.Clock.Now())+100*time.Millisecond, func() { root.Send(self, &shutdownDeadline{}) })
}

func (p *Plane) onDrained(m *drained) {
	sd := p.shutdown
	if sd == nil || !sd.waiting[m.node] {
		return
	}
	delete(sd.waiting, m.node)
	sd.res.Sessions++
	sd.res.Aborted += m.aborted
	if len(sd.waiting) == 0 {
		p.finishShutdown()
	}
}

func (p *Plane) finishShutdown() {
	sd := p.shutdown
	if sd.timer != nil {
		sd.timer.Stop()
	}
	sd.res.Aborted += len(sd.waiting) // sessions that never answered
	sd.req.Reply.Answer(sd.res, nil)
	sd.waiting = map[string]bool{}
}

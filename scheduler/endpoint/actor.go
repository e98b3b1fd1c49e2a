package endpoint

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// endpointActor owns the engine sessions: who is connected, what each has
// open at the bridge, when each was last heard from. It forwards decoded
// calls to the bridge and arms a liveness timer per session holding requests.
//
// Invariants:
//   - the session table is touched only inside Receive; it outlives a
//     restart of this actor (like the CPU tier's State), so a restart loses
//     no session and leaks nothing.
//   - a session's request ids reach the bridge prefixed with its own
//     sessionPrefix, so sessions never share leases or jobs.
//   - a session is released exactly once (lost, bye, hello again, bad
//     frames), and only after its in-flight calls ended: a PrepareStore
//     answered after the release would otherwise open a job nobody reaps.
//   - a session whose connection ends is released at once: the socket's
//     transport reports it (internal/zmqx/listen.go), no timer involved.
//   - liveness costs O(1) per frame (lastSeen := now) and, only while the
//     session holds requests (open), at most one timer wakeup per grace
//     period: when the timer fires early (traffic since it was armed) it is
//     re-armed for the remainder. A session holding nothing has no timer (a
//     hung engine then holds nothing to release; what its finished
//     requests' jobs hold is reaped at their own deadlines). No sweep, no
//     polling: an idle engine costs no wakeup.
//   - Receive never blocks: replies go to the writer's queue, bridge
//     answers are awaited by per-call goroutines.
type endpointActor struct {
	ep *Endpoint
	t  *sessionTable
}

// sessionTable is the endpoint's state, owned by the endpoint actor.
type sessionTable struct {
	byPeer map[string]*session
	byID   map[uint64]*session
	nextID uint64
	// gone: routing ids whose connection ended with no session yet, so a
	// Hello still in flight from them opens none. Bounded, oldest first out.
	gone      map[string]struct{}
	goneOrder []string
}

// maxGone bounds the routing ids remembered as gone.
const maxGone = 1024

func newSessionTable() *sessionTable {
	return &sessionTable{byPeer: map[string]*session{}, byID: map[uint64]*session{}, gone: map[string]struct{}{}}
}

func (t *sessionTable) markGone(peer string) {
	if _, ok := t.gone[peer]; ok {
		return
	}
	if len(t.goneOrder) >= maxGone {
		delete(t.gone, t.goneOrder[0])
		t.goneOrder = t.goneOrder[1:]
	}
	t.gone[peer] = struct{}{}
	t.goneOrder = append(t.goneOrder, peer)
}

// session is one engine connection's state.
type session struct {
	id        uint64
	peer      string
	prefix    string
	client    string
	lastSeen  time.Time
	timer     interface{ Stop() bool } // armed only while open is not empty
	timerGen  uint64                   // the armed timer's generation
	open      map[string]struct{}      // prefixed request ids without RequestFinished yet
	inflight  int                      // calls forwarded and not yet answered
	badFrames int                      // malformed frames in a row
	// ending is set once the session is released; the release is sent when
	// inflight reaches 0. reason says why, then runs after the bridge's answer.
	ending bool
	reason string
	then   func(messages.SessionReleased, error)
}

// Receive handles one message.
func (a *endpointActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *inbound:
		a.inbound(ctx, m)
	case *callDone:
		if s := a.t.byID[m.session]; s != nil {
			s.inflight--
			a.maybeRelease(ctx, s)
		}
	case *sessionTimer:
		a.timerFired(ctx, m)
	case *connLost:
		a.connLost(ctx, m.peer)
	case *released:
		a.released(m)
	case *actor.Started, *actor.Stopping, *actor.Stopped, *actor.Restarting, *actor.Restart:
	default:
		a.ep.cfg.Log.Warn().Str("type", fmt.Sprintf("%T", m)).Msg("engine endpoint: unknown message dropped")
	}
}

func (a *endpointActor) inbound(ctx actor.Context, m *inbound) {
	s := a.t.byPeer[m.peer]
	if s != nil && !s.ending {
		s.lastSeen = a.ep.cfg.Clock.Now()
	}
	if m.err != nil {
		a.badFrame(ctx, m.peer, s, m.err)
		return
	}
	q := m.req
	if q.Op == wire.OpHello {
		if _, gone := a.t.gone[m.peer]; gone {
			// Its connection ended before the Hello was read: no one to
			// serve. (A later connection under the same routing id is heard.)
			delete(a.t.gone, m.peer)
			return
		}
		a.hello(ctx, m.peer, s, q)
		return
	}
	if s == nil || s.ending {
		a.refuse(m.peer, q.ID, wire.CodeNoSession, fmt.Errorf("%w: say hello first (or again: a silent session is released after %v)", messages.ErrNoSession, a.ep.cfg.Grace))
		return
	}
	s.badFrames = 0
	switch q.Op {
	case wire.OpPing:
		a.ep.reply(m.peer, wire.EncodeReply(q.Op, &wire.Reply{ID: q.ID}, nil))
		return
	case wire.OpBye:
		peer, id := m.peer, q.ID
		a.end(ctx, s, "bye", func(res messages.SessionReleased, err error) {
			if err != nil {
				a.ep.reply(peer, wire.EncodeError(id, err))
				return
			}
			a.ep.reply(peer, wire.EncodeReply(wire.OpBye, &wire.Reply{ID: id, Released: res}, nil))
		})
		return
	}
	if err := a.admit(s, q); err != nil {
		a.ep.metrics.badFrames.WithLabelValues(string(wire.CodeOf(err))).Inc()
		if q.RepliesOnError() {
			a.ep.reply(m.peer, wire.EncodeCallError(q.ID, q.Op, err))
		}
		return
	}
	a.forward(ctx, m.peer, s, q)
}

// admit checks what the codec cannot: the namespace, the session's limits.
func (a *endpointActor) admit(s *session, q *wire.Request) error {
	if ns := a.ep.cfg.Hello.Namespace; ns != "" {
		for _, k := range q.Keys {
			if k.Namespace != ns {
				return fmt.Errorf("%w: key namespace %q, this daemon serves %q", messages.ErrBadKey, k.Namespace, ns)
			}
		}
	}
	if s.inflight >= a.ep.cfg.MaxInFlight {
		return fmt.Errorf("%w: %d calls in flight", messages.ErrBusy, s.inflight)
	}
	if q.Req != nil && q.Op.OpensRequest() && len(s.open) >= a.ep.cfg.MaxOpen {
		if _, known := s.open[s.prefix+q.Req.RequestID]; !known {
			return fmt.Errorf("%w: %d requests without request_finished", messages.ErrBusy, len(s.open))
		}
	}
	return nil
}

func (a *endpointActor) refuse(peer string, id uint64, code wire.Code, err error) {
	a.ep.metrics.badFrames.WithLabelValues(string(code)).Inc()
	a.ep.reply(peer, wire.EncodeError(id, err))
}

func (a *endpointActor) badFrame(ctx actor.Context, peer string, s *session, err error) {
	de, _ := err.(*wire.DecodeError)
	code := wire.CodeBadRequest
	if de != nil {
		code = de.Code
	}
	a.ep.metrics.badFrames.WithLabelValues(string(code)).Inc()
	a.ep.cfg.Log.Debug().Err(err).Str("peer", fmt.Sprintf("%x", peer)).Msg("engine endpoint: malformed frame")
	id := uint64(0)
	if de != nil && de.HasID {
		id = de.ID
	}
	a.ep.reply(peer, wire.EncodeError(id, err))
	if s != nil && !s.ending {
		if s.badFrames++; s.badFrames >= badFrameLimit {
			a.ep.cfg.Log.Warn().Uint64("session", s.id).Int("bad_frames", s.badFrames).Msg("engine endpoint: releasing a session that keeps sending malformed frames")
			a.end(ctx, s, "bad_frames", nil)
		}
	}
}

// hello begins a session for peer; an existing one is released first, so a
// reconnecting engine starts clean.
func (a *endpointActor) hello(ctx actor.Context, peer string, old *session, q *wire.Request) {
	if old != nil && !old.ending {
		a.end(ctx, old, "hello", nil)
	}
	a.t.nextID++
	s := &session{id: a.t.nextID, peer: peer, prefix: sessionPrefix(a.t.nextID), client: q.Client,
		lastSeen: a.ep.cfg.Clock.Now(), open: map[string]struct{}{}}
	a.t.byPeer[peer], a.t.byID[s.id] = s, s
	a.ep.metrics.sessions.Inc()
	h := a.ep.cfg.Hello
	h.Session = s.id
	a.ep.reply(peer, wire.EncodeReply(wire.OpHello, &wire.Reply{ID: q.ID, Hello: h}, nil))
	a.ep.cfg.Log.Info().Uint64("session", s.id).Str("client", s.client).Msg("engine session begun")
}

func (a *endpointActor) arm(ctx actor.Context, s *session, d time.Duration) {
	s.timerGen++
	self, root, msg := ctx.Self(), ctx.ActorSystem().Root, &sessionTimer{session: s.id, gen: s.timerGen}
	s.timer = a.ep.cfg.Clock.AfterFunc(d, func() { root.Send(self, msg) })
}

func (a *endpointActor) timerFired(ctx actor.Context, m *sessionTimer) {
	s := a.t.byID[m.session]
	if s == nil || s.ending || s.timer == nil || m.gen != s.timerGen {
		return // stale: stopped, or replaced by a newer timer
	}
	if len(s.open) == 0 {
		s.timer = nil // holds nothing: no liveness to check
		return
	}
	left := s.lastSeen.Add(a.ep.cfg.Grace).Sub(a.ep.cfg.Clock.Now())
	if left > 0 {
		a.arm(ctx, s, left) // heard from since the timer was armed
		return
	}
	a.ep.cfg.Log.Warn().Uint64("session", s.id).Str("client", s.client).Dur("grace", a.ep.cfg.Grace).
		Int("open_requests", len(s.open)).Msg("engine session lost; releasing what it held")
	a.end(ctx, s, "lost", nil)
}

// connLost: peer's connection ended (the engine exited or was killed).
func (a *endpointActor) connLost(ctx actor.Context, peer string) {
	s := a.t.byPeer[peer]
	if s == nil || s.ending {
		a.t.markGone(peer)
		return
	}
	a.ep.cfg.Log.Warn().Uint64("session", s.id).Str("client", s.client).Int("open_requests", len(s.open)).
		Msg("engine connection ended; releasing what its session held")
	a.end(ctx, s, "lost", nil)
}

// openChanged keeps the liveness timer armed exactly while s holds
// requests.
func (a *endpointActor) openChanged(ctx actor.Context, s *session) {
	switch {
	case len(s.open) > 0 && s.timer == nil:
		a.arm(ctx, s, a.ep.cfg.Grace)
	case len(s.open) == 0 && s.timer != nil:
		s.timer.Stop()
		s.timer = nil
	}
}

// end marks s released: from now on its peer has no session; its holds are
// released at the bridge once its in-flight calls are over.
func (a *endpointActor) end(ctx actor.Context, s *session, reason string, then func(messages.SessionReleased, error)) {
	s.ending, s.reason, s.then = true, reason, then
	if s.timer != nil {
		s.timer.Stop()
	}
	if a.t.byPeer[s.peer] == s {
		delete(a.t.byPeer, s.peer)
	}
	a.ep.metrics.sessions.Dec()
	a.maybeRelease(ctx, s)
}

func (a *endpointActor) maybeRelease(ctx actor.Context, s *session) {
	if !s.ending || s.inflight > 0 || s.open == nil {
		return
	}
	open := make([]string, 0, len(s.open))
	for id := range s.open {
		open = append(open, id)
	}
	s.open = nil // released once
	reply := messages.NewReply[messages.SessionReleased]()
	ctx.Send(a.ep.cfg.Bridge, &messages.ReleaseSession{Prefix: s.prefix, Open: open, Reply: reply,
		Session: s.id, Quarantine: a.ep.cfg.Quarantine})
	self, root, id, timeout := ctx.Self(), ctx.ActorSystem().Root, s.id, a.ep.cfg.CallTimeout
	a.ep.track.goTracked(func() {
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		select {
		case r := <-reply:
			root.Send(self, &released{session: id, res: r.Value, err: r.Err})
		case <-timer.C:
			root.Send(self, &released{session: id, err: fmt.Errorf("release session %d: %w", id, errNoAnswer)})
		case <-a.ep.done:
		}
	})
}

var errNoAnswer = fmt.Errorf("%w: the bridge did not answer", messages.ErrInternal)

func (a *endpointActor) released(m *released) {
	s := a.t.byID[m.session]
	if s == nil {
		return
	}
	delete(a.t.byID, m.session)
	a.ep.metrics.released.WithLabelValues(s.reason).Inc()
	ev := a.ep.cfg.Log.Info()
	if m.err != nil {
		ev = a.ep.cfg.Log.Error().Err(m.err)
	}
	ev.Uint64("session", s.id).Str("client", s.client).Str("reason", s.reason).
		Int("requests", m.res.Requests).Int("jobs_reaped", m.res.Jobs).Msg("engine session released")
	if s.then != nil {
		s.then(m.res, m.err)
	}
}

// forward sends q to the bridge with s's prefix on its request id and
// awaits the answer off the mailbox (armed first: the call's deadline runs
// from before the bridge can have it; a call nobody can await, the
// endpoint closing, is not sent).
func (a *endpointActor) forward(ctx actor.Context, peer string, s *session, q *wire.Request) {
	var req *messages.ReqContext
	if q.Req != nil {
		req = q.Req // decoded fresh for this call: ours to change
		req.RequestID = s.prefix + req.RequestID
		switch {
		case q.Op == wire.OpRequestFinished:
			delete(s.open, req.RequestID)
		case q.Op.OpensRequest():
			s.open[req.RequestID] = struct{}{}
		}
		a.openChanged(ctx, s)
	}
	timeout := a.ep.cfg.CallTimeout
	if q.Timeout > 0 {
		timeout = q.Timeout
	}
	r, ok := routes[q.Op]
	if !ok {
		a.refuse(peer, q.ID, wire.CodeUnknownOp, fmt.Errorf("%w: %s", messages.ErrUnknownOp, q.Op))
		return
	}
	r(&call{a: a, ctx: ctx, peer: peer, s: s, q: q, req: req, timeout: timeout})
}

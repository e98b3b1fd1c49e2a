package endpoint

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// endpointActor carries out the session table's decisions (sessions.go):
// it forwards decoded calls to the bridge, answers the session's own ops
// (hello, ping, bye), arms the liveness timers and sends the releases.
//
// Invariants (the table's own are in sessions.go):
//   - the session table is touched only inside Receive;
//   - a session whose connection ends is released at once: the socket's
//     transport reports it (internal/zmqx/listen.go), no timer involved;
//   - liveness costs O(1) per frame (lastSeen := now) and, only while the
//     session holds requests, at most one timer wakeup per grace period:
//     when the timer fires early (traffic since it was armed) it is
//     re-armed for the remainder. A session holding nothing has no timer (a
//     hung engine then holds nothing to release; what its finished
//     requests' jobs hold is reaped at their own deadlines). No sweep, no
//     polling: an idle engine costs no wakeup;
//   - Receive never blocks: replies go to the writer's queue, bridge
//     answers come back as messages (answered);
//   - a call ends once: answered or expired, whichever comes first (the
//     calls in flight, calls.go); one deadline timer is armed while calls
//     are in flight, for the earliest deadline or earlier, and none once
//     they are all over — no goroutine or timer per call, and no wakeup
//     for an idle endpoint.
type endpointActor struct {
	ep *Endpoint
	t  *sessionTable
}

// Receive handles one message.
func (a *endpointActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *inbound:
		a.inbound(ctx, m)
	case *answered:
		a.answered(ctx, m)
	case *deadlinesDue:
		a.deadlinesDue(ctx, m.gen)
	case *sessionTimer:
		a.timerFired(ctx, m)
	case *connLost:
		a.connLost(ctx, m.peer)
	case *released:
		a.released(m)
	case *actor.Stopping:
		a.stopDeadlineTimer()
	case *actor.Started, *actor.Stopped, *actor.Restarting, *actor.Restart:
	default:
		a.ep.cfg.Log.Warn().Str("type", fmt.Sprintf("%T", m)).Msg("engine endpoint: unknown message dropped")
	}
}

func (a *endpointActor) inbound(ctx actor.Context, m *inbound) {
	s := a.t.heard(m.peer, a.ep.cfg.Clock.Now(), m.err == nil)
	if m.err != nil {
		a.badFrame(ctx, m.peer, s, m.err)
		return
	}
	q := m.req
	if q.Op == wire.OpHello {
		a.hello(ctx, m.peer, q)
		return
	}
	if s == nil {
		a.refuse(m.peer, q.ID, wire.CodeNoSession, fmt.Errorf("%w: say hello first (or again: a silent session is released after %v)", messages.ErrNoSession, a.ep.cfg.Grace))
		return
	}
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
	if err := a.t.admit(s, q, a.limits()); err != nil {
		a.ep.metrics.badFrames.WithLabelValues(string(wire.CodeOf(err))).Inc()
		if q.RepliesOnError() {
			a.ep.reply(m.peer, wire.EncodeCallError(q.ID, q.Op, err))
		}
		return
	}
	a.forward(ctx, m.peer, s, q)
}

func (a *endpointActor) limits() limits {
	return limits{namespace: a.ep.cfg.Hello.Namespace, maxInFlight: a.ep.cfg.MaxInFlight, maxOpen: a.ep.cfg.MaxOpen}
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
	if a.t.malformed(s) {
		a.ep.cfg.Log.Warn().Uint64("session", s.id).Int("bad_frames", s.badFrames).Msg("engine endpoint: releasing a session that keeps sending malformed frames")
		a.end(ctx, s, "bad_frames", nil)
	}
}

// hello begins a session for peer; an existing one is released first, so a
// reconnecting engine starts clean.
func (a *endpointActor) hello(ctx actor.Context, peer string, q *wire.Request) {
	s, old := a.t.hello(peer, q.Client, q.BlockBytes, a.ep.cfg.Clock.Now())
	if s == nil {
		return
	}
	s.topic = q.Topic
	if old != nil {
		a.end(ctx, old, "hello", nil)
	}
	h := a.ep.cfg.Hello
	if err := a.sessionGeometry(s, q.BlockBytes, &h); err != nil {
		a.t.released(s.id)
		a.ep.reply(peer, wire.EncodeCallError(q.ID, wire.OpHello, err))
		return
	}
	a.t.begin(s)
	a.ep.metrics.sessions.Inc()
	h.Session = s.id
	a.ep.reply(peer, wire.EncodeReply(wire.OpHello, &wire.Reply{ID: q.ID, Hello: h}, nil))
	a.ep.cfg.Log.Info().Uint64("session", s.id).Str("client", s.client).Msg("engine session begun")
}

// timer does what the table decided of s's liveness timer.
func (a *endpointActor) timer(ctx actor.Context, s *session, op timerOp) {
	if h := a.t.timers[s.id]; h != nil && op.stop {
		h.Stop()
		delete(a.t.timers, s.id)
	}
	if op.arm > 0 {
		self, root, msg := ctx.Self(), ctx.ActorSystem().Root, &sessionTimer{session: s.id, gen: s.timerGen}
		a.t.timers[s.id] = a.ep.cfg.Clock.AfterFunc(op.arm, func() { root.Send(self, msg) })
	}
}

func (a *endpointActor) timerFired(ctx actor.Context, m *sessionTimer) {
	s, v, op := a.t.timerFired(m.session, m.gen, a.ep.cfg.Clock.Now(), a.ep.cfg.Grace)
	if v == timerStale {
		return
	}
	delete(a.t.timers, s.id) // this one fired
	switch v {
	case timerRearm:
		a.timer(ctx, s, op)
	case timerSilent:
		a.ep.cfg.Log.Warn().Uint64("session", s.id).Str("client", s.client).Dur("grace", a.ep.cfg.Grace).
			Int("open_requests", len(s.open)).Msg("engine session lost; releasing what it held")
		a.end(ctx, s, "lost", nil)
	}
}

// connLost: peer's connection ended (the engine exited or was killed).
func (a *endpointActor) connLost(ctx actor.Context, peer string) {
	s := a.t.connLost(peer)
	if s == nil {
		return
	}
	a.ep.cfg.Log.Warn().Uint64("session", s.id).Str("client", s.client).Int("open_requests", len(s.open)).
		Msg("engine connection ended; releasing what its session held")
	a.end(ctx, s, "lost", nil)
}

// end marks s released: from now on its peer has no session; its holds are
// released at the bridge once its in-flight calls are over.
func (a *endpointActor) end(ctx actor.Context, s *session, reason string, then func(messages.SessionReleased, error)) {
	if s.topic != "" && s.namespace != "" && a.ep.events != nil {
		ctx.Send(a.ep.events, &messages.EngineTopic{Session: s.id, Gone: true})
	}
	a.timer(ctx, s, a.t.end(s, reason, then))
	a.ep.metrics.sessions.Dec()
	a.release(ctx, s)
}

// release sends s's release to the bridge when the table says it is due,
// and awaits the answer off the mailbox.
func (a *endpointActor) release(ctx actor.Context, s *session) {
	open, ok := a.t.due(s)
	if !ok {
		return
	}
	reply := messages.NewReply[messages.SessionReleased]()
	ctx.Send(a.ep.cfg.Bridge, &messages.ReleaseSession{Prefix: s.prefix, Open: open, Reply: reply,
		Session: s.id, Quarantine: a.ep.cfg.Quarantine})
	self, root, id, timeout := ctx.Self(), ctx.ActorSystem().Root, s.id, a.ep.cfg.CallTimeout
	a.ep.track.goTracked(func() {
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		select {
		case r := <-reply.C():
			root.Send(self, &released{session: id, res: r.Value, err: r.Err})
		case <-timer.C:
			root.Send(self, &released{session: id, err: fmt.Errorf("release session %d: %w", id, errNoAnswer)})
		case <-a.ep.done:
		}
	})
}

var errNoAnswer = fmt.Errorf("%w: the bridge did not answer", messages.ErrInternal)

func (a *endpointActor) released(m *released) {
	s := a.t.released(m.session)
	if s == nil {
		return
	}
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
	a.timer(ctx, s, a.t.forward(s, q, a.ep.cfg.Grace))
	timeout := a.ep.cfg.CallTimeout
	if q.Timeout > 0 {
		timeout = q.Timeout
	}
	r, ok := routes[q.Op]
	if !ok {
		a.refuse(peer, q.ID, wire.CodeUnknownOp, fmt.Errorf("%w: %s", messages.ErrUnknownOp, q.Op))
		return
	}
	if q.Req != nil {
		q.Req.BlockBytes = s.geometry.BlockBytes
	}
	r(&call{a: a, ctx: ctx, peer: peer, s: s, q: q, req: q.Req, timeout: timeout})
}

// begin records c as in flight (its session's count too) and makes sure
// the deadline timer fires by its deadline.
func (a *endpointActor) begin(c *call) *flight {
	f := a.ep.calls.begin(c.s.id, c.peer, c.q, a.ep.cfg.Clock.Elapsed(), c.timeout)
	ns := c.s.namespace
	a.t.sent(c.s, c.q)
	if s := c.s; s.namespace != ns && s.topic != "" && a.ep.events != nil {
		// NB: the hub announces this namespace's blocks under the engine's
		// own topic from now on.
		c.ctx.Send(a.ep.events, &messages.EngineTopic{Session: s.id, Namespace: s.namespace, Topic: s.topic})
	}
	a.armDeadline(c.ctx)
	return f
}

// answered sends the bridge's answer to a call still in flight; one that
// expired first is dropped.
func (a *endpointActor) answered(ctx actor.Context, m *answered) {
	f := a.ep.calls.answered(m.id)
	if f == nil {
		return
	}
	if a.ep.calls.len() == 0 {
		// NB: before the reply goes out: an engine that has its answer
		// sees no timer of its calls left, and an idle endpoint has none.
		a.stopDeadlineTimer()
	}
	if body, send := m.encode(); send {
		a.ep.reply(f.peer, body)
	}
	a.release(ctx, a.t.callDone(f.session))
}

// deadlinesDue answers every call past its deadline with a timeout and
// arms the timer for the next.
func (a *endpointActor) deadlinesDue(ctx actor.Context, gen uint64) {
	c := a.ep.calls
	if gen != c.timerGen {
		return // stopped or re-armed since
	}
	c.timer, c.armedFor = nil, 0
	for _, f := range c.expire(a.ep.cfg.Clock.Elapsed()) {
		if f.q.RepliesOnError() {
			err := fmt.Errorf("%s: no answer within %v: %w", f.q.Op, f.timeout, context.DeadlineExceeded)
			a.ep.reply(f.peer, wire.EncodeCallError(f.q.ID, f.q.Op, err))
		}
		a.release(ctx, a.t.callDone(f.session))
	}
	a.armDeadline(ctx)
}

// armDeadline arms the deadline timer for the earliest call in flight,
// unless one is armed for that deadline or earlier (an early fire finds
// nothing due and re-arms: a busy endpoint wakes at most once per call
// timeout).
func (a *endpointActor) armDeadline(ctx actor.Context) {
	c := a.ep.calls
	next, ok := c.next()
	if !ok || c.timer != nil && c.armedFor <= next {
		return
	}
	a.stopDeadlineTimer()
	c.timerGen++
	root, self, msg := ctx.ActorSystem().Root, ctx.Self(), &deadlinesDue{gen: c.timerGen}
	c.timer = a.ep.cfg.Clock.AfterFunc(max(next-a.ep.cfg.Clock.Elapsed(), 0), func() { root.Send(self, msg) })
	c.armedFor = next
}

func (a *endpointActor) stopDeadlineTimer() {
	c := a.ep.calls
	if c.timer != nil {
		c.timer.Stop()
		c.timer, c.armedFor = nil, 0
		c.timerGen++
	}
}

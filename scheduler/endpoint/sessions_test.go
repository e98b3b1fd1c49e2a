package endpoint

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
	"github.com/kvtier/kvtier/supervision/modeltime"
)

const testGrace = 10 * time.Second

var t0 = time.Unix(1_700_000_000, 0)

// call is a request of op for request id req ("" for none).
func req(op wire.Op, req string, keys ...messages.Key) *wire.Request {
	q := &wire.Request{Op: op, Keys: keys}
	if req != "" {
		q.Req = &messages.ReqContext{RequestID: req}
	}
	return q
}

// opened is a table with a live session for peer "e1".
func opened(t *testing.T) (*sessionTable, *session) {
	tb := newSessionTable()
	s, old := tb.hello("e1", "vllm", 0, t0)
	require.NotNil(t, s)
	require.Nil(t, old)
	tb.begin(s)
	return tb, s
}

// A Hello opens a session under its own request-id prefix; a second Hello
// from the same connection names the first, to end, before the new one is
// its peer's; a connection that ended before its Hello was read opens none
// (and a later Hello under that routing id does).
func TestSessionsHello(t *testing.T) {
	tb, s1 := opened(t)
	require.Equal(t, sessionPrefix(1), s1.prefix)
	s2, old := tb.hello("e1", "vllm", 0, t0)
	require.Same(t, s1, old)
	tb.end(old, "hello", nil)
	tb.begin(s2)
	require.Same(t, s2, tb.byPeer["e1"])
	require.NotEqual(t, s1.prefix, s2.prefix)

	require.Nil(t, tb.connLost("e2"), "no session: remembered as gone")
	s, _ := tb.hello("e2", "x", 0, t0)
	require.Nil(t, s, "a Hello read after its connection ended opens nothing")
	s, _ = tb.hello("e2", "x", 0, t0)
	require.NotNil(t, s, "a later connection under the routing id is heard")
}

// The gone list is bounded: the oldest routing id leaves first.
func TestSessionsGoneIsBounded(t *testing.T) {
	tb := newSessionTable()
	for i := range maxGone + 1 {
		tb.connLost(fmt.Sprint("peer-", i))
	}
	require.Len(t, tb.gone, maxGone)
	require.NotContains(t, tb.gone, "peer-0")
	require.Contains(t, tb.gone, fmt.Sprint("peer-", maxGone))
}

// admit refuses keys of another namespace, a call past the in-flight
// limit, and a new request past the open limit (one already open passes).
func TestSessionsAdmit(t *testing.T) {
	tb, s := opened(t)
	lim := limits{namespace: "ns", maxInFlight: 2, maxOpen: 1}
	require.NoError(t, tb.admit(s, req(wire.OpLookup, "a", messages.Key{Namespace: "ns"}), lim))
	require.ErrorIs(t, tb.admit(s, req(wire.OpLookup, "a", messages.Key{Namespace: "other"}), lim), messages.ErrBadKey)

	tb.forward(s, req(wire.OpLookup, "a"), testGrace)
	require.ErrorIs(t, tb.admit(s, req(wire.OpPrepareStore, "b"), lim), messages.ErrBusy, "a second open request")
	require.NoError(t, tb.admit(s, req(wire.OpPrepareStore, "a"), lim), "the open one again")
	require.NoError(t, tb.admit(s, req(wire.OpTouch, "b"), lim), "a call that opens nothing")

	tb.sent(s, &wire.Request{})
	tb.sent(s, &wire.Request{})
	require.ErrorIs(t, tb.admit(s, req(wire.OpTouch, "a"), lim), messages.ErrBusy, "two calls in flight")
	tb.callDone(s.id)
	require.NoError(t, tb.admit(s, req(wire.OpTouch, "a"), lim))
}

// forward books the session's requests under its prefix and keeps the
// liveness timer armed exactly while one is open.
func TestSessionsForwardArmsWhileOpen(t *testing.T) {
	tb, s := opened(t)
	q := req(wire.OpLookup, "a")
	require.Equal(t, timerOp{arm: testGrace}, tb.forward(s, q, testGrace))
	require.Equal(t, s.prefix+"a", q.Req.RequestID, "the bridge sees the session's prefix")
	require.Equal(t, uint64(1), s.timerGen)
	require.Equal(t, timerOp{}, tb.forward(s, req(wire.OpPrepareStore, "b"), testGrace), "armed already")
	require.Equal(t, timerOp{}, tb.forward(s, req(wire.OpTouch, "c"), testGrace), "opens nothing")
	require.Equal(t, timerOp{}, tb.forward(s, req(wire.OpStats, ""), testGrace), "no request")
	require.Equal(t, timerOp{}, tb.forward(s, req(wire.OpRequestFinished, "a"), testGrace), "b is still open")
	require.Equal(t, timerOp{stop: true}, tb.forward(s, req(wire.OpRequestFinished, "b"), testGrace))
	require.False(t, s.armed)
	require.Empty(t, s.open)
}

// A fired timer is stale when stopped or replaced, idle when nothing is
// open, re-armed for the rest of the grace when the session was heard
// from since, and ends a session silent for the whole grace.
func TestSessionsTimerFired(t *testing.T) {
	tb, s := opened(t)
	tb.forward(s, req(wire.OpLookup, "a"), testGrace)
	gen := s.timerGen

	_, v, _ := tb.timerFired(s.id, gen+1, t0, testGrace)
	require.Equal(t, timerStale, v, "another generation")
	_, v, _ = tb.timerFired(99, gen, t0, testGrace)
	require.Equal(t, timerStale, v, "no such session")

	tb.heard("e1", t0.Add(4*time.Second), true)
	_, v, op := tb.timerFired(s.id, gen, t0.Add(testGrace), testGrace)
	require.Equal(t, timerRearm, v)
	require.Equal(t, timerOp{arm: 4 * time.Second}, op)
	_, v, _ = tb.timerFired(s.id, gen, t0.Add(testGrace), testGrace)
	require.Equal(t, timerStale, v, "the re-armed timer replaced it")

	_, v, _ = tb.timerFired(s.id, s.timerGen, t0.Add(14*time.Second), testGrace)
	require.Equal(t, timerSilent, v)

	tb, s = opened(t)
	tb.forward(s, req(wire.OpLookup, "a"), testGrace)
	s.open = map[string]struct{}{} // a finished request's stop crossed the firing
	_, v, _ = tb.timerFired(s.id, s.timerGen, t0.Add(testGrace), testGrace)
	require.Equal(t, timerIdle, v)
	require.False(t, s.armed)
}

// A session ends at once (its peer has none from then on, its timer is
// stopped) but is released only once its calls in flight are over, once,
// with the requests it held open.
func TestSessionsReleaseWaitsForCalls(t *testing.T) {
	tb, s := opened(t)
	tb.forward(s, req(wire.OpLookup, "a"), testGrace)
	tb.sent(s, &wire.Request{})
	tb.sent(s, &wire.Request{})
	require.Equal(t, timerOp{stop: true}, tb.end(s, "bye", nil))
	require.Nil(t, tb.byPeer["e1"])
	_, ok := tb.due(s)
	require.False(t, ok, "two calls in flight")
	_, ok = tb.due(tb.callDone(s.id))
	require.False(t, ok, "one call in flight")
	open, ok := tb.due(tb.callDone(s.id))
	require.True(t, ok)
	require.Equal(t, []string{s.prefix + "a"}, open)
	_, ok = tb.due(s)
	require.False(t, ok, "released once")
	require.Same(t, s, tb.released(s.id))
	require.Nil(t, tb.released(s.id))
	require.Nil(t, tb.callDone(s.id), "a call that ends after the release finds nothing")
}

// badFrameLimit malformed frames in a row end a session; a frame that
// decodes starts the count over; an ended session is not ended again.
func TestSessionsMalformed(t *testing.T) {
	tb, s := opened(t)
	for range badFrameLimit - 1 {
		require.False(t, tb.malformed(tb.heard("e1", t0, false)))
	}
	tb.heard("e1", t0, true)
	for range badFrameLimit - 1 {
		require.False(t, tb.malformed(tb.heard("e1", t0, false)))
	}
	require.True(t, tb.malformed(tb.heard("e1", t0, false)))
	tb.end(s, "bad_frames", nil)
	require.False(t, tb.malformed(s))
	require.False(t, tb.malformed(nil))
}

// The table driven through a seeded world of four engine connections that
// say hello (again), make calls that open and finish requests, send bad
// frames, say bye, go silent or lose their connection, while calls end in
// any order, timers fire (stopped ones too) and the bridge answers
// releases late. After every step the world checks the table's
// invariants (sessions.go); at the end, with every connection lost and
// every answer delivered, that every session was released exactly once,
// with the requests it held open, and nothing is left.
func TestSessionsSeeded(t *testing.T) {
	modeltime.Run(t, 200, 300, newSessionsWorld, (*sessionsWorld).step, (*sessionsWorld).settle)
}

type sessionsWorld struct {
	t        *testing.T
	rng      *rand.Rand
	tb       *sessionTable
	now      time.Time
	timers   modeltime.Timers
	calls    []uint64            // session ids of calls in flight, one entry a call
	opens    map[uint64][]string // what each session should hold open, prefixed
	releases []uint64            // releases sent, not yet answered
	released map[uint64]int      // releases sent, by session
	sessions []*session          // every session ever opened
}

var worldPeers = []string{"e0", "e1", "e2", "e3"}

func newSessionsWorld(t *testing.T, seed uint64) *sessionsWorld {
	return &sessionsWorld{t: t, rng: rand.New(rand.NewPCG(seed, 0xe4d)), tb: newSessionTable(), now: t0,
		opens: map[uint64][]string{}, released: map[uint64]int{}}
}

// timer does what the actor's timer does, on the world's timers.
func (w *sessionsWorld) timer(s *session, op timerOp) {
	if h := w.tb.timers[s.id]; h != nil && op.stop {
		h.Stop()
		delete(w.tb.timers, s.id)
	}
	if op.arm > 0 {
		w.tb.timers[s.id] = w.timers.After(&sessionTimer{session: s.id, gen: s.timerGen})
	}
}

func (w *sessionsWorld) end(s *session, reason string) {
	w.timer(s, w.tb.end(s, reason, nil))
	w.release(s)
}

func (w *sessionsWorld) release(s *session) {
	open, ok := w.tb.due(s)
	if !ok {
		return
	}
	require.Zero(w.t, s.inflight, "session %d released with calls in flight", s.id)
	require.True(w.t, s.ending)
	w.released[s.id]++
	require.Equal(w.t, 1, w.released[s.id], "session %d released twice", s.id)
	require.ElementsMatch(w.t, w.opens[s.id], open, "session %d released with other requests than it held", s.id)
	w.releases = append(w.releases, s.id)
}

func (w *sessionsWorld) call(peer string) {
	s := w.tb.heard(peer, w.now, true)
	if s == nil {
		return
	}
	id := fmt.Sprint("r", w.rng.IntN(6))
	op := []wire.Op{wire.OpLookup, wire.OpPrepareStore, wire.OpTouch, wire.OpRequestFinished, wire.OpStats}[w.rng.IntN(5)]
	q := req(op, id)
	if op == wire.OpStats {
		q.Req = nil
	}
	if w.tb.admit(s, q, limits{maxInFlight: 3, maxOpen: 4}) != nil {
		return
	}
	w.timer(s, w.tb.forward(s, q, testGrace))
	if q.Req != nil {
		require.True(w.t, strings.HasPrefix(q.Req.RequestID, s.prefix))
		switch {
		case op == wire.OpRequestFinished:
			w.opens[s.id] = slices.DeleteFunc(w.opens[s.id], func(r string) bool { return r == q.Req.RequestID })
		case op.OpensRequest() && !slices.Contains(w.opens[s.id], q.Req.RequestID):
			w.opens[s.id] = append(w.opens[s.id], q.Req.RequestID)
		}
	}
	w.tb.sent(s, &wire.Request{})
	w.calls = append(w.calls, s.id)
}

func (w *sessionsWorld) fire(settling bool) bool {
	msg, ok := w.timers.Fire(w.rng, settling)
	if !ok {
		return false
	}
	m := msg.(*sessionTimer)
	s, v, op := w.tb.timerFired(m.session, m.gen, w.now, testGrace)
	if v == timerStale {
		return true
	}
	delete(w.tb.timers, s.id)
	switch v {
	case timerRearm:
		w.timer(s, op)
	case timerSilent:
		require.False(w.t, s.lastSeen.Add(testGrace).After(w.now), "a session heard from within the grace ended as silent")
		w.end(s, "lost")
	}
	return true
}

func (w *sessionsWorld) step() {
	peer := worldPeers[w.rng.IntN(len(worldPeers))]
	switch r := w.rng.IntN(20); {
	case r < 2:
		if s, old := w.tb.hello(peer, "engine", 0, w.now); s != nil {
			if old != nil {
				w.end(old, "hello")
			}
			w.tb.begin(s)
			w.sessions = append(w.sessions, s)
		}
	case r < 9:
		w.call(peer)
	case r < 12 && len(w.calls) > 0:
		w.release(w.tb.callDone(modeltime.Take(&w.calls, w.rng.IntN(len(w.calls)))))
	case r < 13:
		if s := w.tb.heard(peer, w.now, false); w.tb.malformed(s) {
			w.end(s, "bad_frames")
		}
	case r < 14:
		if s := w.tb.heard(peer, w.now, true); s != nil {
			w.end(s, "bye")
		}
	case r < 15:
		if s := w.tb.connLost(peer); s != nil {
			w.end(s, "lost")
		}
	case r < 17:
		w.fire(false)
	case r < 18 && len(w.releases) > 0:
		w.tb.released(modeltime.Take(&w.releases, w.rng.IntN(len(w.releases))))
	default:
		w.now = w.now.Add(time.Duration(w.rng.IntN(4000)) * time.Millisecond)
	}
	w.check()
}

// check holds the table's invariants after every step.
func (w *sessionsWorld) check() {
	inflight := map[uint64]int{}
	for _, id := range w.calls {
		inflight[id]++
	}
	for peer, s := range w.tb.byPeer {
		require.False(w.t, s.ending, "byPeer names an ended session")
		require.Equal(w.t, peer, s.peer)
	}
	for id, s := range w.tb.byID {
		require.Equal(w.t, inflight[id], s.inflight, "session %d: calls in flight", id)
		if s.ending {
			require.False(w.t, s.armed, "ended session %d has a timer", id)
			continue
		}
		require.Same(w.t, s, w.tb.byPeer[s.peer], "live session %d is its peer's", id)
		require.Equal(w.t, len(s.open) > 0, s.armed, "session %d: armed exactly while it holds requests", id)
		require.ElementsMatch(w.t, w.opens[id], slices.Collect(maps.Keys(s.open)))
	}
}

// settle loses every connection, ends every call, fires every timer and
// answers every release: nothing may be left, and every session was
// released exactly once.
func (w *sessionsWorld) settle() {
	for _, peer := range worldPeers {
		if s := w.tb.connLost(peer); s != nil {
			w.end(s, "lost")
		}
	}
	for len(w.calls) > 0 {
		w.release(w.tb.callDone(modeltime.Take(&w.calls, w.rng.IntN(len(w.calls)))))
	}
	for w.fire(true) {
	}
	for len(w.releases) > 0 {
		w.tb.released(modeltime.Take(&w.releases, 0))
	}
	w.check()
	require.Empty(w.t, w.tb.byPeer)
	require.Empty(w.t, w.tb.byID)
	require.Empty(w.t, w.tb.timers, "a timer handle outlived its session")
	for _, s := range w.sessions {
		require.Equal(w.t, 1, w.released[s.id], "session %d released once", s.id)
	}
}

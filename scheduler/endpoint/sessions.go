package endpoint

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// The endpoint's core: the engine sessions, the request ids each holds
// open at the bridge, its calls in flight, its liveness deadline and its
// release. Its methods decide and say what to do; the endpoint actor
// (actor.go) carries that out: replies, bridge messages, timers, metrics,
// logs. sessions_test.go drives it alone.
//
// Invariants (checked by TestSessionsSeeded):
//   - a session's request ids carry its own prefix: sessions never share
//     leases or jobs at the bridge;
//   - a session is released exactly once (connection lost, bye, hello
//     again, silence, bad frames), and only once its calls in flight are
//     over: a PrepareStore answered after the release would open a job
//     nobody reaps;
//   - a live session's liveness timer is armed exactly while it holds open
//     requests; an ended one has none;
//   - byPeer names only live sessions; byID holds every session until the
//     bridge answered its release.

// sessionTable is the endpoint's state, owned by the endpoint actor. It
// outlives a restart of that actor (like the CPU tier's State), so a
// restart loses no session and leaks nothing.
type sessionTable struct {
	byPeer map[string]*session
	byID   map[uint64]*session
	nextID uint64
	// gone: routing ids whose connection ended with no session yet, so a
	// Hello still in flight from them opens none. Bounded, oldest first out.
	gone      map[string]struct{}
	goneOrder []string
	// timers are the armed liveness timers by session id: the actor's
	// handles, never read by the table's decisions.
	timers map[uint64]interface{ Stop() bool }
}

// maxGone bounds the routing ids remembered as gone.
const maxGone = 1024

func newSessionTable() *sessionTable {
	return &sessionTable{byPeer: map[string]*session{}, byID: map[uint64]*session{}, gone: map[string]struct{}{},
		timers: map[uint64]interface{ Stop() bool }{}}
}

// session is one engine connection's state.
type session struct {
	id         uint64
	peer       string
	prefix     string
	client     string
	topic      string             // its hello's: the topic of its own KV events ("" = none)
	since      time.Time          // when its hello was heard
	blockBytes int                // the bytes per block its hello declared
	geometry   Geometry           // the pool's region its slots are in (zero: Hello's)
	namespace  messages.Namespace // its latest keyed call's
	calls      uint64             // calls it made (forwarded)
	// lookups and hits count its keys looked up and answered HIT; the
	// replies' goroutines add to them (atomics), the stats route reads them.
	lookups, hits atomic.Uint64
	lastSeen      time.Time
	armed         bool                // a liveness timer is armed ...
	timerGen      uint64              // ... and this is its generation
	open          map[string]struct{} // prefixed request ids without RequestFinished yet; nil once released
	inflight      int                 // calls forwarded and not yet answered
	badFrames     int                 // malformed frames in a row
	// ending is set once the session is released; the release is sent when
	// inflight reaches 0. reason says why, then runs after the bridge's answer.
	ending bool
	reason string
	then   func(messages.SessionReleased, error)
}

// limits are what a session may hold, from the endpoint's Config.
type limits struct {
	namespace   messages.Namespace // the only key namespace served; "" = any
	maxInFlight int
	maxOpen     int
}

// timerOp is what to do with a session's liveness timer: stop the armed
// one, arm a new one (of generation s.timerGen) for arm, both, or neither.
type timerOp struct {
	stop bool
	arm  time.Duration
}

// heard is a frame from peer at now, decoded or not: its live session
// (nil when it has none), whose silence starts over; a decoded frame ends
// a run of malformed ones.
func (t *sessionTable) heard(peer string, now time.Time, decoded bool) *session {
	s := t.byPeer[peer]
	if s != nil {
		s.lastSeen = now
		if decoded {
			s.badFrames = 0
		}
	}
	return s
}

// malformed counts a frame from s that did not decode and reports whether
// it is one too many in a row: the session is then to be ended.
func (t *sessionTable) malformed(s *session) bool {
	if s == nil || s.ending {
		return false
	}
	s.badFrames++
	return s.badFrames >= badFrameLimit
}

// hello opens a session for peer (nil when its connection already ended:
// nobody to serve). A live session of the peer's is to be ended first.
func (t *sessionTable) hello(peer, client string, blockBytes int, now time.Time) (s, old *session) {
	if _, gone := t.gone[peer]; gone {
		// Its connection ended before the Hello was read. (A later
		// connection under the same routing id is heard.)
		delete(t.gone, peer)
		return nil, nil
	}
	old = t.byPeer[peer]
	t.nextID++
	s = &session{id: t.nextID, peer: peer, prefix: sessionPrefix(t.nextID), client: client,
		since: now, blockBytes: blockBytes, lastSeen: now, open: map[string]struct{}{}}
	t.byID[s.id] = s
	return s, old
}

// begin makes s its peer's live session (after the old one ended).
func (t *sessionTable) begin(s *session) { t.byPeer[s.peer] = s }

// admit checks what the codec cannot: the namespace, the session's limits.
func (t *sessionTable) admit(s *session, q *wire.Request, lim limits) error {
	if ns := lim.namespace; ns != "" {
		for _, k := range q.Keys {
			if k.Namespace != ns {
				return fmt.Errorf("%w: key namespace %q, this daemon serves %q", messages.ErrBadKey, k.Namespace, ns)
			}
		}
	}
	if s.inflight >= lim.maxInFlight {
		return fmt.Errorf("%w: %d calls in flight", messages.ErrBusy, s.inflight)
	}
	if q.Req != nil && q.Op.OpensRequest() && len(s.open) >= lim.maxOpen {
		if _, known := s.open[s.prefix+q.Req.RequestID]; !known {
			return fmt.Errorf("%w: %d requests without request_finished", messages.ErrBusy, len(s.open))
		}
	}
	return nil
}

// forward prefixes q's request id with s's and books it: opened, or
// finished. The timer op keeps the liveness timer armed exactly while s
// holds requests.
func (t *sessionTable) forward(s *session, q *wire.Request, grace time.Duration) timerOp {
	if q.Req == nil {
		return timerOp{}
	}
	q.Req.RequestID = s.prefix + q.Req.RequestID // NB: decoded fresh for this call: ours to change
	switch {
	case q.Op == wire.OpRequestFinished:
		delete(s.open, q.Req.RequestID)
	case q.Op.OpensRequest():
		s.open[q.Req.RequestID] = struct{}{}
	}
	switch {
	case len(s.open) > 0 && !s.armed:
		return t.arm(s, grace)
	case len(s.open) == 0 && s.armed:
		s.armed = false
		return timerOp{stop: true}
	}
	return timerOp{}
}

// sent counts a call of s now awaited: it is in flight until callDone.
func (t *sessionTable) sent(s *session, q *wire.Request) {
	s.inflight++
	s.calls++
	if len(q.Keys) > 0 {
		s.namespace = q.Keys[0].Namespace
	}
}

// engines lists the live sessions, oldest first (the stats reply's).
func (t *sessionTable) engines() []messages.EngineSession {
	out := make([]messages.EngineSession, 0, len(t.byPeer))
	for _, s := range t.byPeer {
		out = append(out, messages.EngineSession{ID: s.id, Client: s.client, Topic: s.topic, Namespace: s.namespace,
			BlockBytes: s.blockBytes, Since: s.since, Calls: s.calls, Lookups: s.lookups.Load(),
			Hits: s.hits.Load(), Open: len(s.open), InFlight: s.inflight})
	}
	slices.SortFunc(out, func(a, b messages.EngineSession) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// callDone ends one of session id's calls; it returns the session when its
// release is now due (see due).
func (t *sessionTable) callDone(id uint64) *session {
	s := t.byID[id]
	if s == nil {
		return nil
	}
	s.inflight--
	return s
}

func (t *sessionTable) arm(s *session, d time.Duration) timerOp {
	s.timerGen++
	s.armed = true
	return timerOp{arm: d}
}

// timerVerdict is what a fired liveness timer means.
type timerVerdict uint8

const (
	timerStale  timerVerdict = iota // stopped or replaced: nothing to do
	timerIdle                       // s holds nothing: no liveness to check
	timerRearm                      // heard from since it was armed: armed again for the rest
	timerSilent                     // silent past the grace: end s
)

// timerFired decides session id's timer of generation gen at now.
func (t *sessionTable) timerFired(id, gen uint64, now time.Time, grace time.Duration) (*session, timerVerdict, timerOp) {
	s := t.byID[id]
	if s == nil || s.ending || !s.armed || gen != s.timerGen {
		return s, timerStale, timerOp{}
	}
	s.armed = false
	if len(s.open) == 0 {
		return s, timerIdle, timerOp{}
	}
	if left := s.lastSeen.Add(grace).Sub(now); left > 0 {
		return s, timerRearm, t.arm(s, left)
	}
	return s, timerSilent, timerOp{}
}

// connLost is peer's connection's end: its live session, to end, or nil
// (then a Hello still in flight from it opens none).
func (t *sessionTable) connLost(peer string) *session {
	s := t.byPeer[peer]
	if s == nil {
		t.markGone(peer)
	}
	return s
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

// end marks s released for reason: from now on its peer has no session.
// then runs with the bridge's answer. Its holds are released at the
// bridge once its calls in flight are over (due).
func (t *sessionTable) end(s *session, reason string, then func(messages.SessionReleased, error)) timerOp {
	s.ending, s.reason, s.then = true, reason, then
	if t.byPeer[s.peer] == s {
		delete(t.byPeer, s.peer)
	}
	if s.armed {
		s.armed = false
		return timerOp{stop: true}
	}
	return timerOp{}
}

// due reports whether s's release is to be sent now, and the request ids
// it held open: once, when it ended and its last call is over.
func (t *sessionTable) due(s *session) (open []string, ok bool) {
	if s == nil || !s.ending || s.inflight > 0 || s.open == nil {
		return nil, false
	}
	open = slices.Collect(maps.Keys(s.open))
	s.open = nil // released once
	return open, true
}

// released forgets session id, whose release the bridge answered: the
// session, nil when already forgotten.
func (t *sessionTable) released(id uint64) *session {
	s := t.byID[id]
	delete(t.byID, id)
	return s
}

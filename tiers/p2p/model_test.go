package p2p

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer"
	"github.com/kvtier/kvtier/peer/peermsg"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/supervision/modeltime"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// The P2P tier's core driven through a seeded world: three peers whose
// sessions come and go (a session that comes back is a new actor), answer
// lookups and fetches in any order, late, with errors and short answers;
// the tiering actor asks lookups and reads what they found (and some keys
// they did not); hold and lookup deadlines fire at random, stopped ones
// too. After every message the world checks what the tier promises, and
// at the end, with every answer delivered and every deadline fired, that
// nothing is left.
//
// The promises checked:
//   - every tiermsg.Lookup, tiermsg.ReadBatch and peermsg.Probe is answered exactly
//     once; a read only once no fetch of it is unanswered (nothing writes
//     its slots any more), with an error for every key it did not fetch;
//   - a peer is asked only while its session is up;
//   - every producer round that holds hits for us is given back exactly
//     once, by a release or by the fetch that consumes it, and a fetch
//     asks only for keys its round holds;
//   - settled, the tier holds nothing: no lookup, fetch, probe, held key or
//     round.
func TestModelSeeded(t *testing.T) {
	modeltime.Run(t, 150, 400, newWorld, (*world).step, (*world).settle)
}

var modelNodes = []string{"a", "b", "c"}

// producerRound is a round a session opened at its producer.
type producerRound struct {
	pid   *actor.PID
	round uint64
}

// sessionCall is a request to a session not yet answered.
type sessionCall struct {
	node string
	pid  *actor.PID
	msg  any
}

// tierCall is a request of the tiering actor's not yet answered.
type tierCall struct {
	keys    []messages.Key
	read    bool
	fetches map[uint64]bool // a read's peermsg.Fetch corrs still unanswered
}

type world struct {
	t     *testing.T
	rng   *rand.Rand
	core  *State
	asker *actor.PID

	up       map[string]*actor.PID // node → its ready session
	sessions int
	rounds   map[producerRound][]messages.Key // open rounds → their hits
	closed   map[producerRound]int
	nextRnd  uint64

	calls    []sessionCall
	corr     uint64
	asked    map[uint64]*tierCall // the tiering actor's corr → its call
	answered map[uint64]int
	found    []messages.Key // keys some lookup found, for reads to ask
	handling *tierCall      // the read being handled, whose fetches go out now
	timers   modeltime.Timers
	out      Out // what the core decided, carried out by carry
	probes   []messages.Reply[[]bool]
}

func newWorld(t *testing.T, seed uint64) *world {
	w := &world{t: t, rng: rand.New(rand.NewPCG(seed, 0xb2b)), asker: actor.NewPID("model", "tiering"),
		up: map[string]*actor.PID{}, rounds: map[producerRound][]messages.Key{}, closed: map[producerRound]int{},
		asked: map[uint64]*tierCall{}, answered: map[uint64]int{}}
	w.core = NewState(Config{Clock: supervision.NewManualClock(time.Unix(1_700_000_000, 0)), Log: zerolog.Nop()}.WithDefaults())
	return w
}

// What the core decided (its Out) is checked message by message, in the
// order it decided it.
func (w *world) carry() {
	require.Empty(w.t, w.out.Watches, "a watcher without a directory")
	require.Empty(w.t, w.out.Unwatches, "a watcher without a directory")
	w.timers.Carry(&w.out.Out, w)
}

func (w *world) Request(to *actor.PID, msg any) {
	node := w.nodeOf(to)
	switch m := msg.(type) {
	case *peermsg.Lookup:
		require.NotEmpty(w.t, node, "a lookup to %v, which is not up", to)
	case *peermsg.Fetch:
		rid := producerRound{pid: to, round: m.Round}
		hits, open := w.rounds[rid]
		require.True(w.t, open, "a fetch of round %v, which is not open", rid)
		for _, k := range m.Keys {
			require.Contains(w.t, hits, k, "a fetch of a key round %v does not hold", rid)
		}
		require.NotNil(w.t, w.handling, "a fetch outside a read")
		w.handling.fetches[m.Corr] = true
		w.close(rid)
	default:
		w.t.Fatalf("unexpected request %T", msg)
	}
	w.calls = append(w.calls, sessionCall{node: node, pid: to, msg: msg})
}

func (w *world) Send(to *actor.PID, msg any) {
	switch m := msg.(type) {
	case *peermsg.Release:
		w.close(producerRound{pid: to, round: m.Round})
	case *tiermsg.LookupResult, *tiermsg.ReadBatchResult:
		require.Equal(w.t, w.asker, to)
		w.answer(msg)
	default:
		w.t.Fatalf("unexpected send %T", msg)
	}
}

func (w *world) Respond(msg any) {
	switch msg.(type) {
	case *tiermsg.LookupResult, *tiermsg.ReadBatchResult:
		w.answer(msg)
	case *tiermsg.ReadResult, *tiermsg.WriteResult, *tiermsg.StatsReply:
	default:
		w.t.Fatalf("unexpected answer %T", msg)
	}
}

func (w *world) nodeOf(pid *actor.PID) string {
	for n, p := range w.up {
		if p == pid {
			return n
		}
	}
	return ""
}

func (w *world) close(rid producerRound) {
	w.closed[rid]++
	require.Equal(w.t, 1, w.closed[rid], "round %v given back twice", rid)
	delete(w.rounds, rid)
}

// answer checks the tier's answer to one of the tiering actor's calls.
func (w *world) answer(msg any) {
	var corr uint64
	switch m := msg.(type) {
	case *tiermsg.LookupResult:
		corr = m.Corr
		c := w.asked[corr]
		require.NotNil(w.t, c, "an answer to no lookup")
		require.False(w.t, c.read)
		require.Len(w.t, m.Found, len(c.keys))
		for i, f := range m.Found {
			if f {
				w.found = append(w.found, c.keys[i])
			}
		}
	case *tiermsg.ReadBatchResult:
		corr = m.Corr
		c := w.asked[corr]
		require.NotNil(w.t, c, "an answer to no read")
		require.True(w.t, c.read)
		require.Empty(w.t, c.fetches, "a read answered while its fetches run")
		require.Len(w.t, m.Errs, len(c.keys))
		require.Len(w.t, m.Checksums, len(c.keys))
	}
	w.answered[corr]++
	require.Equal(w.t, 1, w.answered[corr], "call %d answered twice", corr)
}

func (w *world) handle(from *actor.PID, msg any) {
	w.core.Handle(&w.out, fx.RefOf(from), msg)
	w.carry()
}

func (w *world) step() {
	switch r := w.rng.IntN(100); {
	case r < 8:
		w.peerUp()
	case r < 12:
		w.peerDown()
	case r < 30:
		w.lookup()
	case r < 40:
		w.read()
	case r < 72:
		w.answerSession(w.rng.IntN(max(len(w.calls), 1)))
	case r < 88:
		w.fireTimer(false)
	case r < 92:
		w.probe()
	default:
		reply := messages.NewReply[struct{}]()
		w.handle(nil, &peermsg.AwaitPeers{Nodes: []string{modelNodes[w.rng.IntN(3)]}, Reply: reply})
	}
}

func (w *world) peerUp() {
	node := modelNodes[w.rng.IntN(len(modelNodes))]
	if w.up[node] != nil && w.rng.IntN(2) == 0 {
		return
	}
	w.sessions++
	pid := actor.NewPID("model", fmt.Sprintf("%s/%d", node, w.sessions))
	w.up[node] = pid
	w.handle(nil, &peer.Up{Node: node, Session: pid})
}

func (w *world) peerDown() {
	node := modelNodes[w.rng.IntN(len(modelNodes))]
	pid := w.up[node]
	if pid == nil {
		return
	}
	delete(w.up, node)
	w.handle(nil, &peer.Down{Node: node, Session: pid, Reason: "model"})
}

func key(i int) messages.Key { return messages.Key{Namespace: "ns", Hash: string([]byte{byte(i)})} }

func (w *world) lookup() {
	w.corr++
	first, n := w.rng.IntN(12), 1+w.rng.IntN(5)
	keys := make([]messages.Key, n)
	for i := range keys {
		keys[i] = key((first + i) % 12)
	}
	var req *messages.ReqContext
	if w.rng.IntN(6) == 0 {
		req = &messages.ReqContext{PeerSources: []string{modelNodes[w.rng.IntN(3)]}}
	}
	w.asked[w.corr] = &tierCall{keys: keys}
	w.handle(w.asker, &tiermsg.Lookup{Corr: w.corr, Keys: keys, Req: req})
}

// read asks for keys lookups found (and now and then one they did not), as
// the tiering actor promotes them.
func (w *world) read() {
	if len(w.found) == 0 {
		return
	}
	var keys []messages.Key
	for range 1 + w.rng.IntN(4) {
		if w.rng.IntN(8) == 0 {
			keys = append(keys, key(100+w.rng.IntN(4)))
			continue
		}
		keys = append(keys, modeltime.Take(&w.found, w.rng.IntN(len(w.found))))
		if len(w.found) == 0 {
			break
		}
	}
	keys = distinct(keys)
	w.corr++
	c := &tierCall{keys: keys, read: true, fetches: map[uint64]bool{}}
	w.asked[w.corr] = c
	slots := make([]int, len(keys))
	for i := range slots {
		slots[i] = i
	}
	w.handling = c
	w.handle(w.asker, &tiermsg.ReadBatch{Corr: w.corr, Keys: keys, Slots: slots, Dests: make([][]byte, len(keys))})
	w.handling = nil
}

func distinct(keys []messages.Key) []messages.Key {
	seen := map[messages.Key]bool{}
	out := keys[:0]
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

func (w *world) probe() {
	reply := messages.NewReply[[]bool]()
	w.probes = append(w.probes, reply)
	w.handle(nil, &peermsg.Probe{Node: modelNodes[w.rng.IntN(3)], Keys: []messages.Key{key(w.rng.IntN(12))}, Reply: reply})
}

var errLink = errors.New("model: link failed")

// answerSession hands back a session's answer to the i-th unanswered call.
// A session that went down answers too, with an error (its rounds fail).
func (w *world) answerSession(i int) {
	if len(w.calls) == 0 {
		return
	}
	c := modeltime.Take(&w.calls, i)
	alive := w.up[c.node] == c.pid
	switch m := c.msg.(type) {
	case *peermsg.Lookup:
		w.nextRnd++
		r := &peermsg.LookupResult{Corr: m.Corr, Node: c.node, Round: w.nextRnd,
			Hits: make([]bool, len(m.Keys)), Checksums: make([]uint32, len(m.Keys))}
		if !alive || w.rng.IntN(10) == 0 {
			r.Err = messages.ErrPeerUnavailable
		} else {
			var hits []messages.Key
			for j, k := range m.Keys {
				if r.Hits[j] = w.rng.IntN(2) == 0; r.Hits[j] {
					hits = append(hits, k)
				}
			}
			if len(hits) > 0 {
				w.rounds[producerRound{pid: c.pid, round: r.Round}] = hits
			}
		}
		w.handle(c.pid, r)
	case *peermsg.Fetch:
		for _, call := range w.asked {
			delete(call.fetches, m.Corr)
		}
		r := &peermsg.FetchResult{Corr: m.Corr, Node: c.node, Round: m.Round, OK: make([]bool, len(m.Keys))}
		switch {
		case !alive || w.rng.IntN(8) == 0:
			r.Err = errLink
		default:
			for j := range r.OK {
				r.OK[j] = w.rng.IntN(6) != 0
			}
			if w.rng.IntN(10) == 0 {
				r.OK = r.OK[:w.rng.IntN(len(r.OK)+1)] // short: the rest failed
			}
		}
		w.handle(c.pid, r)
	}
}

func (w *world) fireTimer(settling bool) bool {
	msg, ok := w.timers.Fire(w.rng, settling)
	if ok {
		w.handle(nil, msg)
	}
	return ok
}

// settle answers every call and fires every deadline until nothing is in
// flight, then checks that the tier holds nothing.
func (w *world) settle() {
	for progress := true; progress; {
		progress = false
		for len(w.calls) > 0 {
			w.answerSession(w.rng.IntN(len(w.calls)))
			progress = true
		}
		if w.fireTimer(true) {
			progress = true
		}
	}
	for corr := range w.asked {
		require.Equal(w.t, 1, w.answered[corr], "call %d answered %d times", corr, w.answered[corr])
	}
	require.Empty(w.t, w.rounds, "producer rounds never given back")
	s := w.core
	require.Empty(w.t, s.lookups)
	require.Empty(w.t, s.fetches)
	require.Empty(w.t, s.rounds)
	require.Empty(w.t, s.held)
	require.Empty(w.t, s.probes)
	for _, r := range w.probes {
		require.Len(w.t, r.C(), 1, "a probe never answered")
	}
}

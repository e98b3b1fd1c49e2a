// Package p2p is the tier face of kvtier's peers: it answers the tiering
// actor's secondary-tier contract (tiers/contract.go) by asking the peer
// sessions (peer/) concurrently, taking the first peer that holds each key,
// and fetching a whole promotion from each peer in one round
// (tiermsg.ReadBatch).
//
// It owns which peer a key is fetched from and how long an unused lookup
// lease is held. It never touches sockets, the data plane or slot memory
// (the sessions and the transport do), and never the CPU tier's state.
//
// Its decisions live in State, a core driven one message at a time with
// its effects (requests to sessions, answers, timers, event watchers)
// handed to an Effects; Tier, the actor, is a shell that gives it its
// context, and model_test.go drives it through a seeded world instead.
package p2p

import (
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/internal/defaults"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer"
	"github.com/kvtier/kvtier/peer/peermsg"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/tiering/tieringmsg"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// Kind names the peer tier in the config and in TierFilter.
const Kind = "p2p"

// Config is what the P2P tier needs.
type Config struct {
	Name string // its name in stats and TierFilter ("peers" by default)
	// HoldTimeout is how long hits of a lookup stay leased at their
	// producer waiting for the promotion's fetch; then the round is
	// released (an Abort), not left to the producer's lease TTL.
	HoldTimeout time.Duration
	// LookupTimeout bounds the wait for every peer's answer to one lookup
	// (the sessions answer within their own round deadline; this is the
	// tier's own guard).
	LookupTimeout time.Duration
	// Directory asks, on a miss, only the peers whose KV events say they
	// hold one of its keys (directory.go), instead of every ready peer.
	// The peers' event addresses come from the plane (peer.EventsAt).
	Directory bool
	// Tiering is the tiering actor, told (tieringmsg.TierRefreshed) when a peer comes
	// up, so keys it cached as absent from the peers are asked again; nil:
	// not told.
	Tiering *actor.PID
	Clock   supervision.Clock
	Log     zerolog.Logger
}

// Defaults for Config's zero fields.
const (
	DefaultName          = "peers"
	DefaultHoldTimeout   = 5 * time.Second
	DefaultLookupTimeout = 2 * time.Second
)

// directoryMaxKeys bounds the keys the directory records per peer (24 MiB
// at most per peer); past it the peer's set is incomplete and it is asked
// as without a directory.
const directoryMaxKeys = 1 << 20

// WithDefaults fills zero (or negative) fields.
func (c Config) WithDefaults() Config {
	defaults.FillNonPositive(&c, Config{
		Name:          DefaultName,
		HoldTimeout:   DefaultHoldTimeout,
		LookupTimeout: DefaultLookupTimeout,
		Clock:         supervision.RealClock{},
	})
	return c
}

// State is the P2P tier's core: its decisions, driven one message at a
// time through Handle, with what it does outside itself (requests to the
// sessions, answers, timers, event watchers) handed to an Effects. Tier,
// the actor, is a shell around it; tests drive it directly.
//
// Invariants:
//   - every tiermsg.Lookup and tiermsg.ReadBatch is answered exactly once; a read
//     batch only after every session answered its fetch (so nothing
//     writes the slots any more);
//   - a key is held (leased at one producer, for one round) at most once;
//     every round with held keys is fetched, or released when its hold
//     timer fires or when no key of it is wanted: no producer lease is
//     left to its TTL by this side;
//   - peers are asked only while their session is ready (PeerUp..PeerDown);
//     with a directory, only those it names (or, when it names none, those
//     it cannot vouch for), unless the request names its sources;
//   - a peer's event watcher runs only while its session is up, and none
//     outlives the actor.
type State struct {
	cfg     Config
	peers   []peerRef // ready sessions, in the order they came up
	corr    uint64
	lookups map[uint64]asked  // peermsg.Lookup corr → its tiermsg.Lookup and the session asked
	fetches map[uint64]*fetch // peermsg.Fetch corr → its part of a read batch
	held    map[messages.Key]*hit
	rounds  map[roundID]*heldRound
	seq     uint64 // hold timer generations
	waiters []*peermsg.AwaitPeers
	probes  map[uint64]probeReq // peermsg.Lookup corr → probe
	dir     *directory          // nil without Config.Directory
	watch   *watchers
	stats   messages.SecondaryStats
}

type peerRef struct {
	node string
	pid  *actor.PID
}

// asked is one peermsg.Lookup in flight.
type asked struct {
	l   *lookup
	pid *actor.PID
}

type roundID struct {
	node  string
	round uint64
}

// lookup is one tiermsg.Lookup waiting for its peers.
type lookup struct {
	corr    uint64 // the tiering actor's
	asker   *actor.PID
	keys    []messages.Key
	found   []bool
	waiting int
	done    bool
	timer   supervision.Timer
}

// hit is a key leased at one producer for one round.
type hit struct {
	round    roundID
	pid      *actor.PID
	checksum uint32
	prov     *messages.Provenance // what the producer sent of the block's origin
}

// heldRound counts the keys a round still holds for us.
type heldRound struct {
	pid   *actor.PID
	keys  []messages.Key // keys held for us (some may have moved on)
	seq   uint64
	timer supervision.Timer
}

// read is one tiermsg.ReadBatch, fetched in one round per producer.
type read struct {
	corr    uint64
	asker   *actor.PID
	res     *tiermsg.ReadBatchResult
	waiting int
}

// fetch is one producer's part of a read.
type fetch struct {
	read  *read
	index []int // positions in the batch
	sums  []uint32
}

// Timer messages to self.
type (
	lookupDeadline struct{ corr uint64 }
	holdExpired    struct {
		round roundID
		seq   uint64
	}
)

// Effects is what the core does outside itself. Request's answer comes
// back as a message to Handle; Respond answers the message being handled,
// whose sender is Sender; After sends the actor msg once d has passed on
// its clock; Watch follows a peer's event stream (cfg) until cancel,
// sending what it reads back as eventBatch, replayDone and watchEnded
// messages marked with node and gen.
type Effects interface {
	Request(to *actor.PID, msg any)
	Send(to *actor.PID, msg any)
	Respond(msg any)
	Sender() *actor.PID
	After(d time.Duration, msg any) supervision.Timer
	Watch(node string, gen uint64, cfg events.SubscriberConfig) (cancel func())
}

// Tier is the P2P tier actor: a shell that hands each message to its
// State with the actor's context as the effects, and owns the watcher
// goroutines, waited for when it stops.
type Tier struct {
	state    *State
	watchers sync.WaitGroup
}

// Props returns the tier's props. Its state outlives a restart (the
// producer hands the supervisor the same Tier): the peers that are up, the
// rounds held at producers and, above all, the reads in flight, whose
// slots only the sessions' answers may free — a fresh incarnation would
// know none of them, strand those promotions and never hear PeerUp again.
// A panic is injected (chaos) or a bug: the state is as the last completed
// message left it, or as far as the failed one got.
func Props(cfg Config) *actor.Props {
	a := &Tier{state: NewState(cfg.WithDefaults())}
	return actor.PropsFromProducer(func() actor.Actor { return a }, actor.WithReceiverMiddleware(supervision.Faults))
}

// NewState is the core for cfg (defaults already filled).
func NewState(cfg Config) *State {
	t := &State{cfg: cfg, lookups: map[uint64]asked{}, fetches: map[uint64]*fetch{},
		held: map[messages.Key]*hit{}, rounds: map[roundID]*heldRound{}, probes: map[uint64]probeReq{},
		watch: newWatchers(), stats: messages.SecondaryStats{Name: cfg.Name, Kind: Kind, Blocks: -1}}
	if cfg.Directory {
		t.dir = newDirectory(directoryMaxKeys)
	}
	return t
}

// Receive hands every message but the lifecycle's to the core; stopped,
// it cancels the event watchers and waits for them: none outlives it.
func (a *Tier) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Stopped:
		a.state.stopAllWatches()
		a.watchers.Wait()
		return
	case *actor.Started, *actor.Restarting, *actor.Stopping, *actor.Restart:
		return
	}
	a.state.Handle(contextEffects{ctx: ctx, clock: a.state.cfg.Clock, watchers: &a.watchers}, ctx.Message())
}

// Handle handles one message.
func (t *State) Handle(fx Effects, msg any) {
	switch m := msg.(type) {
	case *peer.Up:
		t.up(m)
		t.startWatch(fx, m.Node) // NB: a new session may be a restarted peer: its stream starts over
		if t.cfg.Tiering != nil {
			fx.Send(t.cfg.Tiering, &tieringmsg.TierRefreshed{Tier: t.cfg.Name})
		}
		t.wake()
	case *peermsg.AwaitPeers:
		t.waiters = append(t.waiters, m)
		t.wake()
	case *peer.Down:
		t.down(m)
	case *peer.EventsAt:
		t.setAddrs(fx, m)
	case *eventBatch:
		t.onEventBatch(m)
	case *replayDone:
		t.onReplayDone(m)
	case *watchEnded:
		t.onWatchEnded(fx, m)
	case *rewatch:
		t.onRewatch(fx, m)
	case *tiermsg.Lookup:
		t.lookup(fx, m)
	case *peermsg.LookupResult:
		if p, ok := t.probes[m.Corr]; ok {
			t.onProbe(fx, m, p)
			return
		}
		t.onLookup(fx, m)
	case *peermsg.Probe:
		t.probe(fx, m)
	case *lookupDeadline:
		if l := t.pendingLookup(m.corr); l != nil {
			t.answerLookup(fx, l)
		}
	case *holdExpired:
		if h := t.rounds[m.round]; h != nil && h.seq == m.seq {
			t.releaseRound(fx, m.round)
		}
	case *tiermsg.ReadBatch:
		t.read(fx, m)
	case *peermsg.FetchResult:
		t.onFetch(fx, m)
	case *tiermsg.Read:
		// Only batched reads are served: a promotion from peers is a round.
		fx.Respond(&tiermsg.ReadResult{Corr: m.Corr, Key: m.Key, Err: fmt.Errorf("%w: p2p tier reads in batches", messages.ErrTierUnavailable)})
	case *tiermsg.Write:
		// Peers are never a cascade target: they hold their own engines' blocks.
		fx.Respond(&tiermsg.WriteResult{Corr: m.Corr, Key: m.Key, Err: fmt.Errorf("%w: p2p tier takes no writes", messages.ErrTierUnavailable)})
	case *tiermsg.Delete:
		// A bad copy came from a peer's pool; nothing of ours to delete.
	case *tiermsg.StatsQuery:
		st := t.stats
		st.Healthy = len(t.peers) > 0
		st.InFlight = len(t.lookups) + len(t.fetches)
		if t.dir != nil {
			st.DirectoryKeys, st.DirectoryBytes = t.dir.size()
		}
		fx.Respond(&tiermsg.StatsReply{Corr: m.Corr, Stats: st})
	}
}

func (t *State) up(m *peer.Up) {
	for i, p := range t.peers {
		if p.node == m.Node {
			t.peers[i].pid = m.Session
			return
		}
	}
	t.peers = append(t.peers, peerRef{node: m.Node, pid: m.Session})
}

// wake answers the peermsg.AwaitPeers whose nodes are all ready.
func (t *State) wake() {
	kept := t.waiters[:0]
	for _, w := range t.waiters {
		if t.allUp(w.Nodes) {
			w.Reply.Answer(struct{}{}, nil)
		} else {
			kept = append(kept, w)
		}
	}
	t.waiters = kept
}

func (t *State) allUp(nodes []string) bool {
	for _, n := range nodes {
		if !t.isUp(n) {
			return false
		}
	}
	return true
}

func (t *State) isUp(node string) bool {
	for _, p := range t.peers {
		if p.node == node {
			return true
		}
	}
	return false
}

func (t *State) down(m *peer.Down) {
	for i, p := range t.peers {
		if p.node == m.Node {
			t.peers = append(t.peers[:i], t.peers[i+1:]...)
			break
		}
	}
	t.stopWatch(m.Node)
	if t.dir != nil {
		t.dir.forget(m.Node)
	}
	t.cfg.Log.Info().Str("peer", m.Node).Str("reason", m.Reason).Msg("p2p: peer left")
}

// --- lookup -----------------------------------------------------------------

// lookup asks the peers that may hold the keys (every ready one, or those
// the directory names) at once; a key is found at the first peer whose
// answer has it.
func (t *State) lookup(fx Effects, m *tiermsg.Lookup) {
	t.stats.Lookups += uint64(len(m.Keys))
	t.stats.LookupCalls++
	l := &lookup{corr: m.Corr, asker: fx.Sender(), keys: m.Keys, found: make([]bool, len(m.Keys))}
	peers := t.eligible(m.Req)
	if t.dir != nil && (m.Req == nil || len(m.Req.PeerSources) == 0) {
		peers = t.dir.holders(peers, m.Keys)
	}
	t.stats.PeerAsks += uint64(len(peers))
	if len(peers) == 0 || len(m.Keys) == 0 {
		fx.Respond(&tiermsg.LookupResult{Corr: m.Corr, Found: l.found})
		return
	}
	l.waiting = len(peers)
	for _, p := range peers {
		t.corr++
		t.lookups[t.corr] = asked{l: l, pid: p.pid}
		fx.Request(p.pid, &peermsg.Lookup{Corr: t.corr, Keys: m.Keys})
	}
	l.timer = fx.After(t.cfg.LookupTimeout, &lookupDeadline{corr: t.corr})
}

// eligible are the ready peers req may fetch from (its PeerSources, or all).
func (t *State) eligible(req *messages.ReqContext) []peerRef {
	if req == nil || len(req.PeerSources) == 0 {
		return t.peers
	}
	var out []peerRef
	for _, p := range t.peers {
		for _, s := range req.PeerSources {
			if s == p.node {
				out = append(out, p)
			}
		}
	}
	return out
}

func (t *State) pendingLookup(corr uint64) *lookup {
	a, ok := t.lookups[corr]
	if !ok || a.l.done {
		return nil
	}
	return a.l
}

func (t *State) onLookup(fx Effects, m *peermsg.LookupResult) {
	a, ok := t.lookups[m.Corr]
	if !ok {
		return
	}
	delete(t.lookups, m.Corr)
	l := a.l
	rid := roundID{node: m.Node, round: m.Round}
	var used []messages.Key
	if !l.done && m.Err == nil {
		for i, h := range m.Hits {
			if !h || i >= len(l.keys) || l.found[i] || t.held[l.keys[i]] != nil {
				continue
			}
			l.found[i] = true
			h := &hit{round: rid, pid: a.pid, checksum: m.Checksums[i]}
			if i < len(m.Prov) {
				h.prov = m.Prov[i]
			}
			t.held[l.keys[i]] = h
			used = append(used, l.keys[i])
		}
	}
	if len(used) > 0 {
		t.seq++
		h := &heldRound{pid: a.pid, keys: used, seq: t.seq}
		h.timer = fx.After(t.cfg.HoldTimeout, &holdExpired{round: rid, seq: t.seq})
		t.rounds[rid] = h
	} else if m.Err == nil && anyHit(m.Hits) {
		// Hits nobody wants (another peer was first, or too late): free them now.
		fx.Send(a.pid, &peermsg.Release{Round: m.Round})
	}
	if l.done {
		return
	}
	l.waiting--
	if l.waiting == 0 || allTrue(l.found) {
		t.answerLookup(fx, l)
	}
}

func (t *State) answerLookup(fx Effects, l *lookup) {
	l.done = true
	if l.timer != nil {
		l.timer.Stop()
	}
	n := 0
	for _, f := range l.found {
		if f {
			n++
		}
	}
	t.stats.Found += uint64(n)
	t.send(fx, l.asker, &tiermsg.LookupResult{Corr: l.corr, Found: l.found})
	// NB: entries of peers yet to answer stay until their answer (every
	// session answers every round, within its round deadline); onLookup
	// then releases their hits.
}

func (t *State) send(fx Effects, to *actor.PID, msg any) {
	if to != nil {
		fx.Send(to, msg)
	}
}

// releaseRound gives a held round back to its producer.
func (t *State) releaseRound(fx Effects, rid roundID) {
	h := t.rounds[rid]
	if h == nil {
		return
	}
	t.forget(rid, h)
	fx.Send(h.pid, &peermsg.Release{Round: rid.round})
}

// forget drops a held round and its keys: O(the round's keys).
func (t *State) forget(rid roundID, h *heldRound) {
	h.timer.Stop()
	delete(t.rounds, rid)
	for _, k := range h.keys {
		if x := t.held[k]; x != nil && x.round == rid {
			delete(t.held, k)
		}
	}
}

// --- read ---------------------------------------------------------------------

// read fetches a promotion: one peermsg.Fetch per producer round.
func (t *State) read(fx Effects, m *tiermsg.ReadBatch) {
	n := len(m.Keys)
	r := &read{corr: m.Corr, asker: fx.Sender(), res: &tiermsg.ReadBatchResult{Corr: m.Corr,
		Checksums: make([]uint32, n), Errs: make([]error, n), Source: make([]string, n), Prov: make([]*messages.Provenance, n)}}
	type part struct {
		pid   *actor.PID
		f     *fetch
		keys  []messages.Key
		slots []int
	}
	parts := map[roundID]*part{}
	var order []roundID
	for i, k := range m.Keys {
		h := t.held[k]
		if h == nil || i >= len(m.Slots) {
			r.res.Errs[i] = fmt.Errorf("%w: %s", messages.ErrLeaseLost, k)
			continue
		}
		p := parts[h.round]
		if p == nil {
			p = &part{pid: h.pid, f: &fetch{read: r}}
			parts[h.round] = p
			order = append(order, h.round)
		}
		p.keys, p.slots = append(p.keys, k), append(p.slots, m.Slots[i])
		p.f.index, p.f.sums = append(p.f.index, i), append(p.f.sums, h.checksum)
		r.res.Source[i] = h.round.node
		r.res.Prov[i] = h.prov
	}
	for _, rid := range order {
		p := parts[rid]
		// The round is consumed by this fetch: its other keys are released by
		// the producer when the fetch ends.
		if h := t.rounds[rid]; h != nil {
			t.forget(rid, h)
		}
		t.corr++
		t.fetches[t.corr] = p.f
		r.waiting++
		fx.Request(p.pid, &peermsg.Fetch{Corr: t.corr, Round: rid.round, Keys: p.keys, Slots: p.slots, Checksums: p.f.sums})
	}
	if r.waiting == 0 {
		t.answerRead(fx, r)
	}
}

func (t *State) onFetch(fx Effects, m *peermsg.FetchResult) {
	f := t.fetches[m.Corr]
	if f == nil {
		return
	}
	delete(t.fetches, m.Corr)
	r := f.read
	for j, i := range f.index {
		switch {
		case m.Err != nil:
			r.res.Errs[i] = fmt.Errorf("%w (peer %s)", m.Err, m.Node)
		case j >= len(m.OK) || !m.OK[j]:
			r.res.Errs[i] = fmt.Errorf("%w: checksum mismatch from peer %s", messages.ErrInvalidBlock, m.Node)
		default:
			r.res.Checksums[i] = f.sums[j]
		}
	}
	r.waiting--
	if r.waiting == 0 {
		t.answerRead(fx, r)
	}
}

func (t *State) answerRead(fx Effects, r *read) {
	for _, err := range r.res.Errs {
		if err == nil {
			t.stats.Reads++
		} else {
			t.stats.ReadFailures++
		}
	}
	t.send(fx, r.asker, r.res)
}

func anyHit(hits []bool) bool {
	for _, h := range hits {
		if h {
			return true
		}
	}
	return false
}

func allTrue(bs []bool) bool {
	for _, b := range bs {
		if !b {
			return false
		}
	}
	return true
}

// probe asks one peer directly (peermsg.Probe).
func (t *State) probe(fx Effects, m *peermsg.Probe) {
	for _, p := range t.peers {
		if p.node == m.Node {
			t.corr++
			t.probes[t.corr] = probeReq{m: m, pid: p.pid}
			fx.Request(p.pid, &peermsg.Lookup{Corr: t.corr, Keys: m.Keys})
			return
		}
	}
	m.Reply.Answer(nil, fmt.Errorf("%w: %s", messages.ErrPeerUnavailable, m.Node))
}

// probeReq is a peermsg.Probe in flight and the session it asked.
type probeReq struct {
	m   *peermsg.Probe
	pid *actor.PID
}

func (t *State) onProbe(fx Effects, m *peermsg.LookupResult, p probeReq) {
	delete(t.probes, m.Corr)
	if m.Err == nil && anyHit(m.Hits) {
		fx.Send(p.pid, &peermsg.Release{Round: m.Round})
	}
	p.m.Reply.Answer(m.Hits, m.Err)
}

package p2p

import (
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/actors/fx"
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
	// up, so keys it cached as absent from the peers are asked again; the
	// zero Ref: not told.
	Tiering fx.Ref
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
// time through Handle, which writes what it decided (requests to the
// sessions, answers, deadlines, event watchers to start and stop) into an
// Out. Tier, the actor, is a shell that carries the Out out; tests drive
// the core directly and read its Outs.
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
	ref  fx.Ref // its session
}

// asked is one peermsg.Lookup in flight.
type asked struct {
	l   *lookup
	ref fx.Ref // the session asked
}

type roundID struct {
	node  string
	round uint64
}

// lookup is one tiermsg.Lookup waiting for its peers.
type lookup struct {
	corr    uint64 // the tiering actor's
	asker   fx.Ref
	keys    []messages.Key
	found   []bool
	waiting int
	done    bool
	timer   *fx.Deadline
}

// hit is a key leased at one producer for one round.
type hit struct {
	round    roundID
	ref      fx.Ref // the producer's session
	checksum uint32
	size     int                  // the block's length; 0: a whole slot
	prov     *messages.Provenance // what the producer sent of the block's origin
}

// heldRound counts the keys a round still holds for us.
type heldRound struct {
	ref   fx.Ref         // the producer's session
	keys  []messages.Key // keys held for us (some may have moved on)
	seq   uint64
	timer *fx.Deadline
}

// read is one tiermsg.ReadBatch, fetched in one round per producer.
type read struct {
	corr    uint64
	asker   fx.Ref
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

// Out is what the core decided while handling one message: its messages
// and deadlines (fx.Out) and the peers' event watchers to stop and start,
// which the shell runs and holds (a watcher follows a peer's event
// stream, sending what it reads back as eventBatch, replayDone and
// watchEnded messages marked with its node and gen). The shell stops
// before it starts: a watcher stopped in the Out that would start it is
// never started (unwatch), so every stop names one already running.
type Out struct {
	fx.Out
	Watches   []watchStart // watchers to start, in order
	Unwatches []watchKey   // watchers started by an earlier Out, to stop
}

// Reset empties o for the next message.
func (o *Out) Reset() {
	o.Out.Reset()
	clear(o.Watches)
	clear(o.Unwatches)
	o.Watches, o.Unwatches = o.Watches[:0], o.Unwatches[:0]
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

// Handle handles one message, sent by from (the zero Ref: by nobody that
// waits for an answer).
func (t *State) Handle(o *Out, from fx.Ref, msg any) {
	switch m := msg.(type) {
	case *peer.Up:
		t.up(m)
		t.startWatch(o, m.Node) // NB: a new session may be a restarted peer: its stream starts over
		if !t.cfg.Tiering.IsZero() {
			o.Send(t.cfg.Tiering, &tieringmsg.TierRefreshed{Tier: t.cfg.Name})
		}
		t.wake(o)
	case *peermsg.AwaitPeers:
		t.waiters = append(t.waiters, m)
		t.wake(o)
	case *peer.Down:
		t.down(o, m)
	case *peer.EventsAt:
		t.setAddrs(o, m)
	case *eventBatch:
		t.onEventBatch(m)
	case *replayDone:
		t.onReplayDone(m)
	case *watchEnded:
		t.onWatchEnded(o, m)
	case *rewatch:
		t.onRewatch(o, m)
	case *tiermsg.Lookup:
		t.lookup(o, from, m)
	case *peermsg.LookupResult:
		if p, ok := t.probes[m.Corr]; ok {
			t.onProbe(o, m, p)
			return
		}
		t.onLookup(o, m)
	case *peermsg.Probe:
		t.probe(o, m)
	case *lookupDeadline:
		if l := t.pendingLookup(m.corr); l != nil {
			t.answerLookup(o, l)
		}
	case *holdExpired:
		if h := t.rounds[m.round]; h != nil && h.seq == m.seq {
			t.releaseRound(o, m.round)
		}
	case *tiermsg.ReadBatch:
		t.read(o, from, m)
	case *peermsg.FetchResult:
		t.onFetch(o, m)
	case *tiermsg.Read:
		// Only batched reads are served: a promotion from peers is a round.
		o.Respond(&tiermsg.ReadResult{Corr: m.Corr, Key: m.Key, Err: fmt.Errorf("%w: p2p tier reads in batches", messages.ErrTierUnavailable)})
	case *tiermsg.Write:
		// Peers are never a cascade target: they hold their own engines' blocks.
		o.Respond(&tiermsg.WriteResult{Corr: m.Corr, Key: m.Key, Err: fmt.Errorf("%w: p2p tier takes no writes", messages.ErrTierUnavailable)})
	case *tiermsg.Delete:
		// A bad copy came from a peer's pool; nothing of ours to delete.
	case *tiermsg.StatsQuery:
		st := t.stats
		st.Healthy = len(t.peers) > 0
		st.InFlight = len(t.lookups) + len(t.fetches)
		if t.dir != nil {
			st.DirectoryKeys, st.DirectoryBytes = t.dir.size()
		}
		o.Respond(&tiermsg.StatsReply{Corr: m.Corr, Stats: st})
	}
}

func (t *State) up(m *peer.Up) {
	for i, p := range t.peers {
		if p.node == m.Node {
			t.peers[i].ref = fx.RefOf(m.Session)
			return
		}
	}
	t.peers = append(t.peers, peerRef{node: m.Node, ref: fx.RefOf(m.Session)})
}

// wake answers the peermsg.AwaitPeers whose nodes are all ready.
func (t *State) wake(o *Out) {
	kept := t.waiters[:0]
	for _, w := range t.waiters {
		if t.allUp(w.Nodes) {
			reply(&o.Out, w.Reply, struct{}{}, nil)
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

func (t *State) down(o *Out, m *peer.Down) {
	for i, p := range t.peers {
		if p.node == m.Node {
			t.peers = append(t.peers[:i], t.peers[i+1:]...)
			break
		}
	}
	t.stopWatch(o, m.Node)
	if t.dir != nil {
		t.dir.forget(m.Node)
	}
	t.cfg.Log.Info().Str("peer", m.Node).Str("reason", m.Reason).Msg("p2p: peer left")
}

// --- lookup -----------------------------------------------------------------

// lookup asks the peers that may hold the keys (every ready one, or those
// the directory names) at once; a key is found at the first peer whose
// answer has it.
func (t *State) lookup(o *Out, from fx.Ref, m *tiermsg.Lookup) {
	t.stats.Lookups += uint64(len(m.Keys))
	t.stats.LookupCalls++
	l := &lookup{corr: m.Corr, asker: from, keys: m.Keys, found: make([]bool, len(m.Keys))}
	peers := t.eligible(m.Req)
	if t.dir != nil && (m.Req == nil || len(m.Req.PeerSources) == 0) {
		peers = t.dir.holders(peers, m.Keys)
	}
	t.stats.PeerAsks += uint64(len(peers))
	if len(peers) == 0 || len(m.Keys) == 0 {
		o.Respond(&tiermsg.LookupResult{Corr: m.Corr, Found: l.found})
		return
	}
	l.waiting = len(peers)
	for _, p := range peers {
		t.corr++
		t.lookups[t.corr] = asked{l: l, ref: p.ref}
		o.Request(p.ref, &peermsg.Lookup{Corr: t.corr, Keys: m.Keys})
	}
	l.timer = o.After(t.cfg.LookupTimeout, &lookupDeadline{corr: t.corr})
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

func (t *State) onLookup(o *Out, m *peermsg.LookupResult) {
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
			h := &hit{round: rid, ref: a.ref, checksum: m.Checksums[i]}
			if i < len(m.Prov) {
				h.prov = m.Prov[i]
			}
			if i < len(m.Sizes) {
				h.size = m.Sizes[i]
			}
			t.held[l.keys[i]] = h
			used = append(used, l.keys[i])
		}
	}
	if len(used) > 0 {
		t.seq++
		h := &heldRound{ref: a.ref, keys: used, seq: t.seq}
		h.timer = o.After(t.cfg.HoldTimeout, &holdExpired{round: rid, seq: t.seq})
		t.rounds[rid] = h
	} else if m.Err == nil && anyHit(m.Hits) {
		// Hits nobody wants (another peer was first, or too late): free them now.
		o.Send(a.ref, &peermsg.Release{Round: m.Round})
	}
	if l.done {
		return
	}
	l.waiting--
	if l.waiting == 0 || allTrue(l.found) {
		t.answerLookup(o, l)
	}
}

func (t *State) answerLookup(o *Out, l *lookup) {
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
	o.Send(l.asker, &tiermsg.LookupResult{Corr: l.corr, Found: l.found}) // NB: an asker that is gone is the zero Ref: dropped
	// NB: entries of peers yet to answer stay until their answer (every
	// session answers every round, within its round deadline); onLookup
	// then releases their hits.
}

// releaseRound gives a held round back to its producer.
func (t *State) releaseRound(o *Out, rid roundID) {
	h := t.rounds[rid]
	if h == nil {
		return
	}
	t.forget(rid, h)
	o.Send(h.ref, &peermsg.Release{Round: rid.round})
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
func (t *State) read(o *Out, from fx.Ref, m *tiermsg.ReadBatch) {
	n := len(m.Keys)
	r := &read{corr: m.Corr, asker: from, res: &tiermsg.ReadBatchResult{Corr: m.Corr,
		Checksums: make([]uint32, n), Errs: make([]error, n), Source: make([]string, n), Prov: make([]*messages.Provenance, n)}}
	type part struct {
		ref   fx.Ref
		f     *fetch
		keys  []messages.Key
		slots []int
		sizes []int // nil while every block is a whole slot
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
			p = &part{ref: h.ref, f: &fetch{read: r}}
			parts[h.round] = p
			order = append(order, h.round)
		}
		if h.size != 0 && p.sizes == nil {
			p.sizes = make([]int, len(p.keys), len(p.keys)+1) // NB: 0 is a whole slot; the session resolves it
		}
		if p.sizes != nil {
			p.sizes = append(p.sizes, h.size)
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
		o.Request(p.ref, &peermsg.Fetch{Corr: t.corr, Round: rid.round, Keys: p.keys, Slots: p.slots, Checksums: p.f.sums, Sizes: p.sizes})
	}
	if r.waiting == 0 {
		t.answerRead(o, r)
	}
}

func (t *State) onFetch(o *Out, m *peermsg.FetchResult) {
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
		t.answerRead(o, r)
	}
}

func (t *State) answerRead(o *Out, r *read) {
	for _, err := range r.res.Errs {
		if err == nil {
			t.stats.Reads++
		} else {
			t.stats.ReadFailures++
		}
	}
	o.Send(r.asker, r.res) // NB: an asker that is gone is the zero Ref: dropped
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
func (t *State) probe(o *Out, m *peermsg.Probe) {
	for _, p := range t.peers {
		if p.node == m.Node {
			t.corr++
			t.probes[t.corr] = probeReq{m: m, ref: p.ref}
			o.Request(p.ref, &peermsg.Lookup{Corr: t.corr, Keys: m.Keys})
			return
		}
	}
	reply(&o.Out, m.Reply, nil, fmt.Errorf("%w: %s", messages.ErrPeerUnavailable, m.Node))
}

// probeReq is a peermsg.Probe in flight and the session it asked.
type probeReq struct {
	m   *peermsg.Probe
	ref fx.Ref
}

func (t *State) onProbe(o *Out, m *peermsg.LookupResult, p probeReq) {
	delete(t.probes, m.Corr)
	if m.Err == nil && anyHit(m.Hits) {
		o.Send(p.ref, &peermsg.Release{Round: m.Round})
	}
	reply(&o.Out, p.m.Reply, m.Hits, m.Err)
}

// reply answers a call the core held, through o: in order with the
// messages decided before it.
func reply[T any](o *fx.Out, r messages.Reply[T], v T, err error) { o.Answer(r, v, err) }

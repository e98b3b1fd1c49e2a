package p2p

// Following the peers' KV event streams for the directory; the plane says
// where each peer publishes (peer.EventsAt). A watcher is a
// goroutine that subscribes to one peer's PUB socket (replaying from the
// first buffered batch) and sends each batch to the tier as a message; the
// tier applies it to the directory inside Receive. A watcher runs while its
// peer's session is up and its event addresses are known; it is canceled
// when the session goes down, and restarted after a back-off when its
// stream fails.
//
// The core decides which watchers run (an Out's Watches and Unwatches); the
// shell (actor.go) runs them and holds their cancel funcs.

import (
	"time"

	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/peer"
)

// watchRetry is how long a failed stream waits before it is subscribed to
// again.
const watchRetry = time.Second

// Watcher messages to self; gen tells a current watcher's from an old one's.
type (
	eventBatch struct {
		node        string
		gen         uint64
		seq, missed uint64
		batch       *events.Batch
	}
	replayDone struct {
		node      string
		gen       uint64
		delivered int
	}
	watchEnded struct {
		node string
		gen  uint64
		err  error
	}
	rewatch struct {
		node string
		gen  uint64
	}
)

// watchers are the watchers the core has started and not stopped.
type watchers struct {
	addrs   map[string]peer.EventsAt
	running map[string]uint64 // node → its watcher's gen
	gen     uint64
}

func newWatchers() *watchers {
	return &watchers{addrs: map[string]peer.EventsAt{}, running: map[string]uint64{}}
}

// watchKey names one watcher: a peer's, of one generation.
type watchKey struct {
	node string
	gen  uint64
}

// watchStart is a watcher to start: it follows the stream cfg names.
type watchStart struct {
	watchKey
	cfg events.SubscriberConfig
}

// watch starts the watcher k following cfg.
func (o *Out) watch(k watchKey, cfg events.SubscriberConfig) {
	o.Watches = append(o.Watches, watchStart{k, cfg})
}

// unwatch stops the watcher k; one this Out would start is not started.
func (o *Out) unwatch(k watchKey) {
	for i, w := range o.Watches {
		if w.watchKey == k {
			o.Watches = append(o.Watches[:i], o.Watches[i+1:]...)
			return
		}
	}
	o.Unwatches = append(o.Unwatches, k)
}

// setAddrs records where node publishes; it restarts a running watcher.
func (t *State) setAddrs(o *Out, m *peer.EventsAt) {
	t.watch.addrs[m.Node] = *m
	if t.isUp(m.Node) {
		t.startWatch(o, m.Node)
	}
}

// startWatch (re)starts node's watcher and its directory set.
func (t *State) startWatch(o *Out, node string) {
	w := t.watch
	addr, ok := w.addrs[node]
	if !ok || t.dir == nil {
		return
	}
	t.stopWatch(o, node)
	t.dir.watch(node)
	w.gen++
	cfg := events.SubscriberConfig{Endpoint: addr.Endpoint, Replay: addr.Replay, ReplayFrom: -1}
	if addr.Replay != "" {
		cfg.ReplayFrom = 0
	}
	w.running[node] = w.gen
	o.watch(watchKey{node: node, gen: w.gen}, cfg)
}

// stopWatch cancels node's watcher, if any (it exits on its own).
func (t *State) stopWatch(o *Out, node string) {
	if gen, ok := t.watch.running[node]; ok {
		o.unwatch(watchKey{node: node, gen: gen})
		delete(t.watch.running, node)
	}
}

func (t *State) current(node string, gen uint64) bool {
	g, ok := t.watch.running[node]
	return ok && g == gen
}

func (t *State) onEventBatch(m *eventBatch) {
	if t.current(m.node, m.gen) {
		t.dir.apply(m.node, m.seq, m.missed, m.batch)
	}
}

// onReplayDone: a replay from the first batch that found none means the
// peer has published nothing yet: its (empty) set is complete.
func (t *State) onReplayDone(m *replayDone) {
	if t.current(m.node, m.gen) && m.delivered == 0 {
		t.dir.empty(m.node)
	}
}

// onWatchEnded: the stream failed (the peer's publisher went away, or sent
// what could not be decoded). The set is kept but marked incomplete, and
// the watcher is started again, with a fresh set, after a back-off.
func (t *State) onWatchEnded(o *Out, m *watchEnded) {
	if !t.current(m.node, m.gen) {
		return
	}
	t.cfg.Log.Warn().Err(m.err).Str("peer", m.node).Msg("p2p: peer's event stream ended; directory entry incomplete until it is read again")
	if p := t.dir.peers[m.node]; p != nil {
		p.complete = false
	}
	o.After(watchRetry, &rewatch{node: m.node, gen: m.gen})
}

func (t *State) onRewatch(o *Out, m *rewatch) {
	if t.current(m.node, m.gen) && t.isUp(m.node) {
		t.startWatch(o, m.node)
	}
}

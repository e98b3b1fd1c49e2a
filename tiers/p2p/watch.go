package p2p

// Following the peers' KV event streams for the directory; the plane says
// where each peer publishes (peer.EventsAt). A watcher is a
// goroutine that subscribes to one peer's PUB socket (replaying from the
// first buffered batch) and sends each batch to the tier as a message; the
// tier applies it to the directory inside Receive. A watcher runs while its
// peer's session is up and its event addresses are known; it is canceled
// when the session goes down, and restarted after a back-off when its
// stream fails.

import (
	"context"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

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

// watchers are the running watcher goroutines.
type watchers struct {
	addrs   map[string]peer.EventsAt
	running map[string]*watcher
	gen     uint64
	wg      sync.WaitGroup
}

type watcher struct {
	gen    uint64
	cancel context.CancelFunc
}

func newWatchers() *watchers {
	return &watchers{addrs: map[string]peer.EventsAt{}, running: map[string]*watcher{}}
}

// setAddrs records where node publishes; it restarts a running watcher.
func (t *Tier) setAddrs(ctx actor.Context, m *peer.EventsAt) {
	t.watch.addrs[m.Node] = *m
	if t.isUp(m.Node) {
		t.startWatch(ctx, m.Node)
	}
}

// startWatch (re)starts node's watcher and its directory set.
func (t *Tier) startWatch(ctx actor.Context, node string) {
	w := t.watch
	addr, ok := w.addrs[node]
	if !ok || t.dir == nil {
		return
	}
	t.stopWatch(node)
	t.dir.watch(node)
	w.gen++
	sub, cancel := context.WithCancel(context.Background())
	w.running[node] = &watcher{gen: w.gen, cancel: cancel}
	self, root, gen := ctx.Self(), ctx.ActorSystem().Root, w.gen
	cfg := events.SubscriberConfig{Endpoint: addr.Endpoint, Replay: addr.Replay, ReplayFrom: -1}
	if addr.Replay != "" {
		cfg.ReplayFrom = 0
		cfg.Replayed = func(delivered int) { root.Send(self, &replayDone{node: node, gen: gen, delivered: delivered}) }
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		err := events.Subscribe(sub, cfg, func(d events.Delivery) error {
			root.Send(self, &eventBatch{node: node, gen: gen, seq: d.Seq, missed: d.Missed, batch: d.Batch})
			return nil
		})
		if sub.Err() == nil {
			root.Send(self, &watchEnded{node: node, gen: gen, err: err})
		}
	}()
}

// stopWatch cancels node's watcher, if any (it exits on its own).
func (t *Tier) stopWatch(node string) {
	if r := t.watch.running[node]; r != nil {
		r.cancel()
		delete(t.watch.running, node)
	}
}

func (t *Tier) current(node string, gen uint64) bool {
	r := t.watch.running[node]
	return r != nil && r.gen == gen
}

func (t *Tier) onEventBatch(m *eventBatch) {
	if t.current(m.node, m.gen) {
		t.dir.apply(m.node, m.seq, m.missed, m.batch)
	}
}

// onReplayDone: a replay from the first batch that found none means the
// peer has published nothing yet: its (empty) set is complete.
func (t *Tier) onReplayDone(m *replayDone) {
	if t.current(m.node, m.gen) && m.delivered == 0 {
		t.dir.empty(m.node)
	}
}

// onWatchEnded: the stream failed (the peer's publisher went away, or sent
// what could not be decoded). The set is kept but marked incomplete, and
// the watcher is started again, with a fresh set, after a back-off.
func (t *Tier) onWatchEnded(ctx actor.Context, m *watchEnded) {
	if !t.current(m.node, m.gen) {
		return
	}
	t.cfg.Log.Warn().Err(m.err).Str("peer", m.node).Msg("p2p: peer's event stream ended; directory entry incomplete until it is read again")
	if p := t.dir.peers[m.node]; p != nil {
		p.complete = false
	}
	self, root := ctx.Self(), ctx.ActorSystem().Root
	node, gen := m.node, m.gen
	t.cfg.Clock.AfterFunc(watchRetry, func() { root.Send(self, &rewatch{node: node, gen: gen}) })
}

func (t *Tier) onRewatch(ctx actor.Context, m *rewatch) {
	if t.current(m.node, m.gen) && t.isUp(m.node) {
		t.startWatch(ctx, m.node)
	}
}

// stopAllWatches cancels every watcher and waits for them: the tier is
// stopping, and no goroutine may outlive it.
func (t *Tier) stopAllWatches() {
	for node := range t.watch.running {
		t.stopWatch(node)
	}
	t.watch.wg.Wait()
}

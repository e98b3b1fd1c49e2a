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
	"github.com/kvtier/kvtier/supervision"
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
}

type watcher struct {
	gen    uint64
	cancel func()
}

func newWatchers() *watchers {
	return &watchers{addrs: map[string]peer.EventsAt{}, running: map[string]*watcher{}}
}

// setAddrs records where node publishes; it restarts a running watcher.
func (t *State) setAddrs(fx Effects, m *peer.EventsAt) {
	t.watch.addrs[m.Node] = *m
	if t.isUp(m.Node) {
		t.startWatch(fx, m.Node)
	}
}

// startWatch (re)starts node's watcher and its directory set.
func (t *State) startWatch(fx Effects, node string) {
	w := t.watch
	addr, ok := w.addrs[node]
	if !ok || t.dir == nil {
		return
	}
	t.stopWatch(node)
	t.dir.watch(node)
	w.gen++
	cfg := events.SubscriberConfig{Endpoint: addr.Endpoint, Replay: addr.Replay, ReplayFrom: -1}
	if addr.Replay != "" {
		cfg.ReplayFrom = 0
	}
	w.running[node] = &watcher{gen: w.gen, cancel: fx.Watch(node, w.gen, cfg)}
}

// stopWatch cancels node's watcher, if any (it exits on its own).
func (t *State) stopWatch(node string) {
	if r := t.watch.running[node]; r != nil {
		r.cancel()
		delete(t.watch.running, node)
	}
}

func (t *State) current(node string, gen uint64) bool {
	r := t.watch.running[node]
	return r != nil && r.gen == gen
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
func (t *State) onWatchEnded(fx Effects, m *watchEnded) {
	if !t.current(m.node, m.gen) {
		return
	}
	t.cfg.Log.Warn().Err(m.err).Str("peer", m.node).Msg("p2p: peer's event stream ended; directory entry incomplete until it is read again")
	if p := t.dir.peers[m.node]; p != nil {
		p.complete = false
	}
	fx.After(watchRetry, &rewatch{node: m.node, gen: m.gen})
}

func (t *State) onRewatch(fx Effects, m *rewatch) {
	if t.current(m.node, m.gen) && t.isUp(m.node) {
		t.startWatch(fx, m.node)
	}
}

// stopAllWatches cancels every watcher: the tier is stopping (the shell
// waits for them to end).
func (t *State) stopAllWatches() {
	for node := range t.watch.running {
		t.stopWatch(node)
	}
}

// contextEffects carries out the core's effects through an actor context;
// its watcher goroutines are counted in watchers.
type contextEffects struct {
	ctx      actor.Context
	clock    supervision.Clock
	watchers *sync.WaitGroup
}

func (e contextEffects) Request(to *actor.PID, msg any) { e.ctx.Request(to, msg) }
func (e contextEffects) Send(to *actor.PID, msg any)    { e.ctx.Send(to, msg) }
func (e contextEffects) Respond(msg any)                { e.ctx.Respond(msg) }
func (e contextEffects) Sender() *actor.PID             { return e.ctx.Sender() }

func (e contextEffects) After(d time.Duration, msg any) supervision.Timer {
	self, root := e.ctx.Self(), e.ctx.ActorSystem().Root
	return e.clock.AfterFunc(d, func() { root.Send(self, msg) })
}

// Watch subscribes to a peer's event stream in a goroutine that sends
// every batch to the tier, until cancel.
func (e contextEffects) Watch(node string, gen uint64, cfg events.SubscriberConfig) func() {
	self, root := e.ctx.Self(), e.ctx.ActorSystem().Root
	sub, cancel := context.WithCancel(context.Background())
	if cfg.Replay != "" {
		cfg.Replayed = func(delivered int) { root.Send(self, &replayDone{node: node, gen: gen, delivered: delivered}) }
	}
	e.watchers.Add(1)
	go func() {
		defer e.watchers.Done()
		err := events.Subscribe(sub, cfg, func(d events.Delivery) error {
			root.Send(self, &eventBatch{node: node, gen: gen, seq: d.Seq, missed: d.Missed, batch: d.Batch})
			return nil
		})
		if sub.Err() == nil {
			root.Send(self, &watchEnded{node: node, gen: gen, err: err})
		}
	}()
	return cancel
}

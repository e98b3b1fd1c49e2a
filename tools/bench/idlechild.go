package bench

// The processes of `kvtier bench idle` (idle.go drives them): the measured
// node, its peer nodes (which fetch from it continuously when told), and
// the baseline, a Go program that only sleeps. Each speaks the benchmark
// children's protocol (child.go): it announces itself with one idleReply,
// then answers one idleReply per idleRequest. Only the orchestrator reads
// /proc, so measuring costs the measured processes nothing.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/client"
)

// idleRequest is a request to a child of the idle scenario (and of the
// engine-poll scenario, enginepoll.go): the measured node answers settle,
// probe, pause, status, resume and close; a peer settle, wait, fetch, mark
// and probe; the engine settle and burst.
type (
	idleRequest  = requestOf[idleProtocol]
	idleReq      = request[idleProtocol] // embedded in each
	idleProtocol struct{}
)

type (
	// idleSettle: collect and return free memory before the window.
	idleSettle struct{ idleReq }
	// idleProbe: time N peer lookups, each after Gap idle.
	idleProbe struct {
		idleReq
		N   int           `json:"n"`
		Gap time.Duration `json:"gap"`
	}
	// idlePause: Pause(clearCache=false), timed.
	idlePause struct{ idleReq }
	// idleStatus: blocks served, pending work, pause state, own engine's view.
	idleStatus struct{ idleReq }
	// idleResume: Resume.
	idleResume struct{ idleReq }
	// idleClose: Close within Timeout, timed.
	idleClose struct {
		idleReq
		Timeout time.Duration `json:"timeout"`
	}
	// idleWait: a peer waits for its session to the node.
	idleWait struct{ idleReq }
	// idleFetch: a peer starts fetching continuously; answered after its
	// first verified round.
	idleFetch struct{ idleReq }
	// idleMark: a peer's fetch counters now.
	idleMark struct{ idleReq }
	// idleBurst: the engine calls Lookup in bursts for Duration: Calls
	// back-to-back Lookups of Keys keys (one request), then Gap idle (the
	// model's step), and times every Lookup.
	idleBurst struct {
		idleReq
		Duration time.Duration `json:"duration"`
		Calls    int           `json:"calls"`
		Keys     int           `json:"keys"`
		Gap      time.Duration `json:"gap"`
	}
)

var idleRequests = newRequestTypes[idleRequest](idleSettle{}, idleProbe{}, idlePause{}, idleStatus{}, idleResume{},
	idleClose{}, idleWait{}, idleFetch{}, idleMark{}, idleBurst{})

// idleChild is a running child of the idle scenario.
type idleChild = childProc[idleRequest, idleReply]

// idleReply answers a request (and announces readiness).
type idleReply struct {
	Pid        int     `json:"pid"`
	Goroutines int     `json:"goroutines"`
	PeerAddr   string  `json:"peer_addr,omitempty"`
	EngineAddr string  `json:"engine_addr,omitempty"`
	Ms         float64 `json:"ms,omitempty"`         // pause, close: how long the call took
	P50us      float64 `json:"p50_us,omitempty"`     // probe
	P99us      float64 `json:"p99_us,omitempty"`     // probe
	RawP50us   float64 `json:"raw_p50_us,omitempty"` // probe: raw TCP round trip to the echo process
	RawP99us   float64 `json:"raw_p99_us,omitempty"`
	Served     uint64  `json:"served,omitempty"`      // status: blocks written into peers' pools
	Pending    bool    `json:"pending,omitempty"`     // status: HasPendingWork
	Paused     bool    `json:"paused,omitempty"`      // status: Stats().Paused
	EngineMiss bool    `json:"engine_miss,omitempty"` // status: the node's own engine gets MISS for a stored block
	CloseErr   string  `json:"close_err,omitempty"`   // close
	Rounds     int64   `json:"rounds"`                // peer: fetch rounds fetched and verified
	Missed     int64   `json:"missed"`                // peer: rounds that found no peer copy
	Failures   int64   `json:"failures"`              // peer: rounds that failed with an error
}

// IdleChildMain runs one process of the idle scenario: args are the role
// ("node", "peer", "engine", "sleep" or "echo") and its flags. It returns
// the exit status.
func IdleChildMain(args []string, stdin io.Reader, stdout io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "bench idle child: want a role: node, peer or sleep")
		return 2
	}
	var err error
	switch args[0] {
	case "sleep":
		// The baseline: a Go program that only sleeps.
		_ = announce(stdout, idleReply{Pid: os.Getpid(), Goroutines: runtime.NumGoroutine()})
		time.Sleep(365 * 24 * time.Hour)
		return 0
	case "echo":
		err = runEcho(stdout)
	case "engine":
		err = runIdleEngine(args[1:], stdin, stdout)
	case "node":
		err = runIdleNode(args[1:], stdin, stdout)
	case "peer":
		err = runIdlePeer(args[1:], stdin, stdout)
	default:
		err = fmt.Errorf("unknown role %q", args[0])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench idle %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// idleFlags are a node's flags, measured or peer.
type idleFlags struct {
	id, listen, secret        string
	peers                     []kvtier.PeerAddr
	blockBytes, slots, blocks int
	heartbeat                 time.Duration
	echo                      string // the echo process's address (measured node only)
	engineListen, poolPath    string // the engine endpoint (measured node only; "": embedded only)
	enginePoll                time.Duration
}

func parseIdleFlags(role string, args []string) (idleFlags, error) {
	var f idleFlags
	fs := flag.NewFlagSet("bench idle "+role, flag.ContinueOnError)
	fs.StringVar(&f.id, "id", "", "node id")
	fs.StringVar(&f.listen, "listen", "", "control-plane address")
	fs.StringVar(&f.secret, "secret", "", "shared secret")
	fs.Func("peer", "a peer to dial: id=tcp://host:port (repeatable)", func(v string) error {
		id, addr, ok := strings.Cut(v, "=")
		if !ok {
			return fmt.Errorf("want id=tcp://host:port, got %q", v)
		}
		f.peers = append(f.peers, kvtier.PeerAddr{NodeID: id, Addr: addr})
		return nil
	})
	fs.IntVar(&f.blockBytes, "block-bytes", 0, "bytes per block")
	fs.IntVar(&f.slots, "slots", 0, "pool slots")
	fs.IntVar(&f.blocks, "blocks", 0, "blocks the measured node holds (and a peer fetches per round)")
	fs.DurationVar(&f.heartbeat, "heartbeat", 0, "peer heartbeat period (0: default; negative: off)")
	fs.StringVar(&f.echo, "echo", "", "host:port of a TCP echo process, for the raw round-trip baseline")
	fs.StringVar(&f.engineListen, "engine-listen", "", "engine endpoint address (standalone mode)")
	fs.StringVar(&f.poolPath, "pool-path", "", "pool file (standalone mode)")
	fs.DurationVar(&f.enginePoll, "engine-poll", 0, "engine_poll of the endpoint (unix:// only; 0: off)")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if f.id == "" || f.listen == "" || f.blockBytes <= 0 || f.blocks <= 0 || f.slots < f.blocks {
		return f, fmt.Errorf("%w: bench idle %s: --id, --listen, --block-bytes, --slots ≥ --blocks > 0 required", messages.ErrBadConfig, role)
	}
	return f, nil
}

func (f idleFlags) open(ctx context.Context) (*kvtier.Node, error) {
	return kvtier.Open(ctx, kvtier.Config{PoolBytes: int64(f.slots) * int64(f.blockBytes), BlockBytes: f.blockBytes,
		PoolPath: f.poolPath, EngineListen: f.engineListen, EnginePoll: f.enginePoll,
		Peers: kvtier.PeersConfig{NodeID: f.id, Listen: f.listen, Secret: f.secret, Static: f.peers,
			HeartbeatInterval: f.heartbeat}})
}

// --- the measured node ------------------------------------------------------

func runIdleNode(args []string, stdin io.Reader, stdout io.Writer) error {
	f, err := parseIdleFlags("node", args)
	if err != nil {
		return err
	}
	// NB: start-up is bounded; from then on no context timer stays armed
	// (it would be measured as a wakeup of the node). Calls take the
	// node's call timeout.
	start, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node, err := f.open(start)
	if err != nil {
		return err
	}
	n := &idleNode{node: node, m: node.Manager(), f: f}
	defer n.close(10 * time.Second)
	if err := n.store(start); err != nil {
		return err
	}
	ids := make([]string, len(f.peers))
	for i, p := range f.peers {
		ids[i] = p.NodeID
	}
	if err := node.WaitPeers(start, ids...); err != nil {
		return fmt.Errorf("the node's sessions to its peers: %w", err)
	}
	cancel()
	ctx := context.Background()
	ready := idleReply{Pid: os.Getpid(), Goroutines: runtime.NumGoroutine(), PeerAddr: node.PeerAddr(),
		EngineAddr: node.EngineAddr()}
	return serveChild(stdin, stdout, idleRequests, ready, func(q idleRequest) (idleReply, error) {
		r, err := n.handle(ctx, q)
		r.Pid, r.Goroutines = os.Getpid(), runtime.NumGoroutine()
		return r, err
	})
}

type idleNode struct {
	node   *kvtier.Node
	m      kvtier.Manager
	f      idleFlags
	closed bool
}

// store stores the blocks peers fetch, through the node's engine API.
func (n *idleNode) store(ctx context.Context) error {
	plan, err := n.m.PrepareStore(ctx, &messages.ReqContext{RequestID: "store"}, keyRange(0, n.f.blocks))
	if err != nil {
		return err
	}
	for i, k := range plan.ToStore {
		idleFill(n.m.Pool().Slot(plan.Slots[i]), k)
	}
	for w := range plan.Workers {
		if err := n.m.JobDone(ctx, plan.Job, w, true); err != nil {
			return err
		}
	}
	return nil
}

func (n *idleNode) handle(ctx context.Context, q idleRequest) (idleReply, error) {
	var r idleReply
	switch q := q.(type) {
	case idleSettle:
		settleRuntime()
	case idleProbe:
		r, err := probePeers(ctx, n.node, q.N, q.Gap)
		if err != nil || n.f.echo == "" {
			return r, err
		}
		raw, err := echoRoundTrips(n.f.echo, q.N, q.Gap)
		r.RawP50us, r.RawP99us = percentileUs(raw, 0.50), percentileUs(raw, 0.99)
		return r, err
	case idlePause:
		start := time.Now()
		err := n.m.Pause(ctx, false)
		r.Ms = float64(time.Since(start).Microseconds()) / 1000
		return r, err
	case idleStatus:
		return n.status(ctx)
	case idleResume:
		return r, n.m.Resume(ctx)
	case idleClose:
		start := time.Now()
		if err := n.close(q.Timeout); err != nil {
			r.CloseErr = err.Error()
		}
		r.Ms = float64(time.Since(start).Microseconds()) / 1000
	default:
		return r, fmt.Errorf("the measured node does not answer %T", q)
	}
	return r, nil
}

// probePeers times engine lookups of keys no node holds, each after an
// idle gap: the node asks every peer, and the lookup settles (MISS) once
// all have answered — a whole peer round trip, from node to its peers.
func probePeers(ctx context.Context, node *kvtier.Node, count int, gap time.Duration) (idleReply, error) {
	m := node.Manager()
	lat := make([]time.Duration, 0, count)
	for range count {
		time.Sleep(gap)           // NB: the node and its peers go idle again
		i := int(probeSeq.Add(1)) // NB: a key never asked before: none is cached as absent
		req := &messages.ReqContext{RequestID: fmt.Sprintf("probe-%d", i)}
		k := keyRange(1<<30+i, 1)
		start := time.Now()
		st, err := m.Lookup(ctx, req, k, true)
		if err != nil {
			return idleReply{}, err
		}
		if st[0] != messages.Retry {
			return idleReply{}, fmt.Errorf("probe lookup answered %v, want RETRY (peers asked)", st[0])
		}
		if err := node.TieringIdle(ctx); err != nil {
			return idleReply{}, err
		}
		d := time.Since(start)
		if st, err = m.Lookup(ctx, req, k, true); err != nil {
			return idleReply{}, err
		}
		if st[0] != messages.Miss {
			return idleReply{}, fmt.Errorf("settled probe is %v, want MISS", st[0])
		}
		if err := m.RequestFinished(ctx, req); err != nil {
			return idleReply{}, err
		}
		lat = append(lat, d)
	}
	return idleReply{P50us: percentileUs(lat, 0.50), P99us: percentileUs(lat, 0.99), Rounds: int64(len(lat))}, nil
}

// probeSeq numbers a process's probe keys.
var probeSeq atomic.Int64

// echoRoundTrips times count 64-byte TCP round trips to an echo process,
// each after gap: the floor under a peer round trip from an idle process.
func echoRoundTrips(addr string, count int, gap time.Duration) ([]time.Duration, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	buf := make([]byte, 64)
	lat := make([]time.Duration, 0, count)
	for range count {
		time.Sleep(gap) // NB: both processes go idle again
		start := time.Now()
		if _, err := c.Write(buf); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(start))
	}
	return lat, nil
}

// runEcho echoes every TCP connection's bytes back until killed.
func runEcho(stdout io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	if err := announce(stdout, idleReply{Pid: os.Getpid(), PeerAddr: ln.Addr().String()}); err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

// status: blocks served to peers so far, pending engine work, pause state
// and what the node's own engine gets for a block it holds.
func (n *idleNode) status(ctx context.Context) (idleReply, error) {
	var r idleReply
	ps, err := n.node.PeerStats(ctx)
	if err != nil {
		return r, err
	}
	for _, p := range ps {
		r.Served += p.Served
	}
	if r.Pending, err = n.m.HasPendingWork(ctx); err != nil {
		return r, err
	}
	s, err := n.m.Stats(ctx)
	if err != nil {
		return r, err
	}
	r.Paused = s.Paused
	own := &messages.ReqContext{RequestID: "own"}
	st, err := n.m.Lookup(ctx, own, keyRange(0, 1), true)
	if err != nil {
		return r, err
	}
	r.EngineMiss = st[0] == messages.Miss
	return r, n.m.RequestFinished(ctx, own)
}

func (n *idleNode) close(timeout time.Duration) error {
	if n.closed {
		return nil
	}
	n.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return n.node.Close(ctx)
}

// --- an engine ----------------------------------------------------------------

// runIdleEngine is an out-of-process engine connected to the measured
// node's endpoint, idle after one finished request: what a standalone
// daemon sees from an engine with no traffic.
func runIdleEngine(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("bench idle engine", flag.ContinueOnError)
	connect := fs.String("connect", "", "the node's engine endpoint")
	if err := fs.Parse(args); err != nil {
		return err
	}
	start, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(start, *connect, client.Options{Name: "bench-idle-engine"})
	if err != nil {
		return err
	}
	defer c.Close(context.Background()) //nolint:errcheck // the node may be gone first
	req := &messages.ReqContext{RequestID: "warm-up"}
	if _, err := c.Lookup(start, req, keyRange(0, 1), true); err != nil {
		return err
	}
	if err := c.RequestFinished(start, req); err != nil {
		return err
	}
	cancel() // NB: no context timer stays armed while the engine idles
	ready := idleReply{Pid: os.Getpid(), Goroutines: runtime.NumGoroutine()}
	return serveChild(stdin, stdout, idleRequests, ready, func(q idleRequest) (idleReply, error) {
		switch q := q.(type) {
		case idleSettle:
			settleRuntime()
			return idleReply{Pid: os.Getpid()}, nil
		case idleBurst:
			return engineBursts(c, q)
		}
		return idleReply{}, fmt.Errorf("the engine does not answer %T", q)
	})
}

// engineBursts calls Lookup as a scheduler's step does (engineBurst), for
// q.Duration, and reports the Lookups' latency.
func engineBursts(c *client.Client, q idleBurst) (idleReply, error) {
	ctx := context.Background()
	keys := keyRange(0, q.Keys) // NB: blocks the node holds: HITs, as a prefix cache answers a scheduler
	var lat []time.Duration
	end := time.Now().Add(q.Duration)
	for n := 0; time.Now().Before(end); n++ {
		req := &messages.ReqContext{RequestID: fmt.Sprintf("burst-%d", n)}
		for range q.Calls {
			start := time.Now()
			if _, err := c.Lookup(ctx, req, keys, true); err != nil {
				return idleReply{}, err
			}
			lat = append(lat, time.Since(start))
		}
		if err := c.RequestFinished(ctx, req); err != nil {
			return idleReply{}, err
		}
		time.Sleep(q.Gap) // NB: the model's step, between the scheduler's bursts
	}
	return idleReply{Pid: os.Getpid(), P50us: percentileUs(lat, 0.50), P99us: percentileUs(lat, 0.99), Rounds: int64(len(lat))}, nil
}

// --- a peer -------------------------------------------------------------------

func runIdlePeer(args []string, stdin io.Reader, stdout io.Writer) error {
	f, err := parseIdleFlags("peer", args)
	if err != nil {
		return err
	}
	if len(f.peers) != 1 {
		return fmt.Errorf("%w: bench idle peer: want exactly one --peer (the measured node)", messages.ErrBadConfig)
	}
	start, cancel := context.WithTimeout(context.Background(), time.Minute)
	node, err := f.open(start)
	cancel() // NB: no context timer stays armed while the peer idles
	if err != nil {
		return err
	}
	ctx := context.Background()
	p := &idlePeer{node: node, m: node.Manager(), keys: keyRange(0, f.blocks), stop: make(chan struct{}), done: make(chan struct{})}
	defer p.close()
	ready := idleReply{Pid: os.Getpid(), Goroutines: runtime.NumGoroutine(), PeerAddr: node.PeerAddr()}
	return serveChild(stdin, stdout, idleRequests, ready, func(q idleRequest) (idleReply, error) {
		switch q := q.(type) {
		case idleWait:
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			if err := node.WaitPeers(wctx, f.peers[0].NodeID); err != nil {
				return idleReply{}, err
			}
		case idleFetch:
			if err := p.startFetching(); err != nil {
				return idleReply{}, err
			}
		case idleMark:
		case idleSettle:
			settleRuntime()
		case idleProbe:
			return probePeers(ctx, node, q.N, q.Gap)
		default:
			return idleReply{}, fmt.Errorf("a peer does not answer %T", q)
		}
		return p.reply(), nil
	})
}

// idlePeer is a peer node that fetches from the measured node on demand.
type idlePeer struct {
	node                     *kvtier.Node
	m                        kvtier.Manager
	keys                     []messages.Key
	rounds, missed, failures atomic.Int64
	started                  bool
	first                    chan struct{}
	stop, done               chan struct{}
	once                     sync.Once
}

func (p *idlePeer) reply() idleReply {
	return idleReply{Pid: os.Getpid(), Goroutines: runtime.NumGoroutine(),
		Rounds: p.rounds.Load(), Missed: p.missed.Load(), Failures: p.failures.Load()}
}

// startFetching starts the fetch loop and returns after its first
// verified round.
func (p *idlePeer) startFetching() error {
	if !p.started {
		p.started, p.first = true, make(chan struct{})
		go p.loop()
	}
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	select {
	case <-p.first:
		return nil
	case <-p.done:
		return errors.New("fetch loop ended before its first round")
	case <-t.C:
		return errors.New("no verified round within a minute")
	}
}

func (p *idlePeer) loop() {
	defer close(p.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.stop:
		case <-p.done:
		}
		cancel()
	}()
	want := make([]byte, p.m.Pool().BlockBytes())
	for n := 0; ; n++ {
		ok, err := p.round(ctx, n, want)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			p.failures.Add(1)
		case ok:
			if p.rounds.Add(1) == 1 {
				close(p.first)
			}
			continue
		default:
			p.missed.Add(1)
		}
		// NB: the measured node is gone (or refused); a bench child backs
		// off rather than spin.
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// round fetches every key from the measured node into this node's pool,
// verifies every byte, then clears this node's primary tier so the next
// round fetches again. It reports false when a key was not fetched.
func (p *idlePeer) round(ctx context.Context, n int, want []byte) (bool, error) {
	req := &messages.ReqContext{RequestID: fmt.Sprintf("fetch-%d", n)}
	defer p.m.RequestFinished(ctx, req) //nolint:errcheck // best effort: the round is over
	if _, err := p.m.Lookup(ctx, req, p.keys, true); err != nil {
		return false, err
	}
	if err := p.node.TieringIdle(ctx); err != nil {
		return false, err
	}
	st, err := p.m.Lookup(ctx, req, p.keys, true)
	if err != nil {
		return false, err
	}
	for _, s := range st {
		if s != messages.Hit {
			return false, p.m.ResetCache(ctx)
		}
	}
	job, err := p.m.PrepareLoad(ctx, req, p.keys)
	if err != nil {
		return false, err
	}
	for i, k := range p.keys {
		idleFill(want, k)
		if string(want) != string(p.m.Pool().Slot(job.Slots[i])) {
			return false, fmt.Errorf("block %d differs from what the measured node stored", i)
		}
	}
	if err := p.m.CompleteLoad(ctx, req, p.keys); err != nil {
		return false, err
	}
	return true, p.m.ResetCache(ctx)
}

func (p *idlePeer) close() {
	p.once.Do(func() {
		close(p.stop)
		if p.started {
			<-p.done
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.node.Close(ctx)
	})
}

// settleRuntime collects and returns free memory now: a collection or a
// scavenger still returning start-up memory would be measured as the
// process's own wakeups.
func settleRuntime() {
	runtime.GC()
	debug.FreeOSMemory()
}

// idleFill is the content of key k's block, known to every process.
func idleFill(b []byte, k messages.Key) {
	seed := k.Hash[0] ^ k.Hash[7] ^ k.Hash[6]*31
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>8)
	}
}

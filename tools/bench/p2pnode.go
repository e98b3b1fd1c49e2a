package bench

// The node process of the P2P scenarios: `kvtier bench p2p-node` runs one
// embedded kvtier node with peers on and an in-process simulated engine,
// and answers p2pRequests in the benchmark children's protocol (child.go).
// The orchestrator (p2p.go) runs two or more of these as
// separate processes, so every figure crosses real process boundaries,
// real ZeroMQ sockets and the real tcp data plane.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/internal/gcpercent"
	"github.com/kvtier/kvtier/messages"
)

// NodeOptions configure one node process.
type NodeOptions struct {
	ID         string
	PoolBytes  int64
	BlockBytes int
	Secret     string
	Transport  string // "tcp" (default) or "nixl"
	TLS        kvtier.PeersTLSConfig
	Peers      []kvtier.PeerAddr
}

// p2pRequest is a request to a node process.
type (
	p2pRequest  = requestOf[p2pProtocol]
	p2pReq      = request[p2pProtocol] // embedded in each
	p2pProtocol struct{}
)

type (
	// p2pWaitPeer: wait until the session to Node is up.
	p2pWaitPeer struct {
		p2pReq
		Node string `json:"node"`
	}
	// p2pStore: store blocks [From, From+Count) and wait until readable.
	p2pStore struct {
		p2pReq
		From  int `json:"from"`
		Count int `json:"count"`
	}
	// p2pFetch: a consumer engine fetches blocks [From, From+Count) from
	// its peers, looking them up every PollUs (driver.fetch).
	p2pFetch struct {
		p2pReq
		From   int `json:"from"`
		Count  int `json:"count"`
		PollUs int `json:"poll_us"`
	}
	// p2pStartBusy: run a busy engine of this shape (driver.startBusy).
	p2pStartBusy struct {
		p2pReq
		Shape busyShape `json:"shape"`
	}
	// p2pStopBusy: stop the busy engine, if any.
	p2pStopBusy struct{ p2pReq }
	// p2pCommitTimes: the busy engine's commit times so far.
	p2pCommitTimes struct{ p2pReq }
	// p2pProbeSteps: watch Steps steps of Node's busy engine of this shape
	// become visible (driver.probeSteps).
	p2pProbeSteps struct {
		p2pReq
		Node  string    `json:"node"`
		Steps int       `json:"steps"`
		Shape busyShape `json:"shape"`
	}
	// p2pRawRecv: receive Bytes on the raw listener, timed.
	p2pRawRecv struct {
		p2pReq
		Bytes int64 `json:"bytes"`
	}
	// p2pRawSend: send blocks [From, From+Count) to the raw listener at Addr.
	p2pRawSend struct {
		p2pReq
		Addr  string `json:"addr"`
		From  int    `json:"from"`
		Count int    `json:"count"`
	}
	// p2pPeerStats: the node's PeerStats.
	p2pPeerStats struct{ p2pReq }
)

var p2pRequests = newRequestTypes[p2pRequest](p2pWaitPeer{}, p2pStore{}, p2pFetch{}, p2pStartBusy{}, p2pStopBusy{},
	p2pCommitTimes{}, p2pProbeSteps{}, p2pRawRecv{}, p2pRawSend{}, p2pPeerStats{})

// busyShape is a busy engine: Requests long-prompt requests of Prompt
// blocks, each storing Chunk blocks per StepMs model step, on block ids
// from From.
type busyShape struct {
	From     int `json:"from"`
	Requests int `json:"requests"`
	StepMs   int `json:"step_ms"`
	Chunk    int `json:"chunk"`
	Prompt   int `json:"prompt"`
}

// nodeReply is one answer (fields by request).
type nodeReply struct {
	PeerAddr  string               `json:"peer_addr,omitempty"`
	RawAddr   string               `json:"raw_addr,omitempty"`
	DelayNs   int64                `json:"delay_ns,omitempty"`
	Verified  int                  `json:"verified,omitempty"`
	Nanos     int64                `json:"ns,omitempty"`
	Times     []int64              `json:"times,omitempty"`
	PhasesNs  []int64              `json:"phases_ns,omitempty"` // the busy engine's commit phases
	PeerStats []messages.PeerStats `json:"peer_stats,omitempty"`
	Steps     int                  `json:"steps,omitempty"`
	// LookupP50Us and LookupP99Us: the probe's peer lookups, round trip.
	LookupP50Us float64 `json:"lookup_p50_us,omitempty"`
	LookupP99Us float64 `json:"lookup_p99_us,omitempty"`
	Lookups     int     `json:"lookups,omitempty"`
}

// p2pKey is block id i of the P2P scenarios; fillP2P its content.
func p2pKey(i int) messages.Key { return benchKey(i) }

// fillP2P writes block id's content into b: a fixed pseudo-random
// template with a word of every 256 bytes replaced by one mixed from id
// and its offset, so a block that lands in another's slot, bytes moved
// within a block or between blocks by 256 bytes or more, or a 1 MiB
// template repeat, fail verification. Filling costs a copy: an engine's
// GPU-to-CPU copies cost its CPU nothing (DMA), and the xorshift stream
// this replaces (~5 GB/s) spent ~3.3 ms of the busy source's CPU at every
// step boundary (128 blocks of 128 KiB; the template: ~0.4 ms), which the
// store-to-visible probe then measured on a 2-core box.
func fillP2P(b []byte, id int) {
	t := p2pTemplate()
	for o := 0; o < len(b); o += len(t) {
		copy(b[o:], t)
	}
	stamp := uint64(id)*0x9E3779B97F4A7C15 + 1
	for o := 0; o+8 <= len(b); o += 256 {
		binary.LittleEndian.PutUint64(b[o:], binary.LittleEndian.Uint64(t[o%len(t):])^(stamp+uint64(o)))
	}
}

// p2pTemplate is fillP2P's 1 MiB template (xorshift64 from a fixed seed:
// the same in every process of a run).
var p2pTemplate = sync.OnceValue(func() []byte {
	t := make([]byte, 1<<20)
	x := uint64(0x9E3779B97F4A7C15)
	for i := 0; i+8 <= len(t); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(t[i:], x)
	}
	return t
})

// RunNode runs a node process until stdin closes or it is asked to quit.
func RunNode(ctx context.Context, o NodeOptions, in io.Reader, out io.Writer) error {
	gcpercent.Apply(gcpercent.Default) // NB: as kvtierd runs
	cfg := kvtier.Config{PoolBytes: o.PoolBytes, BlockBytes: o.BlockBytes,
		Peers: kvtier.PeersConfig{NodeID: o.ID, Listen: "tcp://127.0.0.1:0", Secret: o.Secret, Static: o.Peers, Transport: o.Transport, TLS: o.TLS}}
	node, err := kvtier.Open(ctx, cfg)
	if err != nil {
		return err
	}
	// Fault the pool's pages in before anything is measured, as the raw
	// TCP baseline does for its buffer: first-touch page faults are a
	// start-up cost of any pool, not of the path being compared.
	pool := node.Manager().Pool()
	for i := range pool.Slots() {
		slot := pool.Slot(i)
		for j := 0; j < len(slot); j += 4096 {
			slot[j] = 0
		}
	}
	d := &driver{node: node, m: node.Manager(), o: o}
	defer func() {
		d.stopBusy()
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = node.Close(cctx)
	}()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer raw.Close()
	d.raw = raw
	ready := nodeReply{PeerAddr: node.PeerAddr(), RawAddr: raw.Addr().String()}
	return serveChild(in, out, p2pRequests, ready, func(q p2pRequest) (nodeReply, error) { return d.do(ctx, q) })
}

// driver is the node process's simulated engine.
type driver struct {
	node *kvtier.Node
	m    kvtier.Manager
	o    NodeOptions
	raw  net.Listener

	busyStop chan struct{}
	busyDone chan struct{}
	mu       sync.Mutex
	commits  []int64 // busy loop: commit time (unix ns) of each step's stores, per request
	phases   []int64 // busy loop: each boundary's JobDone calls, first call to last answer (ns)
	reqSeq   int
}

func (d *driver) do(ctx context.Context, q p2pRequest) (nodeReply, error) {
	switch q := q.(type) {
	case p2pWaitPeer:
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return nodeReply{}, d.node.WaitPeers(wctx, q.Node)
	case p2pStore:
		return nodeReply{}, d.store(ctx, "store", q.From, q.Count)
	case p2pFetch:
		return d.fetch(ctx, q)
	case p2pStartBusy:
		d.startBusy(q.Shape)
		return nodeReply{}, nil
	case p2pStopBusy:
		d.stopBusy()
		return nodeReply{}, nil
	case p2pCommitTimes:
		d.mu.Lock()
		defer d.mu.Unlock()
		return nodeReply{Times: append([]int64(nil), d.commits...), PhasesNs: append([]int64(nil), d.phases...)}, nil
	case p2pProbeSteps:
		return d.probeSteps(ctx, q)
	case p2pRawRecv:
		return d.rawRecv(q.Bytes)
	case p2pRawSend:
		return d.rawSend(q)
	case p2pPeerStats:
		ps, err := d.node.PeerStats(ctx)
		return nodeReply{PeerStats: ps}, err
	}
	return nodeReply{}, fmt.Errorf("a node process does not answer %T", q)
}

// store writes blocks [from, from+n) through a store job and waits until
// they are readable.
func (d *driver) store(ctx context.Context, reqID string, from, n int) error {
	req := &messages.ReqContext{RequestID: reqID}
	ks := keyRange(from, n)
	plan, err := d.m.PrepareStore(ctx, req, ks)
	if err != nil {
		return err
	}
	for i, k := range plan.ToStore {
		fillP2P(d.m.Pool().Slot(plan.Slots[i]), int(binary.BigEndian.Uint64([]byte(k.Hash))))
	}
	for w := 0; w < plan.Workers; w++ {
		if err := d.m.JobDone(ctx, plan.Job, w, true); err != nil {
			return err
		}
	}
	return d.m.RequestFinished(ctx, req)
}

// fetch is a consumer engine asking for blocks it does not hold: it looks
// them up every poll period (its steps) from the first RETRY until all are
// HITs, then loads and verifies every byte.
func (d *driver) fetch(ctx context.Context, c p2pFetch) (nodeReply, error) {
	d.reqSeq++
	req := &messages.ReqContext{RequestID: fmt.Sprintf("fetch-%d", d.reqSeq)}
	ks := keyRange(c.From, c.Count)
	poll := time.Duration(max(c.PollUs, 1)) * time.Microsecond
	before, _ := d.node.PeerStats(ctx)
	var first time.Time
	for {
		st, err := d.m.Lookup(ctx, req, ks, true)
		if err != nil {
			return nodeReply{}, err
		}
		now := time.Now()
		if allHit(st) {
			if first.IsZero() {
				return nodeReply{}, errors.New("blocks were already local: not a fetch")
			}
			res := nodeReply{DelayNs: now.Sub(first).Nanoseconds()}
			if after, err := d.node.PeerStats(ctx); err == nil {
				res.Nanos = int64(fetchNanos(after) - fetchNanos(before))
			}
			res.Verified, err = d.loadVerify(ctx, req, ks)
			return res, err
		}
		if first.IsZero() {
			first = now
		}
		if st[0] == messages.Miss {
			return nodeReply{}, fmt.Errorf("fetch of %d blocks: MISS after %v", len(ks), now.Sub(first))
		}
		select {
		case <-ctx.Done():
			return nodeReply{}, ctx.Err()
		case <-time.After(poll): // NB: the engine's step period, not synchronisation
		}
	}
}

// fetchNanos is the time spent in fetch rounds, over every peer.
func fetchNanos(ps []messages.PeerStats) (n uint64) {
	for _, p := range ps {
		n += p.FetchNanos
	}
	return n
}

func allHit(st []messages.LookupStatus) bool {
	for _, s := range st {
		if s != messages.Hit {
			return false
		}
	}
	return true
}

func (d *driver) loadVerify(ctx context.Context, req *messages.ReqContext, ks []messages.Key) (int, error) {
	n, err := loadAndVerify(ctx, d.m, req, ks, d.o.BlockBytes)
	if err != nil {
		return n, err
	}
	return n, d.m.RequestFinished(ctx, req)
}

// busyKey is block j of request r's prompt in generation g of the busy
// engine: fresh keys, far from the measured fetch sets.
func busyKey(c busyShape, g, r, j int) int {
	return c.From + (g*c.Requests+r)*c.Prompt + j
}

// startBusy runs a busy engine: c.Requests long-prompt requests, one model
// step every c.StepMs; at each step boundary, exactly as an engine issues
// them, it reports the previous step's copies (JobDone: the stores commit),
// then looks up each request's prompt so far and prepares the store of its
// next c.Chunk blocks, then runs the model step (sleeps) while the
// "workers" copy the blocks. A request whose prompt is stored finishes and
// a new one takes its place. Commit times are recorded per (step, request).
func (d *driver) startBusy(c busyShape) {
	d.stopBusy()
	stop, done := make(chan struct{}), make(chan struct{})
	d.busyStop, d.busyDone = stop, done
	d.mu.Lock()
	d.commits, d.phases = nil, nil
	d.mu.Unlock()
	go func() {
		defer close(done)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			<-stop
			cancel()
		}()
		_ = d.busyLoop(ctx, c)
	}()
}

func (d *driver) stopBusy() {
	if d.busyStop != nil {
		close(d.busyStop)
		<-d.busyDone
		d.busyStop, d.busyDone = nil, nil
	}
}

func (d *driver) busyLoop(ctx context.Context, c busyShape) error {
	perReq := c.Prompt / c.Chunk
	plans := make([]messages.StorePlan, c.Requests)
	reqs := make([]*messages.ReqContext, c.Requests)
	for s := 0; ; s++ {
		g, chunk := s/perReq, s%perReq
		// Boundary, part 1: the previous step's copies are done.
		if s > 0 {
			start := time.Now()
			for r := range plans {
				for w := 0; w < plans[r].Workers; w++ {
					if err := d.m.JobDone(ctx, plans[r].Job, w, true); err != nil {
						return err
					}
				}
				d.mu.Lock()
				d.commits = append(d.commits, time.Now().UnixNano())
				d.mu.Unlock()
			}
			d.mu.Lock()
			d.phases = append(d.phases, time.Since(start).Nanoseconds())
			d.mu.Unlock()
		}
		// Part 2: a finished generation of requests leaves; lookups and
		// stores of this step.
		for r := range reqs {
			if chunk == 0 {
				if reqs[r] != nil {
					_ = d.m.RequestFinished(ctx, reqs[r])
				}
				reqs[r] = &messages.ReqContext{RequestID: fmt.Sprintf("busy-%d-%d", g, r)}
			}
			prompt := make([]messages.Key, (chunk+1)*c.Chunk)
			for j := range prompt {
				prompt[j] = p2pKey(busyKey(c, g, r, j))
			}
			if _, err := d.m.Lookup(ctx, reqs[r], prompt, true); err != nil {
				return err
			}
			plan, err := d.m.PrepareStore(ctx, reqs[r], prompt[chunk*c.Chunk:])
			if err != nil {
				return err
			}
			plans[r] = plan
		}
		// The model step; the workers' copies land halfway through it.
		if err := d.modelStep(ctx, c.StepMs, plans); err != nil {
			return err
		}
	}
}

// modelStep sleeps one model step of stepMs and fills the planned slots
// halfway through it, as an engine's DMA copies land while the model runs:
// they cost the engine's CPU nothing, so the template copy standing in for
// them (~1 ms of one core for 128 blocks of 128 KiB here) is kept off the
// step boundary, where it would be measured as the node's own work. A
// cancelled step reports its jobs failed.
func (d *driver) modelStep(ctx context.Context, stepMs int, plans []messages.StorePlan) error {
	step := time.Duration(stepMs) * time.Millisecond
	end := time.Now().Add(step)
	for half := range 2 {
		if half == 1 {
			for r := range plans {
				for i, k := range plans[r].ToStore {
					fillP2P(d.m.Pool().Slot(plans[r].Slots[i]), int(binary.BigEndian.Uint64([]byte(k.Hash))))
				}
			}
		}
		wait := time.Until(end) / time.Duration(2-half) // NB: the model step
		select {
		case <-ctx.Done():
			for r := range plans {
				for w := 0; w < plans[r].Workers; w++ {
					_ = d.m.JobDone(context.Background(), plans[r].Job, w, false)
				}
			}
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	return nil
}

// probeSteps watches, as a peer, the busy source's stores become visible:
// for each of q.Steps steps it probes that step's blocks through the peer
// session until each request's chunk is a HIT, and records when (unix ns,
// per (step, request), matching the source's commit times).
func (d *driver) probeSteps(ctx context.Context, q p2pProbeSteps) (nodeReply, error) {
	c := q.Shape
	perReq := c.Prompt / c.Chunk
	times := make([]int64, 0, q.Steps*c.Requests)
	var rtts []float64 // µs
	deadline := time.Now().Add(time.Duration(q.Steps+5) * time.Duration(c.StepMs) * time.Millisecond * 2)
	for s := 0; s < q.Steps; s++ {
		g, chunk := s/perReq, s%perReq
		ks := make([]messages.Key, 0, c.Requests*c.Chunk)
		for r := 0; r < c.Requests; r++ {
			for j := 0; j < c.Chunk; j++ {
				ks = append(ks, p2pKey(busyKey(c, g, r, chunk*c.Chunk+j)))
			}
		}
		seen := make([]int64, c.Requests)
		left := c.Requests
		for left > 0 {
			if time.Now().After(deadline) {
				return nodeReply{Times: times}, fmt.Errorf("step %d never became visible", s)
			}
			t0 := time.Now()
			hits, err := d.node.ProbePeer(ctx, q.Node, ks)
			if err != nil {
				return nodeReply{}, err
			}
			now := time.Now().UnixNano()
			rtts = append(rtts, float64(now-t0.UnixNano())/1e3)
			for r := 0; r < c.Requests; r++ {
				if seen[r] == 0 && allTrue(hits[r*c.Chunk:(r+1)*c.Chunk]) {
					seen[r] = now
					left--
				}
			}
		}
		times = append(times, seen...)
	}
	return nodeReply{Times: times, Lookups: len(rtts), LookupP50Us: quantile(rtts, 0.50), LookupP99Us: quantile(rtts, 0.99)}, nil
}

func allTrue(bs []bool) bool {
	for _, b := range bs {
		if !b {
			return false
		}
	}
	return true
}

// rawRecv accepts one connection on the raw listener and reads n bytes
// into a pre-touched buffer: the same bytes a fetch moves, with nothing but
// the socket in the way. It reports first byte to last.
func (d *driver) rawRecv(n int64) (nodeReply, error) {
	buf := make([]byte, n)
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = 1 // fault the pages in before the clock starts
	}
	conn, err := d.raw.Accept()
	if err != nil {
		return nodeReply{}, err
	}
	defer conn.Close()
	if _, err := io.ReadFull(conn, buf[:1]); err != nil {
		return nodeReply{}, err
	}
	start := time.Now()
	if _, err := io.ReadFull(conn, buf[1:]); err != nil {
		return nodeReply{}, err
	}
	return nodeReply{Nanos: time.Since(start).Nanoseconds()}, nil
}

// rawSend writes c.Count blocks to the raw listener at c.Addr, block by
// block with writev, as the tcp data plane does.
func (d *driver) rawSend(c p2pRawSend) (nodeReply, error) {
	buf := make([]byte, c.Count*d.o.BlockBytes)
	bufs := make(net.Buffers, c.Count)
	for i := range bufs {
		bufs[i] = buf[i*d.o.BlockBytes : (i+1)*d.o.BlockBytes]
		fillP2P(bufs[i], c.From+i)
	}
	conn, err := net.Dial("tcp", c.Addr)
	if err != nil {
		return nodeReply{}, err
	}
	defer conn.Close()
	_, err = bufs.WriteTo(conn)
	return nodeReply{}, err
}

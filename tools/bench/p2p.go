package bench

// The P2P scenarios (docs/DESIGN.md §6.4, issue "Peers"): two or more node
// processes (p2pnode.go) on loopback, driven by this orchestrator.
//
//   - matrix: the consumer's lookup delay (first RETRY to all HIT) for a
//     fetch of ~1,700 fresh blocks, with the source's engine idle or busy
//     (8 long-prompt requests, 1.4 s model steps, calls at step
//     boundaries), on a new session (cold) and on a used one (warm); the
//     busy penalty is busy_warm / idle_warm. Then how long a block the busy
//     source commits takes to be visible to a peer's lookup.
//   - throughput: fetch GB/s against a raw TCP copy of the same bytes
//     between the same two processes.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/kvtier/kvtier/internal/testutil/testcerts"
	"github.com/kvtier/kvtier/messages"
)

// P2POptions size the P2P scenarios.
type P2POptions struct {
	Binary       string // the kvtier executable run as node processes; default: this one
	BlockBytes   int
	PoolBytes    int64
	FetchBlocks  int    // blocks per measured fetch
	PollUs       int    // the consumer engine's step (lookup period) while it waits
	ColdRounds   int    // fresh consumer processes per case (interleaved idle/busy pairs)
	WarmRounds   int    // fetch pairs (idle, busy) on a used session, at least (24: the standard error of the ratio of medians √3 smaller than with 8); up to 3× until the ratio settles
	Requests     int    // busy source: concurrent requests
	StepMs       int    // busy source: model step
	Chunk        int    // busy source: blocks each request stores per step
	Prompt       int    // busy source: prompt blocks per request
	VisibleSteps int    // busy source steps whose stores are watched by a peer (8 samples each: 60 for a p99 of 480, not of its second largest)
	Rounds       int    // throughput: fetches and raw copies measured
	Transport    string // throughput: "tcp", or "nixl" (then tcp is measured too, same run)
	TLS          bool   // throughput, tcp: mutual TLS on the data plane (then plain tcp is measured too, same run)
	Timeout      time.Duration
	tlsDir       string // the run's certificates (one per node id), when TLS
	tlsCA        *testcerts.CA
}

// DefaultP2POptions is what `kvtier bench p2p-matrix` / `p2p-throughput`
// run with no flags.
func DefaultP2POptions() P2POptions {
	return P2POptions{BlockBytes: 128 << 10, PoolBytes: 1 << 30, FetchBlocks: 1700, PollUs: 1000,
		ColdRounds: 2, WarmRounds: 24, Requests: 8, StepMs: 1400, Chunk: 16, Prompt: 2048,
		VisibleSteps: 60, Rounds: 5, Transport: "tcp", Timeout: 10 * time.Minute}
}

// P2PMatrixResult is the matrix's report.
type P2PMatrixResult struct {
	IdleColdS      float64 `json:"idle_cold_s"`
	IdleWarmS      float64 `json:"idle_warm_s"`
	BusyColdS      float64 `json:"busy_cold_s"`
	BusyWarmS      float64 `json:"busy_warm_s"`
	BusyPenalty    float64 `json:"busy_penalty"`        // median busy_warm / median idle_warm; target ≤ 1.05
	PenaltySpread  float64 `json:"busy_penalty_spread"` // ± half the IQR of the per-pair ratios
	IdleWarmSpread float64 `json:"idle_warm_spread"`    // IQR / median of the idle samples
	BusyWarmSpread float64 `json:"busy_warm_spread"`    // IQR / median of the busy samples
	WarmPairs      int     `json:"warm_pairs"`          // interleaved (idle, busy) pairs measured
	ColdPenalty    float64 `json:"busy_cold_penalty"`   // busy_cold / idle_cold
	VisibleP50Ms   float64 `json:"store_to_peer_visible_p50_ms"`
	VisibleP99Ms   float64 `json:"store_to_peer_visible_p99_ms"` // target < 5
	VisibleSamples int     `json:"store_to_peer_visible_samples"`
	// PeerLookupP50Us and PeerLookupP99Us are the round trips of the
	// visible probe's lookups (one step's blocks of every busy request, back
	// to back) from a peer of the busy source: a peer's lookup while the
	// source's engine is busy; target p99 < 1 ms.
	PeerLookupP50Us float64 `json:"peer_lookup_p50_us"`
	PeerLookupP99Us float64 `json:"peer_lookup_p99_us"`
	PeerLookups     int     `json:"peer_lookups"`
	// SourceCommitP50Ms and SourceCommitP99Ms are the busy engine's side of
	// the same steps: its boundary's JobDone calls (one per request), first
	// call to last answer, while the probe's lookups compete for the cores.
	SourceCommitP50Ms float64   `json:"source_commit_phase_p50_ms"`
	SourceCommitP99Ms float64   `json:"source_commit_phase_p99_ms"`
	FetchBlocks       int       `json:"fetch_blocks"`
	BlockBytes        int       `json:"block_bytes"`
	FetchMB           float64   `json:"fetch_mb"`
	StepMs            int       `json:"source_step_ms"`
	Requests          int       `json:"source_requests"`
	IdleWarmSamplesS  []float64 `json:"idle_warm_samples_s"`
	BusyWarmSamplesS  []float64 `json:"busy_warm_samples_s"`
}

// P2PThroughputResult is the throughput scenario's report.
type P2PThroughputResult struct {
	FetchGBps    float64 `json:"fetch_GBps"`
	TCPFetchGBps float64 `json:"tcp_fetch_GBps,omitempty"` // with --transport nixl: the tcp transport, same run
	RawTCPGBps   float64 `json:"raw_tcp_GBps"`
	Ratio        float64 `json:"fetch_over_raw"` // target ≥ 0.8
	Transport    string  `json:"transport"`
	TLS          bool    `json:"tls,omitempty"` // fetch_GBps is over TLS; tcp_fetch_GBps the same run's plain tcp
	// With TLS: the plain tcp pair's samples (its rounds alternate with the
	// TLS pair's), the ratio of the medians (TLS over plain tcp; target ≥
	// 0.7) and half the IQR of the per-round ratios.
	TCPFetchSamples  []float64 `json:"tcp_fetch_GBps_samples,omitempty"`
	TLSOverTCP       float64   `json:"tls_over_tcp,omitempty"`
	TLSOverTCPSpread float64   `json:"tls_over_tcp_spread,omitempty"`
	Blocks           int       `json:"blocks"`
	BlockBytes       int       `json:"block_bytes"`
	Rounds           int       `json:"rounds"`
	FetchSamples     []float64 `json:"fetch_GBps_samples"`
	RawSamples       []float64 `json:"raw_tcp_GBps_samples"`
}

const p2pSecret = "kvtier-bench-p2p-secret-0123456789"

// child is one node process.
type child struct {
	id string
	*childProc[p2pRequest, nodeReply]
}

func startP2PNode(ctx context.Context, o P2POptions, id string, peers ...*child) (*child, error) {
	bin := o.Binary
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	args := []string{"bench", "p2p-node", "--id", id, "--pool-bytes", strconv.FormatInt(o.PoolBytes, 10),
		"--block-bytes", strconv.Itoa(o.BlockBytes), "--secret", p2pSecret, "--transport", o.Transport}
	for _, p := range peers {
		args = append(args, "--peer", p.id+"="+p.ready.PeerAddr)
	}
	if o.tlsCA != nil {
		cert, key, ca, err := o.tlsCA.Files(o.tlsDir, id)
		if err != nil {
			return nil, err
		}
		args = append(args, "--tls-cert", cert, "--tls-key", key, "--tls-ca", ca)
	}
	c, err := startChild[p2pRequest, nodeReply]("node "+id, p2pRequests, exec.CommandContext(ctx, bin, args...))
	if err != nil {
		return nil, err
	}
	return &child{id: id, childProc: c}, nil
}

// busy is the busy source engine's shape, on block ids from from.
func (o P2POptions) busy(from int) busyShape {
	return busyShape{From: from, Requests: o.Requests, StepMs: o.StepMs, Chunk: o.Chunk, Prompt: o.Prompt}
}

// keySets hands out fresh, disjoint ranges of block ids.
type keySets struct{ next int }

func (k *keySets) take() int { k.next += 1 << 20; return k.next }

// RunP2PMatrix runs the 4-case matrix (cold and warm fetches, source idle
// and busy, interleaved) and the store-to-visible probe.
func RunP2PMatrix(ctx context.Context, o P2POptions) (res P2PMatrixResult, err error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	res = P2PMatrixResult{FetchBlocks: o.FetchBlocks, BlockBytes: o.BlockBytes, StepMs: o.StepMs, Requests: o.Requests,
		FetchMB: float64(o.FetchBlocks*o.BlockBytes) / 1e6}
	src, err := startP2PNode(ctx, o, "src")
	if err != nil {
		return res, err
	}
	defer src.quit()
	sets := &keySets{}
	m := matrix{o: o, src: src, sets: sets}
	defer m.setBusy(false)
	idleCold, busyCold, err := m.cold(ctx)
	if err != nil {
		return res, err
	}
	idleWarm, busyWarm, err := m.warm(ctx)
	if err != nil {
		return res, err
	}
	if err := m.setBusy(false); err != nil {
		return res, err
	}
	vis, phases, probe, err := measureVisible(ctx, o, src, sets)
	if err != nil {
		return res, err
	}
	if _, err := src.call(p2pStopBusy{}); err != nil {
		return res, err
	}
	res.IdleColdS, res.IdleWarmS = median(idleCold), median(idleWarm)
	res.BusyColdS, res.BusyWarmS = median(busyCold), median(busyWarm)
	res.IdleWarmSamplesS, res.BusyWarmSamplesS = idleWarm, busyWarm
	res.BusyPenalty = res.BusyWarmS / res.IdleWarmS
	res.PenaltySpread = ratioSpread(idleWarm, busyWarm)
	res.IdleWarmSpread, res.BusyWarmSpread = spread(idleWarm), spread(busyWarm)
	res.WarmPairs = len(idleWarm)
	res.ColdPenalty = res.BusyColdS / res.IdleColdS
	res.VisibleSamples = len(vis)
	res.VisibleP50Ms, res.VisibleP99Ms = percentileMs(vis, 0.50), percentileMs(vis, 0.99)
	res.PeerLookupP50Us, res.PeerLookupP99Us, res.PeerLookups = probe.LookupP50Us, probe.LookupP99Us, probe.Lookups
	res.SourceCommitP50Ms, res.SourceCommitP99Ms = percentileMs(phases, 0.50), percentileMs(phases, 0.99)
	return res, nil
}

// matrix measures fetches from src with its engine idle and busy,
// interleaved: pair i runs idle then busy when i is even, busy then idle
// when odd, so that the machine's drift weighs on both alike.
type matrix struct {
	o    P2POptions
	src  *child
	sets *keySets
	busy bool
}

func (m *matrix) setBusy(on bool) error {
	if on == m.busy {
		return nil
	}
	var err error
	if on {
		_, err = m.src.call(p2pStartBusy{Shape: m.o.busy(m.sets.take())})
	} else {
		_, err = m.src.call(p2pStopBusy{})
	}
	if err == nil {
		m.busy = on
	}
	return err
}

// pair runs one idle and one busy measurement, in pair i's order.
func (m *matrix) pair(i int, measure func(busy bool) (float64, error)) (idle, busy float64, err error) {
	for _, b := range [2]bool{i%2 == 1, i%2 == 0} {
		if err := m.setBusy(b); err != nil {
			return 0, 0, err
		}
		d, err := measure(b)
		if err != nil {
			return 0, 0, err
		}
		if b {
			busy = d
		} else {
			idle = d
		}
	}
	return idle, busy, nil
}

// cold: the first fetch of a fresh consumer process, ColdRounds pairs.
func (m *matrix) cold(ctx context.Context) (idle, busy []float64, err error) {
	for i := range m.o.ColdRounds {
		a, b, err := m.pair(i, func(isBusy bool) (float64, error) {
			cons, err := startP2PNode(ctx, m.o, fmt.Sprintf("cons-cold-%d-%t", i, isBusy), m.src)
			if err != nil {
				return 0, err
			}
			defer cons.quit()
			if _, err := cons.call(p2pWaitPeer{Node: m.src.id}); err != nil {
				return 0, err
			}
			return fetchOnce(m.o, m.src, cons, m.sets)
		})
		if err != nil {
			return nil, nil, fmt.Errorf("cold fetch: %w", err)
		}
		idle, busy = append(idle, a), append(busy, b)
	}
	return idle, busy, nil
}

// warm: fetches on one used session, at least WarmRounds pairs, more (up
// to 3×) until the ratio of medians moves by at most 0.01 per two pairs.
func (m *matrix) warm(ctx context.Context) (idle, busy []float64, err error) {
	cons, err := startP2PNode(ctx, m.o, "cons-warm", m.src)
	if err != nil {
		return nil, nil, err
	}
	defer cons.quit()
	if _, err := cons.call(p2pWaitPeer{Node: m.src.id}); err != nil {
		return nil, nil, err
	}
	if _, err := fetchOnce(m.o, m.src, cons, m.sets); err != nil { // warm-up: connections
		return nil, nil, err
	}
	for i := 0; i < 3*m.o.WarmRounds; i++ {
		if i >= m.o.WarmRounds && settled(idle, busy, 0.01) {
			break
		}
		a, b, err := m.pair(i, func(bool) (float64, error) { return fetchOnce(m.o, m.src, cons, m.sets) })
		if err != nil {
			return nil, nil, fmt.Errorf("warm fetch: %w", err)
		}
		idle, busy = append(idle, a), append(busy, b)
	}
	return idle, busy, nil
}

// fetchOnce stores a fresh set on src and has cons fetch it; seconds.
func fetchOnce(o P2POptions, src, cons *child, sets *keySets) (float64, error) {
	from := sets.take()
	if _, err := src.call(p2pStore{From: from, Count: o.FetchBlocks}); err != nil {
		return 0, err
	}
	r, err := cons.call(p2pFetch{From: from, Count: o.FetchBlocks, PollUs: o.PollUs})
	if err != nil {
		return 0, err
	}
	if r.Verified != o.FetchBlocks {
		return 0, fmt.Errorf("verified %d of %d blocks", r.Verified, o.FetchBlocks)
	}
	if os.Getenv("KVTIER_BENCH_DEBUG") != "" {
		fmt.Fprintf(os.Stderr, "fetch of %d: delay %.1f ms, of which fetch round %.1f ms\n", o.FetchBlocks, float64(r.DelayNs)/1e6, float64(r.Nanos)/1e6)
	}
	return float64(r.DelayNs) / 1e9, nil
}

// measureVisible restarts the busy engine on fresh keys while a peer
// watches each step's stores; milliseconds from commit to visible, and the
// watcher's report (its lookups' round trips), and the source's commit
// phases over the same steps (milliseconds).
func measureVisible(ctx context.Context, o P2POptions, src *child, sets *keySets) (visible, phases []float64, probe nodeReply, err error) {
	if _, err := src.call(p2pStopBusy{}); err != nil {
		return nil, nil, nodeReply{}, err
	}
	cons, err := startP2PNode(ctx, o, "cons-visible", src)
	if err != nil {
		return nil, nil, nodeReply{}, err
	}
	defer cons.quit()
	if _, err := cons.call(p2pWaitPeer{Node: src.id}); err != nil {
		return nil, nil, nodeReply{}, err
	}
	busy := o.busy(sets.take())
	if err := cons.send(p2pProbeSteps{Node: src.id, Steps: o.VisibleSteps, Shape: busy}); err != nil {
		return nil, nil, nodeReply{}, err
	}
	if _, err := src.call(p2pStartBusy{Shape: busy}); err != nil {
		return nil, nil, nodeReply{}, err
	}
	seen, err := cons.recv()
	if err != nil {
		return nil, nil, nodeReply{}, err
	}
	commits, err := src.call(p2pCommitTimes{})
	if err != nil {
		return nil, nil, nodeReply{}, err
	}
	if len(commits.Times) < len(seen.Times) {
		return nil, nil, nodeReply{}, errors.New("fewer commits than visible blocks")
	}
	visible = make([]float64, len(seen.Times))
	for i, t := range seen.Times {
		visible[i] = float64(t-commits.Times[i]) / 1e6
	}
	for _, p := range commits.PhasesNs[:min(len(commits.PhasesNs), o.VisibleSteps)] { // the steps probed
		phases = append(phases, float64(p)/1e6)
	}
	if os.Getenv("KVTIER_BENCH_DEBUG") != "" {
		fmt.Fprintf(os.Stderr, "store to visible, ms, per (step, request): %.2f\n", visible)
		fmt.Fprintf(os.Stderr, "source commit phases, ms: %.2f\n", phases)
	}
	return visible, phases, seen, nil
}

// RunP2PThroughput compares fetch throughput with a raw TCP copy of the
// same bytes between the same two processes, alternating rounds. With
// Transport "nixl" it measures a tcp pair and a nixl pair in the same run.
// With TLS it runs a plain tcp pair and a TLS pair side by side and
// alternates their rounds (plain then TLS, TLS then plain, …), so that the
// box's drift weighs on both alike.
func RunP2PThroughput(ctx context.Context, o P2POptions) (res P2PThroughputResult, err error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	res = P2PThroughputResult{Transport: o.Transport, TLS: o.TLS, Blocks: o.FetchBlocks, BlockBytes: o.BlockBytes, Rounds: o.Rounds}
	if o.TLS {
		if o.Transport != "tcp" {
			return res, fmt.Errorf("%w: --tls is the tcp data plane's", messages.ErrBadConfig)
		}
		return runTLSThroughput(ctx, o, res)
	}
	if o.Transport == "nixl" {
		tcp := o
		tcp.Transport = "tcp"
		fetch, _, err := throughputPair(ctx, tcp)
		if err != nil {
			return res, fmt.Errorf("tcp pair: %w", err)
		}
		res.TCPFetchGBps = median(fetch)
	}
	res.FetchSamples, res.RawSamples, err = throughputPair(ctx, o)
	if err != nil {
		return res, err
	}
	res.FetchGBps, res.RawTCPGBps = median(res.FetchSamples), median(res.RawSamples)
	res.Ratio = res.FetchGBps / res.RawTCPGBps
	return res, nil
}

// runTLSThroughput measures a plain tcp pair and a TLS pair (certificates
// made for the run) in alternating rounds; fetch_GBps is the TLS pair's,
// tcp_fetch_GBps the plain pair's, raw_tcp_GBps the TLS pair's raw copies.
func runTLSThroughput(ctx context.Context, o P2POptions, res P2PThroughputResult) (P2PThroughputResult, error) {
	plain, err := startThroughputPair(ctx, o)
	if err != nil {
		return res, fmt.Errorf("plain tcp pair: %w", err)
	}
	defer plain.quit()
	if o.tlsCA, err = testcerts.New(); err != nil {
		return res, err
	}
	if o.tlsDir, err = os.MkdirTemp("", "kvtier-bench-tls-"); err != nil {
		return res, err
	}
	defer os.RemoveAll(o.tlsDir)
	secure, err := startThroughputPair(ctx, o)
	if err != nil {
		return res, fmt.Errorf("tls pair: %w", err)
	}
	defer secure.quit()
	for i := 0; i < o.Rounds; i++ {
		first, second := plain, secure
		if i%2 == 1 {
			first, second = secure, plain
		}
		if err := first.round(i); err != nil {
			return res, err
		}
		if err := second.round(i); err != nil {
			return res, err
		}
	}
	res.FetchSamples, res.RawSamples, res.TCPFetchSamples = secure.fetch, secure.raw, plain.fetch
	res.FetchGBps, res.RawTCPGBps, res.TCPFetchGBps = median(secure.fetch), median(secure.raw), median(plain.fetch)
	res.Ratio = res.FetchGBps / res.RawTCPGBps
	res.TLSOverTCP = res.FetchGBps / res.TCPFetchGBps
	res.TLSOverTCPSpread = ratioSpread(plain.fetch, secure.fetch)
	return res, nil
}

// throughputPair runs o.Rounds fetches and raw copies between two fresh
// node processes; GB/s samples.
func throughputPair(ctx context.Context, o P2POptions) (fetch, raw []float64, err error) {
	p, err := startThroughputPair(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	defer p.quit()
	for i := 0; i < o.Rounds; i++ {
		if err := p.round(i); err != nil {
			return nil, nil, err
		}
	}
	return p.fetch, p.raw, nil
}

// tpPair is a source and a consumer node, warmed up (connections made),
// and the GB/s of the rounds measured on them.
type tpPair struct {
	o          P2POptions
	src, cons  *child
	sets       *keySets
	fetch, raw []float64
}

func startThroughputPair(ctx context.Context, o P2POptions) (*tpPair, error) {
	src, err := startP2PNode(ctx, o, "src")
	if err != nil {
		return nil, err
	}
	cons, err := startP2PNode(ctx, o, "cons", src)
	if err != nil {
		src.quit()
		return nil, err
	}
	p := &tpPair{o: o, src: src, cons: cons, sets: &keySets{}}
	if _, err := cons.call(p2pWaitPeer{Node: src.id}); err != nil {
		p.quit()
		return nil, err
	}
	if _, err := fetchOnce(o, src, cons, p.sets); err != nil { // warm-up: connections
		p.quit()
		return nil, err
	}
	return p, nil
}

func (p *tpPair) quit() {
	p.cons.quit()
	p.src.quit()
}

// round measures one fetch, then one raw copy of the same bytes.
func (p *tpPair) round(i int) error {
	bytes := float64(p.o.FetchBlocks * p.o.BlockBytes)
	before, err := fetchStats(p.cons, p.src.id)
	if err != nil {
		return err
	}
	if _, err := fetchOnce(p.o, p.src, p.cons, p.sets); err != nil {
		return err
	}
	after, err := fetchStats(p.cons, p.src.id)
	if err != nil {
		return err
	}
	p.fetch = append(p.fetch, float64(after.FetchBytes-before.FetchBytes)/float64(after.FetchNanos-before.FetchNanos))
	if err := p.cons.send(p2pRawRecv{Bytes: int64(bytes)}); err != nil {
		return err
	}
	if _, err := p.src.call(p2pRawSend{Addr: p.cons.ready.RawAddr, From: i, Count: p.o.FetchBlocks}); err != nil {
		return err
	}
	r, err := p.cons.recv()
	if err != nil {
		return err
	}
	p.raw = append(p.raw, bytes/float64(r.Nanos))
	return nil
}

func fetchStats(c *child, peer string) (s struct{ FetchBytes, FetchNanos uint64 }, err error) {
	r, err := c.call(p2pPeerStats{})
	if err != nil {
		return s, err
	}
	for _, p := range r.PeerStats {
		if p.Node == peer {
			s.FetchBytes, s.FetchNanos = p.FetchBytes, p.FetchNanos
			return s, nil
		}
	}
	return s, fmt.Errorf("no stats for peer %s", peer)
}

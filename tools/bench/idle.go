package bench

// The idle scenario (docs/DESIGN.md §2.2, §6.4; seed 002): a node with peers
// connected and no traffic should cost no more wakeups than a Go program
// that only sleeps, still answer a peer lookup in well under a
// millisecond, pause in milliseconds while a peer keeps fetching from it,
// and shut down gracefully with that peer still fetching.
//
// The measured node, its peers and the baseline are child processes
// (idlechild.go) of this one, which only reads their context switches: the
// sum of voluntary and nonvoluntary switches over every thread of a
// process (/proc/<pid>/task/*/status), before and after the same window.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvtier/kvtier/internal/testutil/freeport"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer"
)

// IdleOptions size the idle scenario.
type IdleOptions struct {
	Peers        int           // peer node processes; each dials the node and the node dials each
	Window       time.Duration // the idle measurement window
	Settle       time.Duration // quiet time after start-up, before the window
	Blocks       int           // blocks the node holds; a fetching peer fetches all of them per round
	BlockBytes   int           // bytes per block
	Slots        int           // pool slots of every node
	Probes       int           // peer lookups timed from the idle node
	ProbeGap     time.Duration // idle time before each probe
	PauseWindow  time.Duration // how long the node stays paused while a peer fetches
	CloseTimeout time.Duration // Close's context: the drain bound is nine tenths of it
	Heartbeat    time.Duration // every node's peer heartbeat period (0: the default; negative: off)
	Engine       bool          // serve the node standalone, with an idle engine process connected
	Timeout      time.Duration // whole-run bound
	// Child runs a child process of the scenario with the given arguments
	// (a role, "node" or "sleep", and its flags; see IdleChildMain). Nil:
	// this executable as `kvtier bench idle child ARGS...`. Every child dies
	// with this process.
	Child func(args ...string) *exec.Cmd
}

// DefaultIdleOptions is what `kvtier bench idle` runs with no flags.
func DefaultIdleOptions() IdleOptions {
	return IdleOptions{Peers: 2, Window: 10 * time.Second, Settle: 2 * time.Second, Blocks: 16, BlockBytes: 64 << 10,
		Slots: 256, Probes: 200, ProbeGap: 10 * time.Millisecond, PauseWindow: time.Second,
		CloseTimeout: 5 * time.Second, Timeout: 5 * time.Minute, Engine: true}
}

// IdleResult is the scenario's report.
type IdleResult struct {
	IdleCtxswPerS       float64   `json:"idle_ctxsw_per_s"`     // the node's process, peers connected, no traffic
	BaselineCtxswPerS   float64   `json:"baseline_ctxsw_per_s"` // a Go program that only sleeps, same window
	PeerCtxswPerS       []float64 `json:"peer_ctxsw_per_s"`     // each peer process, same window
	EngineCtxswPerS     float64   `json:"engine_ctxsw_per_s"`   // the idle engine process connected to the node (standalone), same window
	Standalone          bool      `json:"standalone"`           // the node served an engine endpoint with an engine connected
	WindowS             float64   `json:"window_s"`
	Peers               int       `json:"peers"`
	NodeThreads         int       `json:"node_threads"`
	NodeGoroutines      int       `json:"node_goroutines"`
	BaselineGoroutines  int       `json:"baseline_goroutines"`
	PeerLookupP50us     float64   `json:"peer_lookup_p50_us"` // engine Lookup of a key no one holds → every peer answered
	PeerLookupP99us     float64   `json:"peer_lookup_p99_us"`
	PeerLookupSamples   int       `json:"peer_lookup_samples"`
	RawTCPRTTP50us      float64   `json:"raw_tcp_rtt_p50_us"` // baseline: a 64-byte TCP round trip between two processes, same idle gap
	RawTCPRTTP99us      float64   `json:"raw_tcp_rtt_p99_us"`
	ProbeGapMs          float64   `json:"probe_gap_ms"`
	PauseMs             float64   `json:"pause_ms"`                  // Pause(clearCache=false) with a peer fetching
	PeerFetchesDuring   int64     `json:"peer_fetches_during_pause"` // fetch rounds a peer verified while the node was paused
	BlocksServedPaused  uint64    `json:"peer_blocks_served_during_pause"`
	PauseWindowS        float64   `json:"pause_window_s"`
	PendingWhileServing bool      `json:"has_pending_work_while_serving"` // must be false
	PausedLookupMiss    bool      `json:"paused_engine_lookup_miss"`      // the paused node's own engine got MISS
	ShutdownMs          float64   `json:"shutdown_ms"`                    // graceful Close with the peer still fetching
	ShutdownDrainBoundS float64   `json:"shutdown_drain_bound_s"`
	HeartbeatS          float64   `json:"peer_heartbeat_s"` // the peers' heartbeat period; 0: off
	ShutdownErr         string    `json:"shutdown_error,omitempty"`
	PeerRoundsTotal     int64     `json:"peer_fetch_rounds_total"`
	BlocksPerRound      int       `json:"blocks_per_round"`
	BlockBytes          int       `json:"block_bytes"`
}

// RunIdle runs the scenario.
func RunIdle(ctx context.Context, o IdleOptions) (IdleResult, error) {
	res := IdleResult{Peers: o.Peers, WindowS: o.Window.Seconds(), BlocksPerRound: o.Blocks, BlockBytes: o.BlockBytes,
		PauseWindowS: o.PauseWindow.Seconds(), ShutdownDrainBoundS: o.CloseTimeout.Seconds() * 9 / 10}
	switch {
	case o.Heartbeat == 0:
		res.HeartbeatS = peer.DefaultHeartbeatInterval.Seconds()
	case o.Heartbeat > 0:
		res.HeartbeatS = o.Heartbeat.Seconds()
	}
	if o.Peers < 1 || o.Blocks < 1 || o.Slots < o.Blocks || o.Probes < 1 {
		return res, fmt.Errorf("%w: bench idle: peers, blocks, probes ≥ 1 and slots ≥ blocks", messages.ErrBadConfig)
	}
	ctx, cancel, err := childScenario(ctx, &o.Child, o.Timeout)
	if err != nil {
		return res, err
	}
	defer cancel()
	s := &idleSetup{}
	defer s.close()
	if err := s.start(o); err != nil {
		return res, err
	}
	res.BaselineGoroutines = s.sleeper.ready.Goroutines
	steps := []func(context.Context, IdleOptions, *IdleResult) error{s.measureIdle, s.probeLookups, s.pauseUnderLoad, s.shutdownUnderLoad}
	for _, step := range steps {
		if err := step(ctx, o, &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// childScenario readies a scenario that runs children (the idle scenario
// and the engine-poll scenario): *child, when nil, becomes one that runs a
// child of their roles as this executable (`kvtier bench idle child
// ARGS...`), and the scenario's context ends after timeout.
func childScenario(ctx context.Context, child *func(args ...string) *exec.Cmd, timeout time.Duration) (context.Context, context.CancelFunc, error) {
	if *child == nil {
		self, err := os.Executable()
		if err != nil {
			return nil, nil, err
		}
		*child = func(args ...string) *exec.Cmd {
			return exec.Command(self, append([]string{"bench", "idle", "child"}, args...)...)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return ctx, cancel, nil
}

// idleSetup is the scenario's processes: the measured node, its peers and
// the sleeping baseline.
type idleSetup struct {
	sleeper, echo, node, engine *idleChild
	peers                       []*idleChild
	dir                         string // the standalone node's pool file and engine socket
}

// start runs the processes: the peers first (the node's sessions to them
// are up when it says ready), then the node, then waits until every
// peer's session to the node is up too.
func (s *idleSetup) start(o IdleOptions) error {
	var err error
	if s.sleeper, err = startIdleChild(o, "sleep"); err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	if s.echo, err = startIdleChild(o, "echo"); err != nil {
		return fmt.Errorf("echo: %w", err)
	}
	secret := make([]byte, 24)
	_, _ = rand.Read(secret)
	sec := hex.EncodeToString(secret)
	addrs := make([]string, o.Peers+1) // the node's, then each peer's
	ports, err := freeport.Ports(len(addrs))
	if err != nil {
		return err
	}
	for i, port := range ports {
		addrs[i] = fmt.Sprintf("tcp://127.0.0.1:%d", port)
	}
	common := []string{"--secret", sec, "--block-bytes", strconv.Itoa(o.BlockBytes), "--slots", strconv.Itoa(o.Slots),
		"--blocks", strconv.Itoa(o.Blocks), "--heartbeat", o.Heartbeat.String()}
	nodeArgs := append([]string{"node", "--id", "idle", "--listen", addrs[0], "--echo", s.echo.ready.PeerAddr}, common...)
	for i := range o.Peers {
		id := fmt.Sprintf("peer%d", i)
		c, err := startIdleChild(o, append([]string{"peer", "--id", id, "--listen", addrs[i+1], "--peer", "idle=" + addrs[0]}, common...)...)
		if err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
		s.peers = append(s.peers, c)
		nodeArgs = append(nodeArgs, "--peer", id+"="+addrs[i+1])
	}
	if o.Engine {
		if s.dir, err = os.MkdirTemp("", "kvtier-bench-idle-"); err != nil {
			return err
		}
		nodeArgs = append(nodeArgs, "--pool-path", filepath.Join(s.dir, "pool"),
			"--engine-listen", "ipc://"+filepath.Join(s.dir, "engine.sock"))
	}
	if s.node, err = startIdleChild(o, nodeArgs...); err != nil {
		return fmt.Errorf("measured node: %w", err)
	}
	if o.Engine {
		if s.engine, err = startIdleChild(o, "engine", "--connect", s.node.ready.EngineAddr); err != nil {
			return fmt.Errorf("engine: %w", err)
		}
	}
	for _, p := range s.peers {
		if _, err := p.call(idleWait{}); err != nil {
			return err
		}
	}
	return nil
}

// measureIdle counts context switches of the node's process, every peer
// process and the sleeping baseline over the same window.
func (s *idleSetup) measureIdle(_ context.Context, o IdleOptions, res *IdleResult) error {
	for _, c := range s.measured() {
		if _, err := c.call(idleSettle{}); err != nil {
			return err
		}
	}
	time.Sleep(o.Settle) // NB: quiet time for start-up transients, not synchronisation
	pids := []int{s.sleeper.pid()}
	for _, c := range s.measured() {
		pids = append(pids, c.pid())
	}
	before := make([]uint64, len(pids))
	for i, pid := range pids {
		n, _, err := ctxSwitches(pid)
		if err != nil {
			return err
		}
		before[i] = n
	}
	start := time.Now()
	time.Sleep(o.Window) // NB: the measurement window itself
	elapsed := time.Since(start).Seconds()
	rates := make([]float64, len(pids))
	for i, pid := range pids {
		n, threads, err := ctxSwitches(pid)
		if err != nil {
			return err
		}
		rates[i] = float64(n-before[i]) / elapsed
		if i == 1 {
			res.NodeThreads = threads
		}
	}
	res.BaselineCtxswPerS, res.IdleCtxswPerS, res.PeerCtxswPerS = rates[0], rates[1], rates[2:2+len(s.peers)]
	if s.engine != nil {
		res.EngineCtxswPerS, res.Standalone = rates[len(rates)-1], true
	}
	res.WindowS = elapsed
	st, err := s.node.call(idleStatus{})
	res.NodeGoroutines = st.Goroutines
	return err
}

// ctxSwitches sums voluntary and nonvoluntary context switches over every
// thread of pid.
func ctxSwitches(pid int) (total uint64, threads int, err error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		return 0, 0, fmt.Errorf("bench idle: no /proc/%d/task (Linux only): %v", pid, err)
	}
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited
		}
		threads++
		for _, line := range strings.Split(string(b), "\n") {
			name, v, ok := strings.Cut(line, ":")
			if ok && (name == "voluntary_ctxt_switches" || name == "nonvoluntary_ctxt_switches") {
				n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				if err != nil {
					return 0, 0, err
				}
				total += n
			}
		}
	}
	return total, threads, nil
}

// probeLookups times peer lookups from the idle node (idleNode.probe).
func (s *idleSetup) probeLookups(_ context.Context, o IdleOptions, res *IdleResult) error {
	r, err := s.node.call(idleProbe{N: o.Probes, Gap: o.ProbeGap})
	res.PeerLookupP50us, res.PeerLookupP99us, res.PeerLookupSamples = r.P50us, r.P99us, int(r.Rounds)
	res.RawTCPRTTP50us, res.RawTCPRTTP99us, res.ProbeGapMs = r.RawP50us, r.RawP99us, float64(o.ProbeGap.Microseconds())/1000
	return err
}

// pauseUnderLoad has the first peer fetch continuously, pauses the node,
// and counts what that peer fetched and verified while it was paused.
func (s *idleSetup) pauseUnderLoad(_ context.Context, o IdleOptions, res *IdleResult) error {
	p := s.peers[0]
	if _, err := p.call(idleFetch{}); err != nil {
		return err
	}
	r, err := s.node.call(idlePause{})
	if err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	res.PauseMs = r.Ms
	before, st0, err := s.snapshot(p)
	if err != nil {
		return err
	}
	time.Sleep(o.PauseWindow) // NB: the paused window being measured
	after, st1, err := s.snapshot(p)
	if err != nil {
		return err
	}
	if !st1.Paused {
		return errors.New("bench idle: the node is not paused")
	}
	res.PeerFetchesDuring, res.BlocksServedPaused = after.Rounds-before.Rounds, st1.Served-st0.Served
	res.PendingWhileServing, res.PausedLookupMiss = st1.Pending, st1.EngineMiss
	_, err = s.node.call(idleResume{})
	return err
}

// snapshot reads the fetching peer's counters, then the node's status.
func (s *idleSetup) snapshot(p *idleChild) (mark, status idleReply, err error) {
	if mark, err = p.call(idleMark{}); err != nil {
		return mark, status, err
	}
	status, err = s.node.call(idleStatus{})
	return mark, status, err
}

// shutdownUnderLoad closes the node gracefully while the peer fetches.
func (s *idleSetup) shutdownUnderLoad(_ context.Context, o IdleOptions, res *IdleResult) error {
	r, err := s.node.call(idleClose{Timeout: o.CloseTimeout})
	if err != nil {
		return err
	}
	res.ShutdownMs, res.ShutdownErr = r.Ms, r.CloseErr
	m, err := s.peers[0].call(idleMark{})
	res.PeerRoundsTotal = m.Rounds
	return err
}

// measured is the processes whose wakeups are measured, the node first,
// then its peers, then the engine (if any).
func (s *idleSetup) measured() []*idleChild {
	out := append([]*idleChild{s.node}, s.peers...)
	if s.engine != nil {
		out = append(out, s.engine)
	}
	return out
}

func (s *idleSetup) close() {
	if s.engine != nil {
		s.engine.quit()
	}
	if s.node != nil {
		s.node.quit()
	}
	if s.dir != "" {
		defer os.RemoveAll(s.dir)
	}
	for _, p := range s.peers {
		p.quit()
	}
	for _, c := range []*idleChild{s.sleeper, s.echo} {
		if c != nil {
			c.kill()
		}
	}
}

func startIdleChild(o IdleOptions, args ...string) (*idleChild, error) {
	return startChild[idleRequest, idleReply]("bench idle "+args[0], idleRequests, o.Child(args...))
}

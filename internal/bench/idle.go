package bench

// The idle scenario (DESIGN.md §4 rule 5, §9; seed 002): a node with peers
// connected and no traffic should cost no more wakeups than a Go program
// that only sleeps, still answer a peer lookup in well under a
// millisecond, pause in milliseconds while a peer keeps fetching from it,
// and shut down gracefully with that peer still fetching.
//
// The measured node runs in this process; its peers are child processes
// (idlechild.go), and so is the baseline. Context switches are the sum of
// voluntary and nonvoluntary switches over every thread of a process
// (/proc/<pid>/task/*/status), read before and after the same window.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/kvtier/kvtier"
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
	Timeout      time.Duration // whole-run bound
	// Child runs a child process of the scenario with the given arguments
	// (a role, "node" or "sleep", and its flags; see IdleChildMain). Nil:
	// this executable as `kvtier bench idle child ARGS...`.
	Child func(args ...string) *exec.Cmd
}

// DefaultIdleOptions is what `kvtier bench idle` runs with no flags.
func DefaultIdleOptions() IdleOptions {
	return IdleOptions{Peers: 2, Window: 10 * time.Second, Settle: 2 * time.Second, Blocks: 16, BlockBytes: 64 << 10,
		Slots: 256, Probes: 200, ProbeGap: 10 * time.Millisecond, PauseWindow: time.Second,
		CloseTimeout: 5 * time.Second, Timeout: 5 * time.Minute}
}

// IdleResult is the scenario's report.
type IdleResult struct {
	IdleCtxswPerS       float64   `json:"idle_ctxsw_per_s"`     // the node's process, peers connected, no traffic
	BaselineCtxswPerS   float64   `json:"baseline_ctxsw_per_s"` // a Go program that only sleeps, same window
	PeerCtxswPerS       []float64 `json:"peer_ctxsw_per_s"`     // each peer process, same window
	WindowS             float64   `json:"window_s"`
	Peers               int       `json:"peers"`
	NodeThreads         int       `json:"node_threads"`
	NodeGoroutines      int       `json:"node_goroutines"`
	BaselineGoroutines  int       `json:"baseline_goroutines"`
	PeerLookupP50us     float64   `json:"peer_lookup_p50_us"` // engine Lookup of a key no one holds → every peer answered
	PeerLookupP99us     float64   `json:"peer_lookup_p99_us"`
	PeerLookupSamples   int       `json:"peer_lookup_samples"`
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
	if o.Child == nil {
		self, err := os.Executable()
		if err != nil {
			return res, err
		}
		o.Child = func(args ...string) *exec.Cmd {
			return exec.Command(self, append([]string{"bench", "idle", "child"}, args...)...)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()

	sleeper, err := startIdleChild(o, "sleep")
	if err != nil {
		return res, fmt.Errorf("baseline: %w", err)
	}
	defer sleeper.kill()
	res.BaselineGoroutines = sleeper.ready.Goroutines

	s, err := openIdleSetup(ctx, o)
	if err != nil {
		return res, err
	}
	defer s.close()

	if err := s.measureIdle(o, sleeper, &res); err != nil {
		return res, err
	}
	if err := s.probeLookups(ctx, o, &res); err != nil {
		return res, err
	}
	if err := s.pauseUnderLoad(ctx, o, &res); err != nil {
		return res, err
	}
	s.shutdownUnderLoad(o, &res)
	return res, nil
}

// idleSetup is the measured node and its peer processes.
type idleSetup struct {
	node   *kvtier.Node
	m      kvtier.Manager
	peers  []*idleChild
	closed bool
}

func openIdleSetup(ctx context.Context, o IdleOptions) (*idleSetup, error) {
	secret := make([]byte, 24)
	_, _ = rand.Read(secret)
	sec := hex.EncodeToString(secret)
	// The node dials its peers and they dial it: reserve their ports first.
	addrs := make([]string, o.Peers)
	static := make([]kvtier.PeerAddr, o.Peers)
	for i := range addrs {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		addrs[i] = fmt.Sprintf("tcp://127.0.0.1:%d", port)
		static[i] = kvtier.PeerAddr{NodeID: fmt.Sprintf("peer%d", i), Addr: addrs[i]}
	}
	node, err := kvtier.Open(ctx, kvtier.Config{PoolBytes: int64(o.Slots) * int64(o.BlockBytes), BlockBytes: o.BlockBytes,
		Peers: kvtier.PeersConfig{NodeID: "idle", Listen: "tcp://127.0.0.1:0", Secret: sec, Static: static,
			HeartbeatInterval: o.Heartbeat}})
	if err != nil {
		return nil, err
	}
	s := &idleSetup{node: node, m: node.Manager()}
	if err := s.storeBlocks(ctx, o); err != nil {
		s.close()
		return nil, err
	}
	for i, addr := range addrs {
		c, err := startIdleChild(o, "node", "--id", static[i].NodeID, "--listen", addr, "--secret", sec,
			"--peer", "idle="+node.PeerAddr(), "--block-bytes", strconv.Itoa(o.BlockBytes),
			"--slots", strconv.Itoa(o.Slots), "--blocks", strconv.Itoa(o.Blocks), "--heartbeat", o.Heartbeat.String())
		if err != nil {
			s.close()
			return nil, fmt.Errorf("peer %d: %w", i, err)
		}
		s.peers = append(s.peers, c)
	}
	ids := make([]string, len(static))
	for i, p := range static {
		ids[i] = p.NodeID
	}
	if err := node.WaitPeers(ctx, ids...); err != nil {
		s.close()
		return nil, fmt.Errorf("the node's sessions to its peers: %w", err)
	}
	return s, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// storeBlocks stores the blocks peers fetch, through the node's engine API.
func (s *idleSetup) storeBlocks(ctx context.Context, o IdleOptions) error {
	keys := keyRange(0, o.Blocks)
	plan, err := s.m.PrepareStore(ctx, &messages.ReqContext{RequestID: "store"}, keys)
	if err != nil {
		return err
	}
	for i, k := range plan.ToStore {
		idleFill(s.m.Pool().Slot(plan.Slots[i]), k)
	}
	for w := range plan.Workers {
		if err := s.m.JobDone(ctx, plan.Job, w, true); err != nil {
			return err
		}
	}
	return nil
}

// measureIdle counts context switches of the node's process, every peer
// process and the sleeping baseline over the same window.
func (s *idleSetup) measureIdle(o IdleOptions, sleeper *idleChild, res *IdleResult) error {
	time.Sleep(o.Settle) // NB: lets start-up transients (handshake retries, the first GCs) pass
	// Settle the runtime too: a scavenger still returning start-up memory
	// would be measured as the node's.
	runtime.GC()
	debug.FreeOSMemory()
	pids := []int{os.Getpid(), sleeper.pid()}
	for _, p := range s.peers {
		pids = append(pids, p.pid())
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
		if i == 0 {
			res.NodeThreads = threads
		}
	}
	res.NodeGoroutines = runtime.NumGoroutine()
	res.IdleCtxswPerS, res.BaselineCtxswPerS, res.PeerCtxswPerS = rates[0], rates[1], rates[2:]
	res.WindowS = elapsed
	return nil
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

// probeLookups times engine lookups of keys no node holds, each after an
// idle gap: the node asks every peer and the lookup settles (MISS) once
// all have answered — the whole peer round trip from an idle node to idle
// peers, event-driven on both sides.
func (s *idleSetup) probeLookups(ctx context.Context, o IdleOptions, res *IdleResult) error {
	lat := make([]time.Duration, 0, o.Probes)
	for i := range o.Probes {
		time.Sleep(o.ProbeGap) // NB: the node and its peers go idle again
		req := &messages.ReqContext{RequestID: fmt.Sprintf("probe-%d", i)}
		k := keyRange(1<<30+i, 1)
		start := time.Now()
		st, err := s.m.Lookup(ctx, req, k, true)
		if err != nil {
			return err
		}
		if st[0] != messages.Retry {
			return fmt.Errorf("bench idle: probe lookup answered %v, want RETRY (asked the peers)", st[0])
		}
		if err := s.node.TieringIdle(ctx); err != nil {
			return err
		}
		d := time.Since(start)
		if st, err = s.m.Lookup(ctx, req, k, true); err != nil {
			return err
		}
		if st[0] != messages.Miss {
			return fmt.Errorf("bench idle: settled probe is %v, want MISS", st[0])
		}
		if err := s.m.RequestFinished(ctx, req); err != nil {
			return err
		}
		lat = append(lat, d)
	}
	res.PeerLookupP50us, res.PeerLookupP99us, res.PeerLookupSamples = percentileUs(lat, 0.50), percentileUs(lat, 0.99), len(lat)
	return nil
}

// pauseUnderLoad has the first peer fetch continuously, pauses the node,
// and counts what that peer fetched and verified while it was paused.
func (s *idleSetup) pauseUnderLoad(ctx context.Context, o IdleOptions, res *IdleResult) error {
	peer := s.peers[0]
	if _, err := peer.call(idleCmd{Op: "fetch"}); err != nil {
		return err
	}
	start := time.Now()
	if err := s.m.Pause(ctx, false); err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	res.PauseMs = float64(time.Since(start).Microseconds()) / 1000
	before, err := peer.call(idleCmd{Op: "mark"})
	if err != nil {
		return err
	}
	served0, err := s.served(ctx)
	if err != nil {
		return err
	}
	time.Sleep(o.PauseWindow) // NB: the paused window being measured
	after, err := peer.call(idleCmd{Op: "mark"})
	if err != nil {
		return err
	}
	served1, err := s.served(ctx)
	if err != nil {
		return err
	}
	res.PeerFetchesDuring, res.BlocksServedPaused = after.Rounds-before.Rounds, served1-served0
	if res.PendingWhileServing, err = s.m.HasPendingWork(ctx); err != nil {
		return err
	}
	own := &messages.ReqContext{RequestID: "own"}
	st, err := s.m.Lookup(ctx, own, keyRange(0, 1), true)
	if err != nil {
		return err
	}
	res.PausedLookupMiss = st[0] == messages.Miss
	if err := s.m.Resume(ctx); err != nil {
		return err
	}
	return s.m.RequestFinished(ctx, own)
}

// served is the blocks the node has written into its peers' pools.
func (s *idleSetup) served(ctx context.Context) (uint64, error) {
	ps, err := s.node.PeerStats(ctx)
	var n uint64
	for _, p := range ps {
		n += p.Served
	}
	return n, err
}

// shutdownUnderLoad closes the node gracefully while the peer fetches.
func (s *idleSetup) shutdownUnderLoad(o IdleOptions, res *IdleResult) {
	ctx, cancel := context.WithTimeout(context.Background(), o.CloseTimeout)
	defer cancel()
	start := time.Now()
	err := s.node.Close(ctx)
	res.ShutdownMs = float64(time.Since(start).Microseconds()) / 1000
	s.closed = true
	if err != nil {
		res.ShutdownErr = err.Error()
	}
	if r, err := s.peers[0].call(idleCmd{Op: "mark"}); err == nil {
		res.PeerRoundsTotal = r.Rounds
	}
}

func (s *idleSetup) close() {
	for _, p := range s.peers {
		p.quit()
	}
	if !s.closed {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.node.Close(ctx)
	}
}

// idleChild is one child process.
type idleChild struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *json.Decoder
	ready idleReply
}

func startIdleChild(o IdleOptions, args ...string) (*idleChild, error) {
	cmd := o.Child(args...)
	cmd.Stderr = os.Stderr
	cmd.WaitDelay = 5 * time.Second
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &idleChild{cmd: cmd, in: in, out: json.NewDecoder(bufio.NewReader(out))}
	if err := c.out.Decode(&c.ready); err != nil {
		c.kill()
		return nil, fmt.Errorf("child %s did not start: %w", args[0], err)
	}
	return c, nil
}

func (c *idleChild) pid() int { return c.cmd.Process.Pid }

func (c *idleChild) call(cmd idleCmd) (idleReply, error) {
	b, err := json.Marshal(cmd)
	if err != nil {
		return idleReply{}, err
	}
	if _, err := c.in.Write(append(b, '\n')); err != nil {
		return idleReply{}, err
	}
	var r idleReply
	if err := c.out.Decode(&r); err != nil {
		return r, fmt.Errorf("child %d: %w", c.pid(), err)
	}
	if !r.OK {
		return r, fmt.Errorf("child %d: %s", c.pid(), r.Err)
	}
	return r, nil
}

// quit asks a peer to close its node and exit; kills it if it does not.
func (c *idleChild) quit() {
	_, _ = c.call(idleCmd{Op: "quit"})
	_ = c.in.Close()
	c.wait(15 * time.Second)
}

func (c *idleChild) kill() {
	_ = c.cmd.Process.Kill()
	c.wait(15 * time.Second)
}

func (c *idleChild) wait(d time.Duration) {
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			fmt.Fprintln(os.Stderr, "bench idle: child:", err)
		}
	case <-time.After(d):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

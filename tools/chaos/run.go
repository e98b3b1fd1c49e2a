package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tiers/obj/objtest"
	"github.com/kvtier/kvtier/tools/sim"
)

// Run runs a scenario for opts.Duration under its fault plan, lets it go
// quiet, checks the invariants and reports. It returns an error only when
// the run could not be made (no S3 server, a node that would not open);
// broken invariants are in the report. With opts.Shrink set, a violation
// is shrunk to the smallest fault sequence found that reproduces it.
func Run(ctx context.Context, opts Options) (*Report, error) {
	opts = opts.withDefaults()
	scenario, err := ScenarioByName(opts.Scenario)
	if err != nil {
		return nil, err
	}
	if err := fs.ValidLayout(opts.FSLayout); err != nil {
		return nil, err
	}
	for _, k := range opts.Kinds {
		if !slices.Contains(scenario.Kinds(), k) {
			return nil, fmt.Errorf("fault kind %q is not supported by scenario %q", k, scenario.Name())
		}
	}
	// NB: one server and one directory for the run and every replay of
	// its shrinking.
	if opts.Dir == "" {
		dir, err := os.MkdirTemp("", "kvtier-chaos-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		opts.Dir = dir
	}
	if opts.S3 == nil {
		srv, err := launchS3(ctx, opts.Versitygw, filepath.Join(opts.Dir, "s3"))
		if err != nil {
			return nil, err
		}
		defer srv.Stop()
		opts.S3 = srv
	}
	rep, err := runOnce(ctx, opts, scenario)
	if err != nil || rep.Violations == 0 || opts.Shrink <= 0 {
		return rep, err
	}
	rep.Shrunk = shrink(ctx, opts, rep)
	return rep, nil
}

// runOnce is one run, without shrinking.
func runOnce(ctx context.Context, opts Options, scenario Scenario) (*Report, error) {
	dir, err := os.MkdirTemp(opts.Dir, "run-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	e := &env{s3: opts.S3, dir: dir}
	baseGoroutines, baseHeap := settleRuntime()
	ledger := supervision.NewLedger(nil)
	rs := &runState{opts: opts, nodeCfg: singleConfig().WithDefaults(), ledger: ledger,
		gate: newGate(opts.plan(), ledger, opts.Kinds, opts.Spare), stats: newStats(), work: newWorkload(opts.Seed),
		ns: sim.DefaultLayout.Namespace(), hooks: opts.Hooks, checked: map[string]string{}, disk: &disk{}}

	rs.start = time.Now() // NB: the ledger's time base too, give or take microseconds
	nodes, err := scenario.open(ctx, rs, e)
	if err != nil {
		runClosers(rs)
		return nil, err
	}
	closed := false
	defer func() {
		if !closed {
			closeNodes(rs, nodes)
			runClosers(rs)
		}
	}()

	rs.gate.armed.Store(true)
	stopOutages := startOutages(rs, e.s3)
	stopJumps, stopDiskFull := startClockJumps(rs, nodes), startDiskFull(rs)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range opts.Engine.Engines {
		n := nodes[i%len(nodes)]
		eng := &engine{id: i, cfg: opts.Engine, run: rs, node: n, mgr: n.mgr, pool: n.mgr.Pool(),
			gpu: sim.NewLRU(opts.Engine.GPUBlocks), drain: i < len(nodes), gen: n.gen.Load()}
		wg.Add(1)
		go func() {
			defer wg.Done()
			eng.loop(ctx, stop)
		}()
	}
	if opts.Hooks.LeakGoroutine != nil {
		go func() { <-opts.Hooks.LeakGoroutine }()
	}
	runFor(ctx, opts, nodes)
	rs.gate.armed.Store(false) // the run drains without new faults
	stopOutages()
	stopJumps()
	stopDiskFull()
	for _, stop := range rs.stoppers {
		stop()
	}
	close(stop)
	wg.Wait()
	rs.stopped = time.Now()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("chaos run: %w", err)
	}
	ranFor := time.Since(rs.start)

	for _, n := range nodes {
		checkQuiet(ctx, rs, n)
		checkDisk(rs, n)
		checkEvents(ctx, rs, n)
		checkCommitted(ctx, rs, n)
	}
	checkPeers(ctx, rs, nodes)
	checkDeadlines(rs)
	closed = true
	closeNodes(rs, nodes)
	runClosers(rs)
	checkRuntime(rs, baseGoroutines, baseHeap)
	return report(rs, nodes, ranFor), nil
}

// runFor waits out the run's duration, running the Mid hook half way.
func runFor(ctx context.Context, opts Options, nodes []*nodeUnderTest) {
	end := time.NewTimer(opts.Duration)
	defer end.Stop()
	if opts.Hooks.Mid != nil {
		mid := time.NewTimer(opts.Duration / 2)
		defer mid.Stop()
		select {
		case <-mid.C:
			opts.Hooks.Mid(ctx, nodes[0].node, nodes[0].inj)
		case <-end.C:
			return
		case <-ctx.Done():
			return
		}
	}
	select {
	case <-end.C:
	case <-ctx.Done():
	}
}

// launchS3 starts a versitygw over dir.
func launchS3(ctx context.Context, bin, dir string) (*objtest.Server, error) {
	if bin == "" {
		var err error
		if bin, err = objtest.Binary(); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return objtest.Launch(ctx, bin, dir)
}

// startOutages kills the S3 server for a second or three whenever the plan
// says so (one decision per second of run); the returned func stops it and
// waits until the server is back.
func startOutages(rs *runState, s3 *objtest.Server) (stop func()) {
	if !rs.gate.enabled[supervision.FaultObjOutage] {
		return func() {}
	}
	return everyTick(time.Second, func(done <-chan struct{}) bool {
		d := rs.gate.decide("obj outage", supervision.FaultObjOutage)
		if d.None() {
			return true
		}
		s3.Kill()
		down := time.NewTimer(time.Second + time.Duration(d.Arg%uint64(2*time.Second)))
		select {
		case <-down.C:
		case <-done:
			down.Stop()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s3.Restart(ctx); err != nil {
			rs.note("S3 server did not come back after an outage: %v", err)
		}
		return true
	})
}

// everyTick calls fn once per period in a goroutine of its own until the
// returned stop is called (stop waits for it) or fn returns false; done,
// closed by stop, lets fn cut a wait of its own short.
func everyTick(period time.Duration, fn func(done <-chan struct{}) bool) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			if !fn(done) {
				return
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

// closeNodes closes every node, its subscriber and its injector.
func closeNodes(rs *runState, nodes []*nodeUnderTest) {
	for _, n := range nodes {
		if n.pub != nil {
			if err := n.pub.stop(); err != nil {
				rs.note("events subscriber of %s ended with %v", n.name, err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := n.node.Close(ctx); err != nil {
			rs.violate(n, invClose, "close: %v", err)
		} else {
			rs.pass(invClose)
		}
		cancel()
		n.inj.Close()
	}
}

// runClosers releases what the scenario holds beside its nodes.
func runClosers(rs *runState) {
	for _, c := range rs.closers {
		c()
	}
	rs.closers = nil
}

// settleRuntime collects garbage and returns the live goroutines and
// heap, the baselines the run must come back to.
func settleRuntime() (map[string]string, uint64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return goroutines(), m.HeapAlloc
}

// knownLeaks are goroutines the check leaves out: those known to outlive
// what started them, upstream (zmq4 v0.17.0 never ends a PUB socket's
// writer, events/publisher.go), and the harness's own S3 server, which
// stands in for a remote one and outlives every run: its front's relays
// (internal/testutil/front) and the wait for its process, restarted
// during an outage.
var knownLeaks = []string{"github.com/go-zeromq/zmq4.(*pubMWriter).run", "testutil/front.(*Front).", "objtest.(*Server)."}

// goroutines are the live goroutines, known leaks aside: each one's stack
// by its id (ids are never reused in a process).
func goroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	live := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		known := false
		for _, k := range knownLeaks {
			known = known || strings.Contains(g, k)
		}
		if id, ok := goroutineID(g); ok && !known {
			live[id] = g
		}
	}
	return live
}

// goroutineID is the id in a stack's header ("goroutine 42 [select]:").
func goroutineID(stack string) (string, bool) {
	rest, ok := strings.CutPrefix(stack, "goroutine ")
	if !ok {
		return "", false
	}
	id, _, ok := strings.Cut(rest, " ")
	return id, ok
}

// startedSince are the goroutines of live not in base: started during the
// run and still there.
func startedSince(base, live map[string]string) []string {
	var out []string
	for id, g := range live {
		if _, ok := base[id]; !ok {
			out = append(out, g)
		}
	}
	sort.Strings(out)
	return out
}

// faultRecordBytes is what the ledger keeps per recorded fault, generously.
const faultRecordBytes = 512

// checkRuntime checks that no goroutine the run started outlives it
// (waiting a bounded while for exiting ones) and the heap comes back to
// within its bound. NB: by identity, not by count: a goroutine of the
// baseline that ends meanwhile (a previous run's connection closing late)
// must not hide one the run leaked.
func checkRuntime(rs *runState, baseGoroutines map[string]string, baseHeap uint64) {
	wait := 10 * time.Second
	if rs.opts.QuietTimeout > 0 {
		wait = min(wait, rs.opts.QuietTimeout)
	}
	deadline := time.Now().Add(wait)
	var left []string
	for backoff := time.Millisecond; ; backoff = min(2*backoff, 100*time.Millisecond) {
		if left = startedSince(baseGoroutines, goroutines()); len(left) == 0 || time.Now().After(deadline) {
			break
		}
		<-time.After(backoff) // NB: goroutines offer no exit notification
	}
	if len(left) > 0 {
		stacks := strings.Join(left, "\n\n")
		if len(stacks) > 8000 {
			stacks = stacks[:8000] + "..."
		}
		rs.violate(nil, invGoroutines, "%d goroutines started during the run outlive it (%d before the run):\n%s", len(left), len(baseGoroutines), stacks)
	} else {
		rs.pass(invGoroutines)
	}
	_, heap := settleRuntime()
	// NB: the run's own record (every fault injected) is still live.
	bound := rs.opts.MemBound + uint64(rs.ledger.Total())*faultRecordBytes
	if heap > baseHeap+bound {
		rs.violate(nil, invMemory, "heap %d MiB after close, %d MiB before the run (bound +%d MiB)",
			heap>>20, baseHeap>>20, bound>>20)
	} else {
		rs.pass(invMemory)
	}
}

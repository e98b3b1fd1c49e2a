package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/client"
	"github.com/kvtier/kvtier/tools/sim"
)

// simOptions are the flags of `kvtier sim`.
type simOptions struct {
	seed       uint64
	requests   int
	trace      string
	traceLimit int
	timeScale  float64
	realtime   bool
	gpuBlocks  int
	cpuBlocks  int
	blockBytes int
	workers    int
	stepTime   time.Duration
	copyTime   time.Duration
	maxRunning int
	maxWait    int
	policy     string
	poolPath   string
	touch      bool
	settle     bool
	json       bool
	noProgress bool
	connect    string
	tiers      tierFlags              // secondary tiers of the embedded node (sim_tiers.go)
	events     eventFlags             // KV events of the embedded node (sim_events.go)
	set        func(name string) bool // whether a flag was given
}

// errUnhealthy makes the command exit non-zero after printing the summary.
var errUnhealthy = errors.New("run not clean: corrupt blocks or leaked pins, leases or pending writes")

// newSimCmd builds `kvtier sim`.
func newSimCmd() *cobra.Command {
	o := simOptions{}
	def := sim.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Drive an embedded node (or a kvtierd with --connect) as an inference engine's scheduler would",
		Long: `sim runs an engine simulator against an embedded kvtier node: a GPU cache with
its own LRU, a multi-turn workload with shared prefixes (or a Mooncake trace),
lookups, loads and stores issued as jobs with per-worker reports after a
simulated copy time, on a virtual clock. Every block's bytes are a function of
its key, written on store and verified on every load. It exits non-zero if a
loaded block was corrupt or the node leaked pins, leases or pending writes.

With --connect ADDR it drives a running kvtierd through its engine endpoint
instead (standalone mode): the same engine, the same calls, every byte copied
through the daemon's shared pool and verified. The pool's geometry then comes
from the daemon's Hello; the defaults of --cpu-blocks and --block-bytes are
the node's own defaults (kvtier.DefaultPoolBytes / DefaultBlockBytes), so
"kvtier sim" and "kvtier sim --connect" against a kvtierd on its defaults run
the same node and print the same counts for the same seed. Run it against a
fresh daemon: a warm one starts with blocks cached.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runSim(cmd.Context(), o, cmd.OutOrStdout()) },
	}
	f := cmd.Flags()
	f.Uint64Var(&o.seed, "seed", 1, "seed of the synthetic workload (same seed, same counts)")
	f.IntVar(&o.requests, "requests", 3000, "synthetic requests to run")
	f.StringVar(&o.trace, "trace", "", "replay a Mooncake FAST'25 trace (JSONL) instead of the synthetic workload")
	f.IntVar(&o.traceLimit, "trace-limit", 0, "replay only the first N requests of the trace (0 = all)")
	f.Float64Var(&o.timeScale, "time-scale", 0, "replay arrivals at timestamp/SCALE on the virtual clock (0 = as fast as the node allows)")
	f.BoolVar(&o.realtime, "realtime", false, "pace steps so the virtual clock follows the wall clock")
	f.IntVar(&o.gpuBlocks, "gpu-blocks", def.GPUBlocks, "blocks in the simulated GPU cache")
	f.IntVar(&o.cpuBlocks, "cpu-blocks", kvtier.DefaultPoolBytes/kvtier.DefaultBlockBytes, "slots in kvtier's CPU pool (default: the node's default pool)")
	f.IntVar(&o.blockBytes, "block-bytes", kvtier.DefaultBlockBytes, "bytes per block (default: the node's default)")
	f.IntVar(&o.workers, "workers", def.Workers, "worker reports per job (tensor-parallel workers)")
	f.DurationVar(&o.stepTime, "step-time", def.StepTime, "virtual duration of one model step")
	f.DurationVar(&o.copyTime, "copy-time", def.CopyTime, "virtual copy time per block of a job")
	f.IntVar(&o.maxRunning, "max-running", def.MaxRunning, "requests scheduled at once")
	f.IntVar(&o.maxWait, "max-wait", def.MaxWait, "steps a lookup waits on RETRY/HIT_PENDING before recomputing")
	f.StringVar(&o.policy, "policy", "lru", "CPU tier eviction policy: lru, arc or prefix (a chain's deepest blocks first)")
	f.StringVar(&o.poolPath, "pool-path", "", "shared-memory file of the pool (empty: anonymous memfd)")
	f.BoolVar(&o.touch, "touch-finished", def.TouchFinished, "Re-rank a finished request's blocks as vLLM does (one touch of every key it used, its head most recent)")
	f.BoolVar(&o.settle, "settle", def.Settle, "poll Stats after each store job until it is committed (the node already answers a job's last report after its commit)")
	f.BoolVar(&o.json, "json", false, "print the summary as one JSON object on the last line")
	f.BoolVar(&o.noProgress, "no-progress", false, "no progress bar even on a terminal")
	o.events.register(f)
	f.StringVar(&o.connect, "connect", "", "drive the kvtierd whose engine endpoint is ADDR (ipc:///path or tcp://127.0.0.1:PORT) instead of an embedded node")
	o.set = func(name string) bool { return f.Changed(name) }
	addTierFlags(f, &o.tiers)
	return cmd
}

// runSim loads the workload, opens a node, runs the engine and prints.
func runSim(ctx context.Context, o simOptions, out io.Writer) error {
	ctx, stop := untilInterrupted(ctx)
	defer stop()
	reqs, mode, err := loadWorkload(o)
	if err != nil {
		return err
	}
	mgr, node, closeNode, err := openManager(ctx, o)
	if err != nil {
		return err
	}
	cfg := engineConfig(o)
	bar := newBar(o, len(reqs))
	if bar != nil {
		cfg.Progress = func(done, _ int) { _ = bar.Set(done) }
	}
	sum, runErr := sim.Run(ctx, mgr, reqs, cfg)
	if bar != nil {
		_ = bar.Finish()
		fmt.Fprintln(os.Stderr)
	}
	if runErr == nil {
		runErr = o.events.finish(node) // may hold the node until a signal
	}
	closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	closeErr := closeNode(closeCtx)
	if runErr != nil {
		return runErr
	}
	sum.Mode, sum.Seed = mode, o.seed
	if mode == "trace" || len(reqs) <= 100000 {
		ideal := sim.IdealHitRate(reqs)
		sum.IdealHitRate = &ideal
	}
	if err := printSummary(out, sum, o.json); err != nil {
		return err
	}
	if closeErr != nil {
		return fmt.Errorf("close node: %w", closeErr)
	}
	if !sum.Healthy() {
		return errUnhealthy
	}
	return nil
}

// openManager opens an embedded node, or with --connect dials a daemon and
// checks that the geometry flags given agree with its pool.
func openManager(ctx context.Context, o simOptions) (kvtier.Manager, *kvtier.Node, func(context.Context) error, error) {
	if o.connect == "" {
		node, err := kvtier.Open(ctx, nodeConfig(o))
		if err != nil {
			return nil, nil, nil, fmt.Errorf("open node: %w", err)
		}
		return node.Manager(), node, node.Close, nil
	}
	if o.events.embeddedOnly() {
		return nil, nil, nil, fmt.Errorf("--events-* and --inventory configure an embedded node; with --connect use the daemon's --events-endpoint")
	}
	for _, name := range []string{"policy", "pool-path", "fs-root", "obj-endpoint"} {
		if o.set != nil && o.set(name) {
			return nil, nil, nil, fmt.Errorf("--%s configures an embedded node; with --connect the daemon's config applies", name)
		}
	}
	dialCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := dialSizing(dialCtx, o.connect, client.Options{Name: "kvtier sim", BlockBytes: o.blockBytes})
	if err != nil {
		return nil, nil, nil, err
	}
	h := c.Hello()
	if o.set != nil && ((o.set("cpu-blocks") && o.cpuBlocks != h.Slots) || (o.set("block-bytes") && o.blockBytes != h.BlockBytes)) {
		_ = c.Close(ctx)
		return nil, nil, nil, fmt.Errorf("the daemon's pool is %d slots of %d bytes; --cpu-blocks %d --block-bytes %d disagree",
			h.Slots, h.BlockBytes, o.cpuBlocks, o.blockBytes)
	}
	return c, nil, c.Close, nil
}

// loadWorkload reads the trace, or generates the synthetic workload.
func loadWorkload(o simOptions) ([]sim.Request, string, error) {
	if o.trace == "" {
		return sim.Synthetic(sim.DefaultSynthetic(o.seed, o.requests)), "synthetic", nil
	}
	reqs, err := sim.ReadTraceFile(o.trace, o.traceLimit)
	if err != nil {
		return nil, "", err
	}
	return reqs, "trace", nil
}

// nodeConfig is the embedded node's configuration.
func nodeConfig(o simOptions) kvtier.Config {
	cfg := kvtier.Config{
		PoolPath:   o.poolPath,
		PoolBytes:  int64(o.cpuBlocks) * int64(o.blockBytes),
		BlockBytes: o.blockBytes,
		Policy:     o.policy,
		JobWorkers: max(o.workers, 1),
	}
	o.tiers.apply(&cfg)
	o.events.apply(&cfg)
	return cfg
}

// engineConfig is the simulated engine's configuration.
func engineConfig(o simOptions) sim.Config {
	cfg := sim.DefaultConfig()
	cfg.GPUBlocks, cfg.Workers = o.gpuBlocks, o.workers
	cfg.StepTime, cfg.CopyTime = o.stepTime, o.copyTime
	cfg.MaxRunning, cfg.MaxWait = o.maxRunning, o.maxWait
	cfg.TimeScale, cfg.Realtime, cfg.TouchFinished, cfg.Settle = o.timeScale, o.realtime, o.touch, o.settle
	return cfg
}

// newBar returns a progress bar on stderr when it is a terminal, else nil.
func newBar(o simOptions, total int) *progressbar.ProgressBar {
	if o.noProgress || !isTerminal(os.Stderr) {
		return nil
	}
	return progressbar.NewOptions(total,
		progressbar.OptionSetWriter(os.Stderr),
		progressbar.OptionSetDescription("requests"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(100*time.Millisecond))
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// printSummary prints the human summary, or with asJSON one JSON line.
func printSummary(out io.Writer, sum sim.Summary, asJSON bool) error {
	if asJSON {
		return sum.WriteJSON(out)
	}
	sum.WriteText(out)
	return nil
}

// dialSizing dials addr, declaring opts.BlockBytes; a daemon that sizes its
// slots from the first engine answers that hello SIZING and reopens on the
// same address, so after a SIZING any failure is tried again (every 50 ms)
// until ctx ends.
func dialSizing(ctx context.Context, addr string, opts client.Options) (*client.Client, error) {
	sizing := false
	for {
		c, err := client.Dial(ctx, addr, opts)
		if err == nil || (!sizing && !errors.Is(err, messages.ErrSizing)) {
			return c, err
		}
		sizing = true
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (the daemon was sizing its slots)", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/internal/sim"
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
}

// errUnhealthy makes the command exit non-zero after printing the summary.
var errUnhealthy = errors.New("run not clean: corrupt blocks or leaked pins, leases or pending writes")

// newSimCmd builds `kvtier sim`.
func newSimCmd() *cobra.Command {
	o := simOptions{}
	def := sim.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Drive an embedded node as an inference engine's scheduler would",
		Long: `sim runs an engine simulator against an embedded kvtier node: a GPU cache with
its own LRU, a multi-turn workload with shared prefixes (or a Mooncake trace),
lookups, loads and stores issued as jobs with per-worker reports after a
simulated copy time, on a virtual clock. Every block's bytes are a function of
its key, written on store and verified on every load. It exits non-zero if a
loaded block was corrupt or the node leaked pins, leases or pending writes.`,
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
	f.IntVar(&o.cpuBlocks, "cpu-blocks", 20000, "slots in kvtier's CPU pool")
	f.IntVar(&o.blockBytes, "block-bytes", 16<<10, "bytes per block")
	f.IntVar(&o.workers, "workers", def.Workers, "worker reports per job (tensor-parallel workers)")
	f.DurationVar(&o.stepTime, "step-time", def.StepTime, "virtual duration of one model step")
	f.DurationVar(&o.copyTime, "copy-time", def.CopyTime, "virtual copy time per block of a job")
	f.IntVar(&o.maxRunning, "max-running", def.MaxRunning, "requests scheduled at once")
	f.IntVar(&o.maxWait, "max-wait", def.MaxWait, "steps a lookup waits on RETRY/HIT_PENDING before recomputing")
	f.StringVar(&o.policy, "policy", "lru", "CPU tier eviction policy: lru or arc")
	f.StringVar(&o.poolPath, "pool-path", "", "shared-memory file of the pool (empty: anonymous memfd)")
	f.BoolVar(&o.touch, "touch-gpu-hits", def.TouchGPUHits, "Touch blocks found in the GPU cache so the CPU tier's recency follows use")
	f.BoolVar(&o.settle, "settle", def.Settle, "poll Stats after each store job until it is committed (the node already answers a job's last report after its commit)")
	f.BoolVar(&o.json, "json", false, "print the summary as one JSON object on the last line")
	f.BoolVar(&o.noProgress, "no-progress", false, "no progress bar even on a terminal")
	return cmd
}

// runSim loads the workload, opens a node, runs the engine and prints.
func runSim(ctx context.Context, o simOptions, out io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	reqs, mode, err := loadWorkload(o)
	if err != nil {
		return err
	}
	node, err := kvtier.Open(ctx, nodeConfig(o))
	if err != nil {
		return fmt.Errorf("open node: %w", err)
	}
	cfg := engineConfig(o)
	bar := newBar(o, len(reqs))
	if bar != nil {
		cfg.Progress = func(done, _ int) { _ = bar.Set(done) }
	}
	sum, runErr := sim.Run(ctx, node.Manager(), reqs, cfg)
	if bar != nil {
		_ = bar.Finish()
		fmt.Fprintln(os.Stderr)
	}
	closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	closeErr := node.Close(closeCtx)
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
	return kvtier.Config{
		PoolPath:   o.poolPath,
		PoolBytes:  int64(o.cpuBlocks) * int64(o.blockBytes),
		BlockBytes: o.blockBytes,
		Policy:     o.policy,
		JobWorkers: max(o.workers, 1),
	}
}

// engineConfig is the simulated engine's configuration.
func engineConfig(o simOptions) sim.Config {
	cfg := sim.DefaultConfig()
	cfg.GPUBlocks, cfg.Workers = o.gpuBlocks, o.workers
	cfg.StepTime, cfg.CopyTime = o.stepTime, o.copyTime
	cfg.MaxRunning, cfg.MaxWait = o.maxRunning, o.maxWait
	cfg.TimeScale, cfg.Realtime, cfg.TouchGPUHits, cfg.Settle = o.timeScale, o.realtime, o.touch, o.settle
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

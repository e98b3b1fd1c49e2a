package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/internal/chaos"
	"github.com/kvtier/kvtier/supervision"
)

// chaosOptions are the flags of `kvtier chaos`.
type chaosOptions struct {
	scenario  string
	seed      uint64
	duration  time.Duration
	faults    string
	rate      float64
	maxDelay  time.Duration
	engines   int
	spare     []string
	json      bool
	shrink    time.Duration
	shrinkOut string
	replay    string
	dir       string
	versitygw string
	verbose   bool
}

// errViolations makes the command exit non-zero after printing the report.
var errViolations = errors.New("invariants violated")

func newChaosCmd() *cobra.Command {
	o := chaosOptions{}
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Run a scenario under injected faults and check kvtier's invariants",
		Long: `chaos runs a scenario — by default "peers": three embedded nodes, each with
its CPU, fs and obj tiers (obj against a versitygw S3 server it starts) and a
P2P tier dialing the other two; "single" is one node without peers — driven
by simulated engines, for
--duration, injecting the fault kinds of --faults from a plan seeded by
--seed: messages dropped, delayed, duplicated or reordered where the design
says they may be (docs/CHAOS.md), actors panicking, engine jobs stalling,
filesystem and S3 calls failing, slowing down or returning flipped bits, the
S3 server going away, peer connections cut, data-plane writes stalled or
payloads corrupted, peer nodes killed and restarted. Then it lets the node go quiet and checks: nothing
pinned, leased or write-pending; every leased HIT was loadable; no block
loaded with wrong bytes; every call answered within its deadline; events
consistent with what the CPU tier holds; goroutines and memory back to their
baselines. It prints faults injected by kind, operations, recomputes,
violations (the run fails unless 0) and the command that reproduces it.

On a violation it shrinks the recorded fault sequence (delta debugging,
replayed with the same seed) for up to --shrink-time, prints the smallest
sequence found and writes it to --shrink-out; --replay FILE runs exactly
those faults again.

--faults takes kinds, layers (message, engine, fs, obj, peer), "all" and
"none"; "-kind" removes one (e.g. all,-panic).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runChaos(cmd.Context(), o, cmd.OutOrStdout()) },
	}
	def := chaos.DefaultEngineConfig()
	f := cmd.Flags()
	f.StringVar(&o.scenario, "scenario", "peers", "scenario: peers (three nodes with fs, obj and P2P tiers: every fault kind) or single (one node, fs + obj tiers)")
	f.Uint64Var(&o.seed, "seed", 1, "seed of the workload and the fault plan")
	f.DurationVar(&o.duration, "duration", 60*time.Second, "how long to run (faults are injected and requests admitted)")
	f.StringVar(&o.faults, "faults", "all", "fault kinds to inject (comma-separated; see above)")
	f.Float64Var(&o.rate, "rate", 1, "multiply every fault kind's default rate")
	f.DurationVar(&o.maxDelay, "max-delay", chaos.DefaultMaxDelay, "longest message delay or slow I/O")
	f.IntVar(&o.engines, "engines", def.Engines, "simulated engine scheduler threads")
	f.StringSliceVar(&o.spare, "spare", nil, "actors never made to panic (bridge, cpu, tiering, tier-fs, tier-obj, events, session)")
	f.BoolVar(&o.json, "json", false, "print the report as one JSON object")
	f.DurationVar(&o.shrink, "shrink-time", 2*time.Minute, "time allowed to shrink a violation's fault sequence (0: no shrinking)")
	f.StringVar(&o.shrinkOut, "shrink-out", "", "write the shrunk fault sequence here (default kvtier-chaos-SEED-faults.json)")
	f.StringVar(&o.replay, "replay", "", "inject exactly the faults of this file (from --shrink-out) instead of the seeded plan")
	f.StringVar(&o.dir, "dir", "", "working directory for the fs tier and the S3 data (default: a temporary one)")
	f.StringVar(&o.versitygw, "versitygw", "", "versitygw binary (default: on PATH or in $(go env GOPATH)/bin)")
	f.BoolVar(&o.verbose, "verbose", false, "node logs (warnings and up) on stderr")
	return cmd
}

func runChaos(ctx context.Context, o chaosOptions, out io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	scenario, err := chaos.ScenarioByName(o.scenario)
	if err != nil {
		return err
	}
	kinds, err := chaos.ParseKinds(o.faults, scenario)
	if err != nil {
		return err
	}
	opts := chaos.Options{Scenario: o.scenario, Seed: o.seed, Duration: o.duration, Kinds: kinds, Rate: o.rate,
		MaxDelay: o.maxDelay, Spare: o.spare, Shrink: o.shrink, Dir: o.dir, Versitygw: o.versitygw}
	opts.Engine.Engines = o.engines
	if o.verbose {
		l := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).Level(zerolog.WarnLevel).With().Timestamp().Logger()
		opts.Log = &l
	}
	if o.replay != "" {
		faults, err := readFaults(o.replay)
		if err != nil {
			return err
		}
		opts.Plan, opts.Shrink = supervision.NewScript(faults), 0
	}
	rep, err := chaos.Run(ctx, opts)
	if err != nil {
		return err
	}
	if rep.Shrunk != nil && rep.Shrunk.Reproduced {
		path := o.shrinkOut
		if path == "" {
			path = fmt.Sprintf("kvtier-chaos-%d-faults.json", o.seed)
		}
		if err := writeFaults(path, rep.Shrunk.Faults); err != nil {
			fmt.Fprintf(os.Stderr, "kvtier chaos: write %s: %v\n", path, err)
		} else {
			rep.Notes = append(rep.Notes, fmt.Sprintf("shrunk fault sequence written to %s: replay with `%s --replay %s`",
				path, rep.Reproduce, path))
		}
	}
	if o.json {
		if err := rep.WriteJSON(out); err != nil {
			return err
		}
	} else {
		rep.WriteText(out)
	}
	if rep.Violated() {
		fmt.Fprintf(os.Stderr, "kvtier chaos: %d violations with seed %d; reproduce: %s\n", rep.Violations, o.seed, rep.Reproduce)
		return errViolations
	}
	return nil
}

func readFaults(path string) ([]supervision.Fault, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var faults []supervision.Fault
	if err := json.Unmarshal(data, &faults); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return faults, nil
}

func writeFaults(path string, faults []supervision.Fault) error {
	data, err := json.MarshalIndent(faults, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

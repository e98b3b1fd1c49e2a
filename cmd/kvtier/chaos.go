package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tools/chaos"
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
	fsLayout  string
	json      bool
	shrink    time.Duration
	shrinkOut string
	replay    string
	dir       string
	versitygw string
	verbose   bool
	soak      time.Duration
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
fs tiers' disk full for seconds, the S3 server going away, nodes' wall
clocks stepped by NTP, peer connections cut, data-plane writes stalled or
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

--faults takes kinds, layers (message, engine, fs, obj, clock, peer), "all" and
"none"; "-kind" removes one (e.g. all,-panic).

--fs-layout files runs the fs tiers with one file per block instead of
blocks packed in append-only segment files (the default); the fs and
disk-full faults and their checks cover both.

--soak DURATION runs consecutive seeds from --seed, each for --duration (the
last one for what is left), until DURATION has passed; it prints one line per
seed (one JSON object with --json) and a summary, and fails if any seed
violated an invariant.`,
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
	f.StringVar(&o.fsLayout, "fs-layout", fs.DefaultLayout, "the fs tiers' layout: segments (append-only segment files) or files (one file per block)")
	f.BoolVar(&o.json, "json", false, "print the report as one JSON object")
	f.DurationVar(&o.shrink, "shrink-time", 2*time.Minute, "time allowed to shrink a violation's fault sequence (0: no shrinking)")
	f.StringVar(&o.shrinkOut, "shrink-out", "", "write the shrunk fault sequence here (default kvtier-chaos-SEED-faults.json)")
	f.StringVar(&o.replay, "replay", "", "inject exactly the faults of this file (from --shrink-out) instead of the seeded plan")
	f.StringVar(&o.dir, "dir", "", "working directory for the fs tier and the S3 data (default: a temporary one)")
	f.StringVar(&o.versitygw, "versitygw", "", "versitygw binary (default: on PATH or in $(go env GOPATH)/bin)")
	f.BoolVar(&o.verbose, "verbose", false, "node logs (warnings and up) on stderr")
	f.DurationVar(&o.soak, "soak", 0, "run consecutive seeds, each for --duration, until this much time has passed")
	return cmd
}

func runChaos(ctx context.Context, o chaosOptions, out io.Writer) error {
	ctx, stop := untilInterrupted(ctx)
	defer stop()
	if o.soak > 0 {
		return runSoak(ctx, o, out)
	}
	rep, err := runSeed(ctx, o)
	if err != nil {
		return err
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

// runSeed runs one seed's scenario and, on a violation it could shrink,
// writes the shrunk fault sequence.
func runSeed(ctx context.Context, o chaosOptions) (*chaos.Report, error) {
	scenario, err := chaos.ScenarioByName(o.scenario)
	if err != nil {
		return nil, err
	}
	kinds, err := chaos.ParseKinds(o.faults, scenario)
	if err != nil {
		return nil, err
	}
	opts := chaos.Options{Scenario: o.scenario, Seed: o.seed, Duration: o.duration, Kinds: kinds, Rate: o.rate,
		MaxDelay: o.maxDelay, Spare: o.spare, FSLayout: o.fsLayout, Shrink: o.shrink, Dir: o.dir, Versitygw: o.versitygw}
	opts.Engine.Engines = o.engines
	if o.verbose {
		l := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).Level(zerolog.WarnLevel).With().Timestamp().Logger()
		opts.Log = &l
	}
	if o.replay != "" {
		faults, err := readFaults(o.replay)
		if err != nil {
			return nil, err
		}
		opts.Plan, opts.Shrink = supervision.NewScript(faults), 0
	}
	rep, err := chaos.Run(ctx, opts)
	if err != nil {
		return nil, err
	}
	if rep.Shrunk != nil && rep.Shrunk.Reproduced {
		path := o.shrinkOut
		if path == "" || o.soak > 0 {
			path = fmt.Sprintf("kvtier-chaos-%d-faults.json", o.seed)
		}
		if err := writeFaults(path, rep.Shrunk.Faults); err != nil {
			fmt.Fprintf(os.Stderr, "kvtier chaos: write %s: %v\n", path, err)
		} else {
			rep.Notes = append(rep.Notes, fmt.Sprintf("shrunk fault sequence written to %s: replay with `%s --replay %s`",
				path, rep.Reproduce, path))
		}
	}
	return rep, nil
}

// soakLine is one seed of a soak, as --json prints it.
type soakLine struct {
	Seed        uint64   `json:"seed"`
	Faults      int      `json:"faults_injected"`
	Operations  int64    `json:"operations"`
	Requests    int64    `json:"requests"`
	Violations  int      `json:"violations"`
	Skipped     []string `json:"invariants_skipped,omitempty"`
	WallSeconds float64  `json:"wall_seconds"`
	Reproduce   string   `json:"reproduce"`
}

// soakSummary closes a soak.
type soakSummary struct {
	Summary     bool     `json:"summary"`
	Scenario    string   `json:"scenario"`
	Seeds       int      `json:"seeds"`
	FirstSeed   uint64   `json:"first_seed"`
	Faults      int      `json:"faults_injected"`
	Operations  int64    `json:"operations"`
	Violations  int      `json:"violations"`
	Failed      []uint64 `json:"failed_seeds"`
	WallSeconds float64  `json:"wall_seconds"`
}

// runSoak runs consecutive seeds until o.soak has passed.
func runSoak(ctx context.Context, o chaosOptions, out io.Writer) error {
	start := time.Now()
	end := start.Add(o.soak)
	sum := soakSummary{Summary: true, Scenario: o.scenario, FirstSeed: o.seed, Failed: []uint64{}}
	enc := json.NewEncoder(out)
	for seed := o.seed; ctx.Err() == nil; seed++ {
		left := time.Until(end)
		if left < time.Second {
			break
		}
		run := o
		run.seed, run.duration = seed, min(o.duration, left)
		rep, err := runSeed(ctx, run)
		if err != nil {
			if ctx.Err() != nil {
				break // interrupted: the summary says what ran
			}
			return fmt.Errorf("seed %d: %w", seed, err)
		}
		line := soakLine{Seed: seed, Faults: rep.FaultsInjected, Operations: rep.Operations, Requests: rep.Requests,
			Violations: rep.Violations, Skipped: skippedInvariants(rep), WallSeconds: rep.WallSeconds, Reproduce: rep.Reproduce}
		sum.Seeds++
		sum.Faults += line.Faults
		sum.Operations += line.Operations
		sum.Violations += line.Violations
		if rep.Violated() {
			sum.Failed = append(sum.Failed, seed)
		}
		if o.json {
			if err := enc.Encode(line); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(out, "seed %d: %d faults, %d operations, %d requests, %d violations, %.1f s%s\n", seed, line.Faults,
				line.Operations, line.Requests, line.Violations, line.WallSeconds, skippedNote(line.Skipped))
			if rep.Violated() {
				fmt.Fprintf(out, "  reproduce: %s\n", rep.Reproduce)
			}
		}
	}
	sum.WallSeconds = time.Since(start).Seconds()
	if o.json {
		if err := enc.Encode(sum); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(out, "soak: %d seeds from %d (%s), %d faults, %d operations, %d violations, %.0f s; failed seeds: %v\n",
			sum.Seeds, sum.FirstSeed, sum.Scenario, sum.Faults, sum.Operations, sum.Violations, sum.WallSeconds, sum.Failed)
	}
	if sum.Violations > 0 {
		return errViolations
	}
	return nil
}

// skippedInvariants lists the invariants a run could not check, with why.
func skippedInvariants(rep *chaos.Report) []string {
	var out []string
	for name, state := range rep.Invariants {
		if strings.HasPrefix(state, "skipped") {
			out = append(out, name+": "+strings.TrimPrefix(state, "skipped: "))
		}
	}
	slices.Sort(out)
	return out
}

func skippedNote(skipped []string) string {
	if len(skipped) == 0 {
		return ""
	}
	return fmt.Sprintf(" (not checked: %s)", strings.Join(skipped, "; "))
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

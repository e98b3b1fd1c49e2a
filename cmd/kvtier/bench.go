package main

import (
	"context"
	"encoding/json"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvtier/kvtier/tools/bench"
)

// newBenchCmd builds `kvtier bench`: scenarios that print a figure with its
// same-run baseline. Each scenario's bench_*.go holds its description, its
// flags and how its result reads as text; benchScenario does the rest.
func newBenchCmd() *cobra.Command {
	return withCommands(&cobra.Command{Use: "bench", Short: "run a benchmark scenario (cpu, endpoint, engine-poll, fs, obj, idle, p2p-matrix, p2p-throughput, fleet)"},
		benchScenario(&cobra.Command{Use: "cpu", Short: cpuShort}, bench.DefaultCPUOptions, bench.RunCPU, cpuFlags, printCPU),
		benchScenario(&cobra.Command{Use: "endpoint", Short: endpointShort}, bench.DefaultEndpointOptions, bench.RunEndpoint, endpointFlags, printEndpoint),
		benchScenario(&cobra.Command{Use: "engine-poll", Short: enginePollShort}, bench.DefaultEnginePollOptions, bench.RunEnginePoll, enginePollFlags, printEnginePoll),
		benchScenario(&cobra.Command{Use: "fs", Short: fsShort}, bench.DefaultFSOptions, bench.RunFS, fsFlags, printFS),
		benchScenario(&cobra.Command{Use: "obj", Short: objShort, Long: objLong}, bench.DefaultObjOptions, bench.RunObj, objFlags, printObj),
		withCommands(benchScenario(&cobra.Command{Use: "idle", Short: idleShort}, bench.DefaultIdleOptions, bench.RunIdle, idleFlags, printIdle),
			newBenchIdleChildCmd()),
		benchScenario(&cobra.Command{Use: "p2p-matrix", Short: p2pMatrixShort}, bench.DefaultP2POptions, bench.RunP2PMatrix, p2pMatrixFlags, printP2PMatrix),
		benchScenario(&cobra.Command{Use: "p2p-throughput", Short: p2pThroughputShort}, bench.DefaultP2POptions, bench.RunP2PThroughput, p2pThroughputFlags, printP2PThroughput),
		benchScenario(&cobra.Command{Use: "fleet", Short: fleetShort}, bench.DefaultFleetOptions, bench.RunFleet, fleetFlags, printFleet),
		newBenchP2PNodeCmd())
}

// benchScenario completes cmd as the bench subcommand of a scenario with
// options O and result R: flags declares the scenario's flags over
// defaults(), run runs it with what they parsed, and the result is printed
// as one JSON object with --json, or by text.
func benchScenario[O, R any](cmd *cobra.Command, defaults func() O, run func(context.Context, O) (R, error),
	flags func(*pflag.FlagSet, *O), text func(O, R)) *cobra.Command {
	o := defaults()
	var asJSON bool
	cmd.RunE = func(c *cobra.Command, _ []string) error {
		r, err := run(c.Context(), o)
		if err != nil {
			return err
		}
		if asJSON {
			return json.NewEncoder(os.Stdout).Encode(r)
		}
		text(o, r)
		return nil
	}
	flags(cmd.Flags(), &o)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as one JSON object")
	return cmd
}

// Flags that several scenarios declare alike.

// blockBytesFlag declares --block-bytes (every scenario).
func blockBytesFlag(f *pflag.FlagSet, p *int) {
	f.IntVar(p, "block-bytes", *p, "bytes per block")
}

// poolFlags declares --slots and --block-bytes: a node's pool (cpu,
// endpoint, idle, fleet).
func poolFlags(f *pflag.FlagSet, slots, blockBytes *int, slotsUsage string) {
	f.IntVar(slots, "slots", *slots, slotsUsage)
	blockBytesFlag(f, blockBytes)
}

// lookupFlags declares --slots, --block-bytes and --keys (cpu, endpoint).
func lookupFlags(f *pflag.FlagSet, slots, blockBytes, keys *int) {
	poolFlags(f, slots, blockBytes, "pool slots")
	f.IntVar(keys, "keys", *keys, "keys per Lookup")
}

// blockIOFlags declares --blocks and --block-bytes (fs, obj).
func blockIOFlags(f *pflag.FlagSet, blocks, blockBytes *int) {
	f.IntVar(blocks, "blocks", *blocks, "blocks written and read")
	blockBytesFlag(f, blockBytes)
}

// timeoutFlag declares --timeout (idle, p2p-matrix, p2p-throughput).
func timeoutFlag(f *pflag.FlagSet, p *time.Duration) {
	f.DurationVar(p, "timeout", *p, "bound on the whole run")
}

package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/internal/bench"
)

// newBenchIdleCmd builds `kvtier bench idle` and its hidden `child`
// subcommand, which runs the scenario's peer and baseline processes.
func newBenchIdleCmd() *cobra.Command {
	o := bench.DefaultIdleOptions()
	cmd := benchCommand(&cobra.Command{
		Use:   "idle",
		Short: "Idle node with peers connected: context switches/s vs a sleeping Go program; peer lookup latency; pause and shutdown while a peer fetches",
	}, func(ctx context.Context) (bench.IdleResult, error) { return bench.RunIdle(ctx, o) }, func(r bench.IdleResult) {
		fmt.Printf("idle node, %d peers connected, no traffic, %.1f s: %.2f context switches/s (%d threads, %d goroutines)\n",
			r.Peers, r.WindowS, r.IdleCtxswPerS, r.NodeThreads, r.NodeGoroutines)
		fmt.Printf("sleeping Go program, same window: %.2f/s   peers: %.2f/s", r.BaselineCtxswPerS, r.PeerCtxswPerS)
		if r.Standalone {
			fmt.Printf("   idle engine connected to the node: %.2f/s", r.EngineCtxswPerS)
		}
		fmt.Println()
		fmt.Printf("peer lookup from the idle node, %.0f ms idle before each (%d samples): p50 %.0f µs, p99 %.0f µs; raw TCP round trip, same gap: p50 %.0f µs, p99 %.0f µs\n",
			r.ProbeGapMs, r.PeerLookupSamples, r.PeerLookupP50us, r.PeerLookupP99us, r.RawTCPRTTP50us, r.RawTCPRTTP99us)
		fmt.Printf("pause with a peer fetching: %.2f ms; peer fetch rounds verified while paused: %d (%d blocks in %.1f s); pending work while serving: %v\n",
			r.PauseMs, r.PeerFetchesDuring, r.BlocksServedPaused, r.PauseWindowS, r.PendingWhileServing)
		fmt.Printf("graceful shutdown with the peer still fetching: %.2f ms (drain bound %.1f s)", r.ShutdownMs, r.ShutdownDrainBoundS)
		if r.ShutdownErr != "" {
			fmt.Printf(" — error: %s", r.ShutdownErr)
		}
		fmt.Println()
	})
	f := cmd.Flags()
	f.IntVar(&o.Peers, "peers", o.Peers, "peer node processes connected to the measured node")
	f.DurationVar(&o.Window, "window", o.Window, "idle measurement window")
	f.DurationVar(&o.Settle, "settle", o.Settle, "quiet time after start-up, before the window")
	f.IntVar(&o.Blocks, "blocks", o.Blocks, "blocks a fetching peer fetches per round")
	f.IntVar(&o.BlockBytes, "block-bytes", o.BlockBytes, "bytes per block")
	f.IntVar(&o.Slots, "slots", o.Slots, "pool slots of every node")
	f.IntVar(&o.Probes, "probes", o.Probes, "peer lookups timed from the idle node")
	f.DurationVar(&o.ProbeGap, "probe-gap", o.ProbeGap, "idle time before each timed peer lookup")
	f.DurationVar(&o.PauseWindow, "pause-window", o.PauseWindow, "how long the node stays paused while a peer fetches")
	f.DurationVar(&o.CloseTimeout, "close-timeout", o.CloseTimeout, "graceful shutdown bound (the drain bound is 9/10 of it)")
	f.DurationVar(&o.Heartbeat, "heartbeat", o.Heartbeat, "peer heartbeat period of every node (0: the default; negative: off)")
	f.BoolVar(&o.Engine, "engine", o.Engine, "serve the node standalone with an idle engine process connected (false: embedded only)")
	f.DurationVar(&o.Timeout, "timeout", o.Timeout, "bound on the whole run")
	cmd.AddCommand(&cobra.Command{
		Use:                "child ROLE [flags]",
		Short:              "a process of the idle scenario (node or sleep)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			if code := bench.IdleChildMain(args, os.Stdin, os.Stdout); code != 0 {
				os.Exit(code)
			}
			return nil
		},
	})
	return cmd
}

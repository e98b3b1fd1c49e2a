package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvtier/kvtier/tools/bench"
)

// The idle scenario (`kvtier bench idle`): an idle node with peers, and its
// child processes.
const idleShort = "Idle node with peers connected: context switches/s vs a sleeping Go program; peer lookup latency; pause and shutdown while a peer fetches"

// newBenchIdleChildCmd is `kvtier bench idle child`, hidden: it runs the
// idle scenario's peer and baseline processes.
func newBenchIdleChildCmd() *cobra.Command {
	return &cobra.Command{
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
	}
}

func printIdle(_ bench.IdleOptions, r bench.IdleResult) {
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
}

func idleFlags(f *pflag.FlagSet, o *bench.IdleOptions) {
	f.IntVar(&o.Peers, "peers", o.Peers, "peer node processes connected to the measured node")
	poolFlags(f, &o.Slots, &o.BlockBytes, "pool slots of every node")
	f.IntVar(&o.Blocks, "blocks", o.Blocks, "blocks a fetching peer fetches per round")
	f.DurationVar(&o.Heartbeat, "heartbeat", o.Heartbeat, "peer heartbeat period of every node (0: the default; negative: off)")
	f.BoolVar(&o.Engine, "engine", o.Engine, "serve the node standalone with an idle engine process connected (false: embedded only)")
	f.DurationVar(&o.Window, "window", o.Window, "idle measurement window")
	f.DurationVar(&o.Settle, "settle", o.Settle, "quiet time after start-up, before the window")
	timeoutFlag(f, &o.Timeout)
	f.IntVar(&o.Probes, "probes", o.Probes, "peer lookups timed from the idle node")
	f.DurationVar(&o.ProbeGap, "probe-gap", o.ProbeGap, "idle time before each timed peer lookup")
	f.DurationVar(&o.PauseWindow, "pause-window", o.PauseWindow, "how long the node stays paused while a peer fetches")
	f.DurationVar(&o.CloseTimeout, "close-timeout", o.CloseTimeout, "graceful shutdown bound (the drain bound is 9/10 of it)")
}

package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/tools/bench"
)

// The P2P scenarios: node processes of this same binary (the hidden
// `bench p2p-node`) driven by an orchestrator.

const p2pMatrixShort = "Consumer lookup delay with the source's engine idle or busy, cold and warm sessions; store→peer-visible latency"

const p2pThroughputShort = "Fetch throughput between two node processes vs a raw TCP copy of the same bytes between them"

// p2pFlags declares the flags of both P2P scenarios.
func p2pFlags(f *pflag.FlagSet, o *bench.P2POptions) {
	blockBytesFlag(f, &o.BlockBytes)
	f.Int64Var(&o.PoolBytes, "pool-bytes", o.PoolBytes, "CPU pool of each node")
	f.IntVar(&o.FetchBlocks, "blocks", o.FetchBlocks, "fresh blocks per measured fetch")
	timeoutFlag(f, &o.Timeout)
}

func p2pMatrixFlags(f *pflag.FlagSet, o *bench.P2POptions) {
	f.IntVar(&o.ColdRounds, "cold-rounds", o.ColdRounds, "fresh consumer processes per case")
	f.IntVar(&o.WarmRounds, "warm-rounds", o.WarmRounds, "warm fetches per case")
	f.IntVar(&o.PollUs, "poll-us", o.PollUs, "consumer engine step while waiting (µs)")
	p2pFlags(f, o)
	f.IntVar(&o.StepMs, "step-ms", o.StepMs, "busy source: model step")
	f.IntVar(&o.Requests, "requests", o.Requests, "busy source: concurrent requests")
	f.IntVar(&o.Chunk, "chunk", o.Chunk, "busy source: blocks stored per request per step")
	f.IntVar(&o.Prompt, "prompt", o.Prompt, "busy source: prompt blocks per request")
	f.IntVar(&o.VisibleSteps, "visible-steps", o.VisibleSteps, "busy source steps watched by a peer")
}

func p2pThroughputFlags(f *pflag.FlagSet, o *bench.P2POptions) {
	p2pFlags(f, o)
	f.IntVar(&o.Rounds, "rounds", o.Rounds, "fetches and raw copies measured")
	f.StringVar(&o.Transport, "transport", o.Transport, "data plane: tcp, or nixl (needs a -tags nixl build and the library; tcp is measured too)")
	f.BoolVar(&o.TLS, "tls", o.TLS, "tcp data plane over mutual TLS 1.3 (certificates made for the run; a plain tcp pair is measured too, rounds alternating)")
}

func printP2PMatrix(_ bench.P2POptions, r bench.P2PMatrixResult) {
	fmt.Printf("fetch of %d blocks (%.0f MB), lookup delay first RETRY → all HIT (median):\n", r.FetchBlocks, r.FetchMB)
	fmt.Printf("  idle source: cold %.3f s, warm %.3f s\n", r.IdleColdS, r.IdleWarmS)
	fmt.Printf("  busy source (%d requests, %d ms steps): cold %.3f s, warm %.3f s\n", r.Requests, r.StepMs, r.BusyColdS, r.BusyWarmS)
	fmt.Printf("  busy penalty (busy_warm / idle_warm): %.3f×   (cold: %.3f×)\n", r.BusyPenalty, r.ColdPenalty)
	fmt.Printf("store → visible to a peer, busy source: p50 %.2f ms, p99 %.2f ms over %d blocks sets\n", r.VisibleP50Ms, r.VisibleP99Ms, r.VisibleSamples)
	fmt.Printf("peer lookup round trip, busy source: p50 %.0f µs, p99 %.0f µs over %d lookups\n", r.PeerLookupP50Us, r.PeerLookupP99Us, r.PeerLookups)
}

func printP2PThroughput(_ bench.P2POptions, r bench.P2PThroughputResult) {
	over := r.Transport
	if r.TLS {
		over += " with TLS"
	}
	fmt.Printf("fetch of %d × %d B over %s: %.2f GB/s; raw TCP copy of the same bytes: %.2f GB/s → %.2f×\n",
		r.Blocks, r.BlockBytes, over, r.FetchGBps, r.RawTCPGBps, r.Ratio)
	switch {
	case r.TLS:
		fmt.Printf("same run, plain tcp transport in alternating rounds: %.2f GB/s → TLS at %.2f× of it (± %.2f)\n",
			r.TCPFetchGBps, r.TLSOverTCP, r.TLSOverTCPSpread)
	case r.TCPFetchGBps > 0:
		fmt.Printf("same run, plain tcp transport: %.2f GB/s (%.2f× of it)\n", r.TCPFetchGBps, r.FetchGBps/r.TCPFetchGBps)
	}
}

// newBenchP2PNodeCmd is the node process of the P2P scenarios (internal).
func newBenchP2PNodeCmd() *cobra.Command {
	o := bench.NodeOptions{PoolBytes: 1 << 30, BlockBytes: 128 << 10}
	var peers []string
	cmd := &cobra.Command{
		Use:    "p2p-node",
		Hidden: true,
		Short:  "one node of the P2P scenarios, driven by JSON lines on stdin",
		RunE: func(c *cobra.Command, _ []string) error {
			for _, p := range peers {
				id, addr, ok := strings.Cut(p, "=")
				if !ok {
					return fmt.Errorf("--peer %q: want id=addr", p)
				}
				o.Peers = append(o.Peers, kvtier.PeerAddr{NodeID: id, Addr: addr})
			}
			return bench.RunNode(c.Context(), o, os.Stdin, os.Stdout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.ID, "id", "", "node id")
	f.Int64Var(&o.PoolBytes, "pool-bytes", o.PoolBytes, "pool bytes")
	f.IntVar(&o.BlockBytes, "block-bytes", o.BlockBytes, "block bytes")
	f.StringVar(&o.Secret, "secret", "", "peers' shared secret")
	f.StringVar(&o.Transport, "transport", "tcp", "data plane: tcp or nixl")
	f.StringVar(&o.TLS.Cert, "tls-cert", "", "tcp data plane TLS: this node's certificate (PEM)")
	f.StringVar(&o.TLS.Key, "tls-key", "", "its key (PEM)")
	f.StringVar(&o.TLS.CA, "tls-ca", "", "the CA of the peers' certificates (PEM)")
	f.StringArrayVar(&peers, "peer", nil, "peer id=addr")
	return cmd
}

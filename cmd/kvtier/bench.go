package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvtier/kvtier/internal/bench"
)

// newBenchCmd builds `kvtier bench`: scenarios that print a figure with its
// same-run baseline.
func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "run a benchmark scenario (cpu, endpoint, fs, obj)"}
	cmd.AddCommand(newBenchCPUCmd(), newBenchEndpointCmd(), newBenchFSCmd(), newBenchObjCmd(), newBenchIdleCmd())
	cmd.AddCommand(newBenchP2PCmds()...)
	return cmd
}

func newBenchCPUCmd() *cobra.Command {
	o := bench.DefaultCPUOptions()
	cmd := benchCommand(&cobra.Command{
		Use:   "cpu",
		Short: "Lookup of N keys and PrepareStore with eviction: actor path vs bare CPU-tier logic",
	}, func(ctx context.Context) (bench.CPUResult, error) { return bench.RunCPU(ctx, o) }, func(r bench.CPUResult) {
		fmt.Printf("lookup of %d keys (actor path): p50 %.1f µs, p99 %.1f µs, %.0f keys/s\n", o.LookupKeys, r.LookupP50us, r.LookupP99us, r.KeyLookupsPerS)
		fmt.Printf("lookup of %d keys (bare state): p50 %.1f µs, %.0f keys/s  → actor overhead %.2f×\n", o.LookupKeys, r.BareLookupP50us, r.BareKeyLookupsPerS, r.LookupActorOverhead)
		fmt.Printf("stores with eviction, batch %d: actor %.0f blocks/s, bare %.0f blocks/s → actor overhead %.2f×\n", o.StoreBatch, r.StoresPerS, r.BareStoresPerS, r.StoreActorOverhead)
	})
	f := cmd.Flags()
	f.IntVar(&o.Slots, "slots", o.Slots, "pool slots")
	f.IntVar(&o.BlockBytes, "block-bytes", o.BlockBytes, "bytes per block")
	f.IntVar(&o.LookupKeys, "keys", o.LookupKeys, "keys per Lookup")
	f.IntVar(&o.Lookups, "lookups", o.Lookups, "Lookup calls measured")
	f.IntVar(&o.StoreBatch, "store-batch", o.StoreBatch, "keys per PrepareStore")
	f.IntVar(&o.StoreRounds, "store-rounds", o.StoreRounds, "PrepareStore calls measured")
	f.StringVar(&o.Policy, "policy", o.Policy, "eviction policy (lru, arc)")
	return cmd
}

func newBenchEndpointCmd() *cobra.Command {
	o := bench.DefaultEndpointOptions()
	cmd := benchCommand(&cobra.Command{
		Use:   "endpoint",
		Short: "Standalone mode: 2,000-key Lookup through the engine socket vs embedded, store+load through the shared pool vs copy()",
	}, func(ctx context.Context) (bench.EndpointResult, error) { return bench.RunEndpoint(ctx, o) }, func(r bench.EndpointResult) {
		fmt.Printf("lookup of %d keys through the socket: p50 %.1f µs, p99 %.1f µs\n", o.LookupKeys, r.LookupP50us, r.LookupP99us)
		fmt.Printf("lookup of %d keys embedded (same node): p50 %.1f µs, p99 %.1f µs → socket adds %.1f µs at p99\n", o.LookupKeys, r.EmbeddedLookupP50us, r.EmbeddedLookupP99us, r.SocketOverheadP99us)
		fmt.Printf("store+load through the shared pool: %.2f GB/s; copy() of the same bytes: %.2f GB/s (%.2f×)\n", r.ShmGBps, r.MemcpyGBps, r.ShmOverMemcpy)
	})
	f := cmd.Flags()
	f.IntVar(&o.Slots, "slots", o.Slots, "pool slots")
	f.IntVar(&o.BlockBytes, "block-bytes", o.BlockBytes, "bytes per block")
	f.IntVar(&o.LookupKeys, "keys", o.LookupKeys, "keys per Lookup")
	f.IntVar(&o.Lookups, "lookups", o.Lookups, "Lookup calls measured per path")
	f.IntVar(&o.CopyBlocks, "copy-blocks", o.CopyBlocks, "blocks per store+load round")
	f.IntVar(&o.CopyRounds, "copy-rounds", o.CopyRounds, "store+load rounds measured")
	return cmd
}

// benchCommand completes a bench subcommand: it runs the scenario, then
// prints the result as one JSON object with --json, or as text.
func benchCommand[R any](cmd *cobra.Command, run func(context.Context) (R, error), text func(R)) *cobra.Command {
	var asJSON bool
	cmd.RunE = func(c *cobra.Command, _ []string) error {
		r, err := run(c.Context())
		if err != nil {
			return err
		}
		if asJSON {
			return json.NewEncoder(os.Stdout).Encode(r)
		}
		text(r)
		return nil
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as one JSON object")
	return cmd
}

package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/kvtier/kvtier/tools/bench"
)

// The endpoint scenario (`kvtier bench endpoint`): the engine socket and the
// shared pool vs embedded calls and copy().
const endpointShort = "Standalone mode: 2,000-key Lookup through the engine socket vs embedded, store+load through the shared pool vs copy()"

func printEndpoint(o bench.EndpointOptions, r bench.EndpointResult) {
	fmt.Printf("transport %s\n", r.Transport)
	fmt.Printf("lookup of 16 / 64 keys through the socket: p50 %.1f / %.1f µs, p99 %.1f / %.1f µs (embedded p50 %.1f / %.1f µs)\n",
		r.Lookup16P50us, r.Lookup64P50us, r.Lookup16P99us, r.Lookup64P99us, r.EmbeddedLookup16P50us, r.EmbeddedLookup64P50us)
	fmt.Printf("floors, a 256-byte echo: zmq4 DEALER/ROUTER over ipc p50 %.1f µs (p99 %.1f), Unix socket p50 %.1f µs (p99 %.1f); 16-key lookup = %.2f× the zmq floor\n",
		r.FloorZmqIPCus, r.FloorZmqIPCP99us, r.FloorUnixus, r.FloorUnixP99us, r.Lookup16OverZmqFloor)
	fmt.Printf("lookup of %d keys through the socket: p50 %.1f µs, p99 %.1f µs\n", o.LookupKeys, r.LookupP50us, r.LookupP99us)
	fmt.Printf("lookup of %d keys embedded (same node): p50 %.1f µs, p99 %.1f µs → socket adds %.1f µs at p99\n", o.LookupKeys, r.EmbeddedLookupP50us, r.EmbeddedLookupP99us, r.SocketOverheadP99us)
	fmt.Printf("store+load through the shared pool: %.2f GB/s; copy() of the same bytes: %.2f GB/s (%.2f×)\n", r.ShmGBps, r.MemcpyGBps, r.ShmOverMemcpy)
}

func endpointFlags(f *pflag.FlagSet, o *bench.EndpointOptions) {
	lookupFlags(f, &o.Slots, &o.BlockBytes, &o.LookupKeys)
	f.IntVar(&o.Lookups, "lookups", o.Lookups, "Lookup calls measured per path")
	f.IntVar(&o.CopyBlocks, "copy-blocks", o.CopyBlocks, "blocks per store+load round")
	f.IntVar(&o.CopyRounds, "copy-rounds", o.CopyRounds, "store+load rounds measured")
	f.StringVar(&o.Transport, "transport", o.Transport, "engine endpoint transport: ipc (ZeroMQ) or unix (length-prefixed frames on a Unix socket)")
}

package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/kvtier/kvtier/tools/bench"
)

// The cpu scenario (`kvtier bench cpu`): the CPU tier through its actor vs
// its bare logic.
const cpuShort = "Lookup of N keys and PrepareStore with eviction: actor path vs bare CPU-tier logic"

func printCPU(o bench.CPUOptions, r bench.CPUResult) {
	fmt.Printf("lookup of %d keys (actor path): p50 %.1f µs, p99 %.1f µs, %.0f keys/s\n", o.LookupKeys, r.LookupP50us, r.LookupP99us, r.KeyLookupsPerS)
	fmt.Printf("lookup of %d keys (bare state): p50 %.1f µs, %.0f keys/s  → actor overhead %.2f×\n", o.LookupKeys, r.BareLookupP50us, r.BareKeyLookupsPerS, r.LookupActorOverhead)
	fmt.Printf("stores with eviction, batch %d: actor %.0f blocks/s, bare %.0f blocks/s → actor overhead %.2f×\n", o.StoreBatch, r.StoresPerS, r.BareStoresPerS, r.StoreActorOverhead)
}

func cpuFlags(f *pflag.FlagSet, o *bench.CPUOptions) {
	lookupFlags(f, &o.Slots, &o.BlockBytes, &o.LookupKeys)
	f.IntVar(&o.Lookups, "lookups", o.Lookups, "Lookup calls measured")
	f.IntVar(&o.StoreBatch, "store-batch", o.StoreBatch, "keys per PrepareStore")
	f.IntVar(&o.StoreRounds, "store-rounds", o.StoreRounds, "PrepareStore calls measured")
	f.StringVar(&o.Policy, "policy", o.Policy, "eviction policy (lru, arc, prefix)")
}

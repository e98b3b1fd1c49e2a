// Package gcpercent sets the garbage collector's target for kvtier's own
// processes (kvtierd, the benchmarks' node processes).
//
// Why: a node's heap is small (the CPU pool is a shared mapping, not
// heap), so at Go's default GOGC=100 it collects every few MB allocated:
// ~17 cycles a second in a node answering a peer's back-to-back lookups,
// each taking half of a two-core node's Ps for 2-6 ms and slowing the
// lookups it overlaps. At 400 the peer lookup p99 of `kvtier bench
// p2p-matrix` fell from 1.16-1.20 ms to 0.70-0.73 ms (docs/PERFORMANCE.md,
// issue 17 round 4), for a heap goal of ~4x a few tens of MB.
//
// It owns only that process-wide setting, never a node's; a program that
// embeds kvtier keeps its own (this package is not called by Open).
package gcpercent

import (
	"os"
	"runtime/debug"
	"runtime/metrics"
)

// Default is the target kvtier's processes run with.
const Default = 400

// Apply sets the collector's target to percent unless the GOGC
// environment variable chose one (the operator's choice wins, "off"
// included); it returns the target in force (-1: off).
func Apply(percent int) int {
	if v, ok := os.LookupEnv("GOGC"); ok && v != "" {
		return Current()
	}
	debug.SetGCPercent(percent)
	return percent
}

// Current is the collector's target in force, read without changing it
// (-1: off).
func Current() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return -1
	}
	if v := s[0].Value.Uint64(); v > 0 { // NB: GOGC=off reads 0 here
		return int(v)
	}
	return -1
}

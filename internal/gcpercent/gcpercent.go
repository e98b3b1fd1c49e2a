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
)

// Default is the target kvtier's processes run with.
const Default = 400

// Apply sets the collector's target to percent unless the GOGC
// environment variable chose one (the operator's choice wins); it returns
// the target in force.
func Apply(percent int) int {
	if v, ok := os.LookupEnv("GOGC"); ok && v != "" {
		cur := debug.SetGCPercent(100)
		debug.SetGCPercent(cur)
		return cur
	}
	debug.SetGCPercent(percent)
	return percent
}

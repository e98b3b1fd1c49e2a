// Package bench holds kvtier's benchmark scenarios: each measures a figure
// through the real actor path and its baseline in the same run, so the
// report is a ratio that holds across machines.
//
// It drives nodes through the public API and the tiers' bare logic; it owns
// no node state and is never imported by the runtime.
package bench

//go:build race

package sim

// raceEnabled: the race detector slows the whole-trace replay twentyfold.
const raceEnabled = true

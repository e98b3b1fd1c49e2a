package gcpercent

import (
	"runtime/debug"
	"testing"
)

func restore(t *testing.T) {
	prev := debug.SetGCPercent(100)
	debug.SetGCPercent(prev)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
}

func TestApplySetsTheTarget(t *testing.T) {
	restore(t)
	t.Setenv("GOGC", "")
	if got := Apply(Default); got != Default {
		t.Fatalf("Apply = %d, want %d", got, Default)
	}
	if cur := debug.SetGCPercent(Default); cur != Default {
		t.Fatalf("target in force %d, want %d", cur, Default)
	}
}

func TestApplyLeavesAnOperatorsGOGC(t *testing.T) {
	restore(t)
	t.Setenv("GOGC", "150")
	debug.SetGCPercent(150) // NB: what the runtime read from GOGC at start
	if got := Apply(Default); got != 150 {
		t.Fatalf("Apply = %d, want the operator's 150", got)
	}
	if cur := debug.SetGCPercent(150); cur != 150 {
		t.Fatalf("target in force %d, want 150", cur)
	}
}

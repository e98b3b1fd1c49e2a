package gcpercent

import (
	"runtime/debug"
	"testing"
)

// keep restores the collector's target after the test.
func keep(t *testing.T) {
	prev := Current()
	t.Cleanup(func() { debug.SetGCPercent(prev) })
}

func TestApplySetsTheTarget(t *testing.T) {
	keep(t)
	t.Setenv("GOGC", "")
	debug.SetGCPercent(100)
	if got := Apply(Default); got != Default {
		t.Fatalf("Apply = %d, want %d", got, Default)
	}
	if cur := Current(); cur != Default {
		t.Fatalf("target in force %d, want %d", cur, Default)
	}
}

// An operator's GOGC (what the runtime read from it at start, simulated
// with SetGCPercent) is left as it is, "off" included.
func TestApplyLeavesAnOperatorsGOGC(t *testing.T) {
	keep(t)
	for _, tc := range []struct {
		env  string
		want int
	}{{"150", 150}, {"off", -1}} {
		t.Setenv("GOGC", tc.env)
		debug.SetGCPercent(tc.want)
		if got := Apply(Default); got != tc.want {
			t.Fatalf("GOGC=%s: Apply = %d, want %d", tc.env, got, tc.want)
		}
		if cur := Current(); cur != tc.want {
			t.Fatalf("GOGC=%s: target in force %d, want %d", tc.env, cur, tc.want)
		}
	}
}

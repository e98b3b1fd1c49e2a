package bench

import (
	"math"
	"testing"
)

func TestRatioOfInterleavedPairs(t *testing.T) {
	idle := []float64{10, 12, 11, 30, 10} // one idle sample hit by a burst of other work
	busy := []float64{11, 13, 12, 31, 11}
	if got := median(busy) / median(idle); math.Abs(got-12.0/11) > 1e-9 {
		t.Fatalf("ratio of medians %v", got)
	}
	r := pairRatios(idle, busy)
	if len(r) != 5 || math.Abs(r[3]-31.0/30) > 1e-9 {
		t.Fatalf("pair ratios %v", r)
	}
	// The per-pair ratios are tight although the samples are not.
	if s := ratioSpread(idle, busy); s <= 0 || s > 0.02 {
		t.Fatalf("ratio spread %v", s)
	}
	if s := spread(idle); s < 0.05 {
		t.Fatalf("sample spread %v: the middle half spans 10..12", s)
	}
}

func TestSettledNeedsTheRatioToStopMoving(t *testing.T) {
	idle := []float64{1, 1, 1, 1}
	if settled(idle, []float64{1, 2, 1, 2}, 0.01) != true {
		t.Fatal("medians 1/1.5 → ... unchanged over the last two pairs: settled")
	}
	if settled(idle[:3], []float64{1, 1, 1}, 0.01) {
		t.Fatal("three pairs are never enough")
	}
	if settled([]float64{1, 1, 1, 1, 1, 1}, []float64{1, 1, 1, 3, 3, 3}, 0.01) {
		t.Fatal("the busy median just jumped: not settled")
	}
}

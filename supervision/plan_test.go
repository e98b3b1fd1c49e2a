package supervision

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSeededIsAPureFunctionOfSeedAndPoint(t *testing.T) {
	s := &Seeded{Seed: 7, Rates: map[FaultKind]float64{FaultDrop: 0.1, FaultDelay: 0.2},
		MinDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}
	allowed := []FaultKind{FaultDrop, FaultDelay, FaultPanic}
	counts := map[FaultKind]int{}
	const n = 20000
	for i := range uint64(n) {
		p := Point{Site: "a", N: i}
		d := s.Decide(p, allowed)
		require.Equal(t, d, s.Decide(p, allowed), "same point, same decision")
		counts[d.Kind]++
		if d.Kind == FaultDelay {
			require.GreaterOrEqual(t, d.Delay, time.Millisecond)
			require.Less(t, d.Delay, 5*time.Millisecond)
		}
	}
	assert.InDelta(t, 0.1, float64(counts[FaultDrop])/n, 0.01)
	assert.InDelta(t, 0.9*0.2, float64(counts[FaultDelay])/n, 0.01, "drop is tried first")
	assert.Zero(t, counts[FaultPanic], "no rate, never")

	other := &Seeded{Seed: 8, Rates: s.Rates}
	same := 0
	for i := range uint64(1000) {
		p := Point{Site: "a", N: i}
		if s.Decide(p, allowed).Kind == other.Decide(p, allowed).Kind {
			same++
		}
	}
	assert.Less(t, same, 1000, "another seed, other decisions")
	assert.True(t, s.Decide(Point{Site: "a"}, nil).None(), "nothing allowed, nothing injected")
}

func TestScriptReplaysExactlyItsFaults(t *testing.T) {
	led := NewLedger(nil)
	p0, p1 := led.Next("x"), led.Next("x")
	assert.Equal(t, Point{Site: "x", N: 1}, p1)
	led.Record(p0, Decision{Kind: FaultDrop})
	led.Record(Point{Site: "y"}, Decision{Kind: FaultStall, Arg: 3})
	script := NewScript(led.Faults())
	assert.Equal(t, Decision{Kind: FaultDrop}, script.Decide(p0, []FaultKind{FaultDrop}))
	assert.True(t, script.Decide(p1, []FaultKind{FaultDrop}).None())
	assert.True(t, script.Decide(p0, []FaultKind{FaultDelay}).None(), "a kind not allowed there is not injected")
	assert.Equal(t, uint64(3), script.Decide(Point{Site: "y"}, []FaultKind{FaultStall}).Arg)
	assert.Equal(t, map[FaultKind]uint64{FaultDrop: 1, FaultStall: 1}, led.Counts())
	assert.Equal(t, 2, led.Total())
}

func TestLedgerHooksSeeEveryFault(t *testing.T) {
	led := NewLedger(nil)
	var seen []uint64
	led.OnRecord(func(f Fault) { seen = append(seen, f.Seq) })
	led.Record(led.Next("a"), Decision{Kind: FaultPanic})
	led.Record(led.Next("a"), Decision{Kind: FaultPanic})
	assert.Equal(t, []uint64{1, 2}, seen)
}

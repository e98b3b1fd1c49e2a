package cpu

import (
	"maps"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// A slotSet counts as a map would, small or past smallSet, and its loop
// survives the body taking out the slot it was given.
func TestSlotSetCountsAsAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, span := range []int{4, smallSet, 3 * smallSet} {
		var c slotSet
		want := map[int]int32{}
		for range 2000 {
			idx, d := rng.IntN(span), int32(rng.IntN(5)-2)
			got := c.add(idx, d)
			want[idx] = max(0, want[idx]+d)
			if want[idx] == 0 {
				delete(want, idx)
			}
			require.Equal(t, want[idx], got)
			require.Equal(t, want[idx], c.count(idx))
			require.Equal(t, len(want), c.len())
		}
		seen := map[int]int32{}
		for idx, n := range c.all() {
			seen[idx] = n
			c.add(idx, -n) // NB: take out the slot just given
		}
		require.Equal(t, want, seen, "span %d: every slot once, with its count", span)
		require.Zero(t, c.len())
	}
	var none *slotSet
	require.Zero(t, none.len())
	require.False(t, none.has(1))
	require.Empty(t, maps.Collect(none.all()))
}

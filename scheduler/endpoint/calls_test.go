package endpoint

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/scheduler/wire"
)

// The calls in flight against a plain list: random begins, answers and
// clock moves; every call ends exactly once, expiries come earliest
// deadline first (ties in the order begun), and next is the earliest.
func TestFlightsEndEachCallOnceEarliestDeadlineFirst(t *testing.T) {
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 1))
		f := newFlights()
		type want struct {
			id       uint64
			deadline time.Duration
		}
		var live []want
		ended := map[uint64]bool{}
		now := time.Duration(0)
		for range 500 {
			switch rng.IntN(3) {
			case 0:
				timeout := time.Duration(1+rng.IntN(5)) * time.Second
				c := f.begin(1, "p", &wire.Request{Op: wire.OpLookup}, now, timeout)
				live = append(live, want{c.id, now + timeout})
			case 1:
				if len(live) == 0 {
					continue
				}
				i := rng.IntN(len(live))
				c := f.answered(live[i].id)
				require.NotNil(t, c)
				require.Equal(t, live[i].id, c.id)
				ended[c.id] = true
				require.Nil(t, f.answered(c.id), "a call ends once")
				live = slices.Delete(live, i, i+1)
			case 2:
				now += time.Duration(rng.IntN(2000)) * time.Millisecond
				var due []want
				for _, w := range live {
					if w.deadline <= now {
						due = append(due, w)
					}
				}
				slices.SortStableFunc(due, func(a, b want) int { return int(a.deadline - b.deadline) })
				got := f.expire(now)
				require.Len(t, got, len(due))
				for i, c := range got {
					require.Equal(t, due[i].id, c.id)
					require.False(t, ended[c.id])
					ended[c.id] = true
				}
				live = slices.DeleteFunc(live, func(w want) bool { return w.deadline <= now })
			}
			require.Equal(t, len(live), f.len())
			next, ok := f.next()
			require.Equal(t, len(live) > 0, ok)
			for _, w := range live {
				require.LessOrEqual(t, next, w.deadline)
			}
		}
	}
}

package cpu

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

// An eventLog keeps the newest max events, oldest first, and counts the
// ones it dropped, as a slice that drops its head when full would.
func TestEventLogKeepsTheNewestInOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, max := range []int{1, 3, 8} {
		l := eventLog{max: max}
		var want []messages.Event
		var dropped uint64
		for i := range 3000 {
			if rng.IntN(max*3) == 0 {
				got, d := l.take()
				require.Equal(t, want, got, "max %d, after %d events", max, i)
				require.Equal(t, dropped, d)
				want, dropped = nil, 0
				continue
			}
			e := messages.Event{Kind: messages.BlockStored, Keys: []messages.Key{{Hash: string(rune('a' + i%26)), Group: uint32(i)}}}
			l.add(e)
			if want = append(want, e); len(want) > max {
				want, dropped = want[1:], dropped+1
			}
		}
	}
}

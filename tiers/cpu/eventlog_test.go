package cpu

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

// An eventLog keeps the newest max events, oldest first, and counts the
// ones it dropped, as a slice that drops its head when full would: taken
// empty, part full, full, and after wrapping round several times.
func TestEventLogKeepsTheNewestInOrder(t *testing.T) {
	for _, max := range []int{1, 3, 8} {
		l, seq := eventLog{max: max}, 0
		for n := range 3*max + 2 {
			var want []messages.Event
			var dropped uint64
			for range n {
				seq++
				e := messages.Event{Kind: messages.BlockStored, Keys: []messages.Key{{Hash: "h", Group: uint32(seq)}}}
				l.add(e)
				if want = append(want, e); len(want) > max {
					want, dropped = want[1:], dropped+1
				}
			}
			got, d := l.take()
			require.Equal(t, want, got, "max %d, %d events", max, n)
			require.Equal(t, dropped, d, "max %d, %d events", max, n)
		}
	}
}

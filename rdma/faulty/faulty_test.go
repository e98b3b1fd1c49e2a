package faulty

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/rdma"
)

// fake completes every Write at once, on the caller's goroutine.
type fake struct{ rdma.Transport }

func (fake) Write(peer string, tok rdma.Token, _, _, _ []int, done func(rdma.Completion)) error {
	done(rdma.Completion{Token: tok, Peer: peer})
	return nil
}
func (fake) Close() error { return nil }

func TestStallForLetsTheCompletionThroughAtItsDeadline(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := Wrap(fake{}, func(string, int) Fault { return Stall })
	f.SetStallFor(20 * time.Millisecond)
	got := make(chan rdma.Completion, 1)
	start := time.Now()
	require.NoError(t, f.Write("p", rdma.NewToken(), []int{0}, []int{0}, nil, func(c rdma.Completion) { got <- c }))
	require.Equal(t, 1, f.Stalled())
	c := <-got
	require.NoError(t, c.Err)
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
	require.Zero(t, f.Stalled())
	require.Equal(t, uint64(1), f.Stalls.Load())
}

func TestStallWithoutDeadlineWaitsForReleaseOrClose(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := Wrap(fake{}, func(string, int) Fault { return Stall })
	var order []int
	for i := range 3 {
		require.NoError(t, f.Write("p", rdma.NewToken(), []int{0}, []int{0}, nil, func(rdma.Completion) { order = append(order, i) }))
	}
	require.Empty(t, order, "held until released")
	require.Equal(t, 3, f.Stalled())
	f.Release()
	require.Equal(t, []int{0, 1, 2}, order, "released in the order held")
	require.NoError(t, f.Write("p", rdma.NewToken(), []int{0}, []int{0}, nil, func(rdma.Completion) { order = append(order, 3) }))
	require.NoError(t, f.Close())
	require.Equal(t, []int{0, 1, 2, 3}, order, "Close releases what is stalled")
}

package actors

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// Actors on the warm pool are served while every worker is held by a
// Receive that blocks (a fault, a bug): an activation no worker takes runs
// on a goroutine of its own. Close then ends the workers (goleak).
func TestWarmDispatcherNeverQueuesBehindABusyWorker(t *testing.T) {
	d := NewWarmDispatcher(1, Throughput)
	gate := make(chan struct{})
	d.work <- func() { <-gate } // NB: returns once the one worker holds it
	system := NewSystem(zerolog.Nop())
	defer system.Shutdown()
	served := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &echo{starts: &atomic.Int32{}} },
		actor.WithDispatcher(d)))
	for i := range 100 {
		got, err := system.Root.RequestFuture(served, &ping{n: i}, 10*time.Second).Result()
		require.NoError(t, err)
		require.Equal(t, &pong{n: i + 1}, got)
	}
	require.NoError(t, system.Root.StopFuture(served).Wait())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, d.Close(ctx), context.DeadlineExceeded, "a worker held: Close gives up at the deadline")
	close(gate)
	require.NoError(t, d.Close(context.Background()))
	require.NoError(t, d.Close(context.Background()), "idempotent")
	require.NoError(t, (*WarmDispatcher)(nil).Close(context.Background()))
}

// After Close a Schedule still runs its activation.
func TestWarmDispatcherAfterClose(t *testing.T) {
	d := NewWarmDispatcher(2, Throughput)
	require.NoError(t, d.Close(context.Background()))
	ran := make(chan struct{})
	d.Schedule(func() { close(ran) })
	<-ran
}

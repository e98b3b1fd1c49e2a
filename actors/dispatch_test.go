package actors

import (
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
	close(gate)
	require.NoError(t, system.Root.StopFuture(served).Wait())
	d.Close()
	d.Close() // idempotent
	(*WarmDispatcher)(nil).Close()
}

// After Close a Schedule still runs its activation.
func TestWarmDispatcherAfterClose(t *testing.T) {
	d := NewWarmDispatcher(2, Throughput)
	d.Close()
	ran := make(chan struct{})
	d.Schedule(func() { close(ran) })
	<-ran
}

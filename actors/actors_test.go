package actors

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type ping struct{ n int }
type pong struct{ n int }
type boom struct{}

// echo answers ping with pong and panics on boom; it counts its starts.
type echo struct{ starts *atomic.Int32 }

func (e *echo) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		e.starts.Add(1)
	case *ping:
		ctx.Respond(&pong{n: m.n + 1})
	case *boom:
		panic("boom")
	}
}

func startEcho(t *testing.T) (*actor.ActorSystem, *actor.PID, map[string]*actor.PID, *atomic.Int32, *atomic.Uint64) {
	t.Helper()
	system := NewSystem(zerolog.Nop())
	starts, restarts := &atomic.Int32{}, &atomic.Uint64{}
	props := actor.PropsFromProducer(func() actor.Actor { return &echo{starts: starts} })
	spawned := make(chan map[string]*actor.PID, 1)
	g, err := system.Root.SpawnNamed(GuardianProps([]Child{{Name: "echo", Props: props}}, spawned, restarts, zerolog.Nop()), "g")
	require.NoError(t, err)
	return system, g, <-spawned, starts, restarts
}

func TestAskAnswersAndGuardianRestartsAFailedChild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	system, g, pids, starts, restarts := startEcho(t)
	echoPID := pids["echo"]
	require.Equal(t, "g/echo", echoPID.Id)

	r, err := Ask(ctx, system, echoPID, &ping{n: 1})
	require.NoError(t, err)
	require.Equal(t, &pong{n: 2}, r)

	system.Root.Send(echoPID, &boom{})
	r, err = Ask(ctx, system, echoPID, &ping{n: 5})
	require.NoError(t, err, "the restarted child answers")
	require.Equal(t, &pong{n: 6}, r)
	require.Equal(t, uint64(1), restarts.Load())
	require.Equal(t, int32(2), starts.Load())

	require.NoError(t, StopAndWait(ctx, system, g))
	system.Shutdown()
}

func TestAskHonoursTheCallersDeadline(t *testing.T) {
	system, g, pids, _, _ := startEcho(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Ask(ctx, system, pids["echo"], &boom{}) // no answer ever comes
	require.ErrorIs(t, err, context.Canceled)
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer stopCancel()
	require.NoError(t, StopAndWait(stopCtx, system, g))
	system.Shutdown()
}

// Actors on the warm pool are served while every worker is held by a
// Receive that blocks (a fault, a bug): an activation no worker takes runs
// on a goroutine of its own. Close then ends the workers (goleak).
func TestWarmDispatcherNeverQueuesBehindABusyWorker(t *testing.T) {
	d := NewWarmDispatcher(1, Throughput)
	gate := make(chan struct{})
	for !d.pool.TryRun(func() { <-gate }) {
		runtime.Gosched() // NB: until the one worker is idle and takes it
	}
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

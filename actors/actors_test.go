package actors

import (
	"context"
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

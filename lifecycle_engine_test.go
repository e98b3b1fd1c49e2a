package kvtier_test

// The engine endpoint costs an idle engine nothing and notices a dead one
// by event: a session arms its liveness timer only while it holds
// requests (and the client pings only then), a connection that ends
// releases its session at once, and a connection that never greets holds
// no other engine's connection for longer than the handshake bound.

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/client"
	"github.com/kvtier/kvtier/scheduler/wire"
	"github.com/kvtier/kvtier/supervision"
)

// openStandalone opens a node with an engine endpoint whose liveness runs
// on engineClock.
func openStandalone(t *testing.T, ctx context.Context, engineClock supervision.Clock) *kvtier.Node {
	t.Helper()
	return openEngineTestNode(t, ctx, "ipc", kvtier.Config{EngineClock: engineClock})
}

func TestLifecycleIdleEngineSessionArmsNoTimer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	engineClock := supervision.NewManualClock(time.Unix(1_700_000_000, 0))
	node := openStandalone(t, ctx, engineClock)
	c, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: "idle"})
	require.NoError(t, err)
	defer c.Close(ctx) //nolint:errcheck // its session is released at the end: Bye answers NO_SESSION
	require.Zero(t, engineClock.Pending(), "a session holding nothing arms no timer")

	r := &messages.ReqContext{RequestID: "r"}
	_, err = c.Lookup(ctx, r, sessionKeys(1), true)
	require.NoError(t, err)
	require.Equal(t, 1, engineClock.Pending(), "a session holding a request is watched")
	require.NoError(t, c.RequestFinished(ctx, r))
	require.Zero(t, engineClock.Pending(), "its last request finished: the timer is gone")

	engineClock.Advance(time.Hour)
	require.NoError(t, c.Ping(ctx), "an idle engine's session does not expire")

	// One holding a request and silent past its grace is released.
	_, err = c.Lookup(ctx, r, sessionKeys(1), true)
	require.NoError(t, err)
	engineClock.Advance(10 * time.Second)
	for {
		err = c.Ping(ctx)
		if err != nil {
			break
		}
		require.NoError(t, ctx.Err())
	}
	require.ErrorIs(t, err, messages.ErrNoSession)
}

// rawEngine is an engine speaking the wire protocol on a bare DEALER, so a
// test can drop its connection without a Bye, as a killed engine does.
type rawEngine struct {
	sock zmq4.Socket
	id   uint64
}

func dialRawEngine(t *testing.T, addr string) *rawEngine {
	t.Helper()
	sock := zmq4.NewDealer(context.Background(), zmq4.WithDialerMaxRetries(0))
	require.NoError(t, sock.Dial(addr))
	t.Cleanup(func() { _ = sock.Close() })
	return &rawEngine{sock: sock}
}

func (e *rawEngine) call(t *testing.T, q *wire.Request) *wire.Reply {
	t.Helper()
	e.id++
	q.ID = e.id
	require.NoError(t, e.sock.Send(zmq4.NewMsg(wire.EncodeRequest(q))))
	msg, err := e.sock.Recv()
	require.NoError(t, err)
	rp, err := wire.DecodeReply(msg.Frames[0], q.Op)
	require.NoError(t, err)
	require.Nil(t, rp.Err, "%s answered an error", q.Op)
	return rp
}

func TestLifecycleDeadEngineIsReleasedAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	engineClock := supervision.NewManualClock(time.Unix(1_700_000_000, 0)) // never advanced
	node := openStandalone(t, ctx, engineClock)
	local := node.Manager()

	e := dialRawEngine(t, node.EngineAddr())
	e.call(t, &wire.Request{Op: wire.OpHello, Client: "doomed"})
	w := &messages.ReqContext{RequestID: "w"}
	e.call(t, &wire.Request{Op: wire.OpPrepareStore, Req: w, Keys: sessionKeys(1, 2)})
	s, err := local.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, s.WritePending)

	require.NoError(t, e.sock.Close()) // no Bye: the engine is gone
	for s.WritePending+s.JobsInFlight > 0 {
		s, err = local.Stats(ctx)
		require.NoError(t, err)
		require.NoError(t, ctx.Err(), "the dead engine's session was never released")
	}
	require.Equal(t, uint64(1), s.JobsReapedStore)
	require.Zero(t, engineClock.Pending())
	// NB: the release is counted once the bridge has answered it, which
	// can come after the stats above show its effect.
	for {
		n, err := testutil.GatherAndCount(node.Registry(), "kvtier_engine_sessions_released_total")
		require.NoError(t, err)
		if n == 1 {
			break
		}
		require.Zero(t, n, "one release, one series")
		require.NoError(t, ctx.Err(), "the release was never counted")
	}
}

func TestLifecycleSilentConnectionHoldsNoEngineForever(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node := openStandalone(t, ctx, nil)
	silent, err := net.Dial("unix", strings.TrimPrefix(node.EngineAddr(), "ipc://"))
	require.NoError(t, err)
	defer silent.Close()

	c, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: "next"})
	require.NoError(t, err, "an engine connects once the silent connection's handshake bound passed")
	require.NoError(t, c.Ping(ctx))
	require.NoError(t, c.Close(ctx))
	buf := make([]byte, 1)
	require.NoError(t, silent.SetReadDeadline(time.Now().Add(10*time.Second)))
	for {
		if _, err = silent.Read(buf); err != nil {
			break // the greeting the daemon wrote, then the close
		}
	}
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the daemon closed the silent connection: %v", err)
}

package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/internal/testutil/testnet"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// The client's waits are bounded whatever the daemon does (zmq4 gives no
// deadline on a handshake or a Recv): these tests stand in for a daemon
// that stalls or vanishes, and goleak checks nothing is left behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// A daemon that accepts the connection but never speaks ZMTP (its accept
// goroutine busy or stopped) does not hold Dial past its ctx, and the
// handshake in flight ends with it.
func TestDialGivesUpOnASilentDaemon(t *testing.T) {
	path := filepath.Join(t.TempDir(), "silent.sock")
	testnet.Silent(t, testnet.Listen(t, "unix", path))

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Dial(ctx, "ipc://"+path, Options{Name: "t"})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 5*time.Second, "Dial is bounded by its ctx")
}

// fakeDaemon is a ROUTER that answers Hello (with a real pool file) and
// nothing else.
type fakeDaemon struct {
	sock  zmq4.Socket
	addr  string
	calls chan wire.Op // every request but Hello, as it arrives
	done  chan struct{}
}

func startFakeDaemon(t *testing.T) *fakeDaemon {
	t.Helper()
	dir := t.TempDir()
	const slots, block = 4, 4096
	pool := filepath.Join(dir, "pool")
	require.NoError(t, os.WriteFile(pool, make([]byte, slots*block), 0o600))
	d := &fakeDaemon{sock: zmq4.NewRouter(context.Background()), addr: "ipc://" + filepath.Join(dir, "e.sock"),
		calls: make(chan wire.Op, 16), done: make(chan struct{})}
	require.NoError(t, d.sock.Listen(d.addr))
	go func() {
		defer close(d.done)
		for {
			msg, err := d.sock.Recv()
			if err != nil {
				return
			}
			q, err := wire.DecodeRequest(msg.Frames[1])
			if err != nil {
				continue
			}
			if q.Op != wire.OpHello {
				select { // silent: calls wait for their deadline, or the connection's end
				case d.calls <- q.Op:
				default:
				}
				continue
			}
			h := wire.Hello{Protocol: wire.Version, Session: 1, PoolPath: pool, BlockBytes: block, Slots: slots,
				Heartbeat: time.Hour, Grace: time.Hour, MaxKeys: wire.MaxKeys, MaxFrameBytes: wire.MaxFrameBytes, JobWorkers: 1}
			_ = d.sock.Send(zmq4.NewMsgFrom(msg.Frames[0], wire.EncodeReply(wire.OpHello, &wire.Reply{ID: q.ID, Hello: h}, nil)))
		}
	}()
	t.Cleanup(d.close)
	return d
}

// expect waits (bounded) for the daemon to receive a call of op.
func (d *fakeDaemon) expect(t *testing.T, op wire.Op) {
	t.Helper()
	select {
	case got := <-d.calls:
		require.Equal(t, op, got)
	case <-time.After(10 * time.Second):
		t.Fatalf("the daemon never received %s", op)
	}
}

// close closes the socket and waits (bounded) for the serving goroutine.
func (d *fakeDaemon) close() {
	_ = d.sock.Close()
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		panic("fake daemon: Recv did not return after Close")
	}
}

// statsInFlight dials d and makes a Stats call, which the fake daemon never
// answers; it returns once d has the call, with the channel the call's
// error will come on.
func statsInFlight(ctx context.Context, t *testing.T, d *fakeDaemon) (*Client, <-chan error) {
	t.Helper()
	c, err := Dial(ctx, d.addr, Options{Name: "t"})
	require.NoError(t, err)
	failed := make(chan error, 1)
	go func() {
		_, err := c.Stats(ctx)
		failed <- err
	}()
	d.expect(t, wire.OpStats) // the call is in flight
	return c, failed
}

// requireClosedWithin: the call whose error comes on failed ends with
// ErrClosed within 10 seconds; what says otherwise.
func requireClosedWithin(t *testing.T, failed <-chan error, what string) {
	t.Helper()
	select {
	case err := <-failed:
		require.ErrorIs(t, err, messages.ErrClosed)
	case <-time.After(10 * time.Second):
		t.Fatal(what)
	}
}

// A call in flight when the daemon goes away fails at once with ErrClosed,
// not at its deadline; so does every later call, and Close is prompt.
func TestCallsFailFastWhenTheConnectionIsLost(t *testing.T) {
	d := startFakeDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, failed := statsInFlight(ctx, t, d)
	d.close()
	start := time.Now()
	requireClosedWithin(t, failed, "a call outlived its connection")
	require.ErrorIs(t, c.Ping(ctx), messages.ErrClosed)
	closeErr := c.Close(ctx)
	require.True(t, closeErr == nil || errors.Is(closeErr, messages.ErrClosed), "%v", closeErr)
	require.Less(t, time.Since(start), 10*time.Second)
}

// Close while a call waits: the call ends with ErrClosed and Close returns
// without waiting for the call's deadline.
func TestCloseEndsCallsInFlight(t *testing.T) {
	d := startFakeDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, failed := statsInFlight(ctx, t, d)
	closeCtx, closeCancel := context.WithTimeout(ctx, 100*time.Millisecond) // Bye is never answered
	defer closeCancel()
	start := time.Now()
	err := c.Close(closeCtx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "Bye unanswered within Close's ctx")
	requireClosedWithin(t, failed, "a call outlived Close")
	require.Less(t, time.Since(start), 10*time.Second)
}

// A send that fails because the daemon's end is gone (EPIPE, reset, a
// connection zmq4 already closed) is ErrClosed like any other sign the
// daemon went away, even before the read loop has noticed; other send
// failures are not.
func TestSendFailuresOfAGoneDaemonAreErrClosed(t *testing.T) {
	for _, err := range []error{
		&net.OpError{Op: "write", Net: "unix", Err: os.NewSyscallError("write", unix.EPIPE)},
		&net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", unix.ECONNRESET)},
		fmt.Errorf("zmq4: error sending frame 1/1: %w", zmq4.ErrClosedConn),
		net.ErrClosed,
	} {
		require.True(t, connectionGone(err), "%v", err)
	}
	require.False(t, connectionGone(context.DeadlineExceeded))
	require.False(t, connectionGone(errors.New("zmq4: something else")))
}

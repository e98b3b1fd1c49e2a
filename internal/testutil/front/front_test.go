package front

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/internal/testutil/testnet"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo is a backend that echoes each connection.
func echo(t *testing.T) string {
	ln := testnet.Listen(t, "tcp", "127.0.0.1:0")
	conns := testnet.Accept(t, ln)
	go func() {
		for c := range conns {
			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// ping writes and reads back one message on c.
func ping(t *testing.T, c net.Conn) error {
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	require.Equal(t, "ping", string(got))
	return nil
}

func roundTrip(t *testing.T, addr string) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	return ping(t, c)
}

// TestFrontHoldsItsPortAcrossARestart: down, the front's port refuses
// connections as a dead server's would, and no other socket can take it;
// up again, it relays to the new backend.
func TestFrontHoldsItsPortAcrossARestart(t *testing.T) {
	f, err := New()
	require.NoError(t, err)
	defer f.Close()
	require.True(t, errors.Is(roundTrip(t, f.Addr()), syscall.ECONNREFUSED), "not served yet: refused")
	require.NoError(t, f.Serve(echo(t)))
	require.NoError(t, roundTrip(t, f.Addr()))

	f.Down()
	require.True(t, errors.Is(roundTrip(t, f.Addr()), syscall.ECONNREFUSED), "down: refused")
	_, err = net.Listen("tcp", f.Addr())
	require.Error(t, err, "the port stays ours while the server is down")

	require.NoError(t, f.Serve(echo(t)))
	require.NoError(t, roundTrip(t, f.Addr()))
}

// TestDownClosesRelayedConnections: a connection relayed while the server
// was up ends when it goes down, as one to a dead server would; Close
// twice is once, and Serve after it fails.
func TestDownClosesRelayedConnections(t *testing.T) {
	f, err := New()
	require.NoError(t, err)
	require.NoError(t, f.Serve(echo(t)))
	c, err := net.Dial("tcp", f.Addr())
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, ping(t, c), "relayed (and so tracked)")

	f.Down()
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the relayed connection is closed")

	f.Close()
	f.Close()
	require.ErrorIs(t, f.Serve(echo(t)), ErrClosed)
}

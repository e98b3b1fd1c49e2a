package objtest

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo is a backend that echoes each connection.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

func roundTrip(t *testing.T, addr string) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
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

// TestFrontHoldsItsPortAcrossARestart: down, the front's port refuses
// connections as a dead server's would, and no other socket can take it;
// up again, it relays to the new backend.
func TestFrontHoldsItsPortAcrossARestart(t *testing.T) {
	f, err := newFront()
	require.NoError(t, err)
	defer f.close()
	require.NoError(t, f.serve(echo(t)))
	require.NoError(t, roundTrip(t, f.addr()))

	f.down()
	require.True(t, errors.Is(roundTrip(t, f.addr()), syscall.ECONNREFUSED), "down: refused")
	_, err = net.Listen("tcp", f.addr())
	require.Error(t, err, "the port stays ours while the server is down")

	require.NoError(t, f.serve(echo(t)))
	require.NoError(t, roundTrip(t, f.addr()))
}

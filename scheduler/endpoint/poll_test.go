package endpoint

import (
	"bufio"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/scheduler/wire"
)

// unixPair is a connected Unix stream pair: the accepted end (the
// daemon's) and the dialled one (the engine's).
func unixPair(t *testing.T) (server, client net.Conn) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "p.sock"))
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			c = nil
		}
		accepted <- c
	}()
	client, err = net.Dial("unix", ln.Addr().String())
	require.NoError(t, err)
	server = <-accepted
	require.NotNil(t, server)
	t.Cleanup(func() { client.Close(); server.Close() }) // NB: the engine's end first: a polling reader then sees EOF
	return server, client
}

// echoFrames answers each frame read on c with the same frame until c
// ends, then reports how it ended.
func echoFrames(c net.Conn) <-chan error {
	done := make(chan error, 1)
	go func() {
		r := bufio.NewReader(c)
		for {
			f, err := wire.ReadFrame(r)
			if err != nil {
				done <- err
				return
			}
			if err := wire.WriteFrame(c, f); err != nil {
				done <- err
				return
			}
		}
	}()
	return done
}

func roundTrips(t *testing.T, c net.Conn, n int) {
	r := bufio.NewReader(c)
	for i := range n {
		body := []byte{byte(i), byte(i >> 8), 'k', 'v'}
		require.NoError(t, wire.WriteFrame(c, body))
		got, err := wire.ReadFrame(r)
		require.NoError(t, err)
		require.Equal(t, body, got, "round trip %d", i)
	}
}

// Within its window a polled connection answers back-to-back frames
// without ever waiting in the network poller; past it, it waits there as
// a plain connection does and still reads every frame that comes later.
// Either way the engine closing its end ends the reader with EOF.
func TestPollConnParksOnlyPastItsWindow(t *testing.T) {
	t.Run("within", func(t *testing.T) {
		server, client := unixPair(t)
		pc := newPollConn(server, time.Hour).(*pollConn) // NB: a window no gap of this test outlasts
		done := echoFrames(pc)
		roundTrips(t, client, 100)
		require.Zero(t, pc.parks.Load(), "reads that waited in the poller")
		require.NoError(t, client.Close())
		require.ErrorIs(t, <-done, io.EOF)
	})
	t.Run("past", func(t *testing.T) {
		server, client := unixPair(t)
		pc := newPollConn(server, time.Nanosecond).(*pollConn)
		done := echoFrames(pc)
		roundTrips(t, client, 1)
		// NB: nothing is written until the reader has waited in the poller:
		// back to back, a loaded box can wake the engine's side first every
		// time, so that each read finds its frame already there.
		require.Eventually(t, func() bool { return pc.parks.Load() > 0 },
			30*time.Second, time.Millisecond, "an idle reader past its window never waited in the poller")
		roundTrips(t, client, 100)
		require.NoError(t, client.Close())
		require.ErrorIs(t, <-done, io.EOF)
	})
}

// Closing the daemon's end while its reader is polling, within a window
// far longer than the test, returns at once and ends the read with
// net.ErrClosed (the endpoint's close path).
func TestPollConnCloseEndsAPollingRead(t *testing.T) {
	server, client := unixPair(t)
	pc := newPollConn(server, time.Hour).(*pollConn)
	done := echoFrames(pc)
	roundTrips(t, client, 1) // NB: the reader is polling now
	closed := make(chan error, 1)
	go func() { closed <- pc.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(30 * time.Second): // NB: a bound for a hang, not a wait
		t.Fatal("Close waited for the polling window")
	}
	err := <-done
	require.True(t, errors.Is(err, net.ErrClosed), "got %v", err)
}

// Replies are written to the wrapped connection itself: net.Buffers (one
// frame, one writev) writes in one call only to net's own connections.
func TestPollConnRepliesGoToTheRawConnection(t *testing.T) {
	server, _ := unixPair(t)
	pc := newPollConn(server, time.Millisecond)
	w, polled := raw(pc)
	require.Same(t, server, w)
	require.Same(t, pc, polled)
	w, polled = raw(server)
	require.Same(t, server, w)
	require.Nil(t, polled)
}

// A window of 0 or less, or a connection without a descriptor, is not
// wrapped.
func TestPollConnNotWrappedWithoutAWindow(t *testing.T) {
	server, _ := unixPair(t)
	require.Same(t, server, newPollConn(server, 0))
	require.Same(t, server, newPollConn(server, -time.Microsecond))
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	require.Equal(t, a, newPollConn(a, time.Millisecond), "net.Pipe has no descriptor")
}

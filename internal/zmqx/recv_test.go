package zmqx

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClosedTellsTheSocketsEndFromAConnections(t *testing.T) {
	assert.True(t, Closed(context.Canceled))
	assert.True(t, Closed(fmt.Errorf("recv: %w", context.DeadlineExceeded)))
	assert.False(t, Closed(io.EOF), "a connection's end: the socket serves on")
	assert.False(t, Closed(zmq4.ErrClosedConn), "one connection closed, not the socket")
}

// served is a listening DEALER served by Serve on a goroutine, and a DEALER
// connected to it; got receives each message's body, ended each
// connection's end. (A zmq4 ROUTER passes its connections' ends over
// itself; a DEALER reports them.)
type served struct {
	server, dealer zmq4.Socket
	got            chan string
	ended          chan error
	done           chan struct{}
}

func serve(t *testing.T, stopAt string) *served {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	addr := "ipc://" + filepath.Join(t.TempDir(), "serve.sock")
	s := &served{
		server: zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity("server"))),
		dealer: zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity("dealer"))),
		got:    make(chan string, 16), ended: make(chan error, 16), done: make(chan struct{}),
	}
	require.NoError(t, s.server.Listen(addr))
	require.NoError(t, s.dealer.Dial(addr))
	go func() {
		defer close(s.done)
		Serve(s.server, func(m zmq4.Msg) bool {
			body := string(m.Frames[len(m.Frames)-1])
			s.got <- body
			return body != stopAt
		}, func(err error) bool { s.ended <- err; return true })
	}()
	t.Cleanup(func() { _ = s.dealer.Close(); _ = s.server.Close(); <-s.done })
	return s
}

func (s *served) send(t *testing.T, bodies ...string) {
	t.Helper()
	for _, b := range bodies {
		require.NoError(t, s.dealer.Send(zmq4.NewMsgString(b)))
	}
}

func recvWithin[T any](t *testing.T, c <-chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("nothing received within 10s")
	}
	var zero T
	return zero
}

func TestServeHandsOverMessagesInOrderUntilToldToStop(t *testing.T) {
	s := serve(t, "stop")
	s.send(t, "a", "b", "stop", "after")
	for _, want := range []string{"a", "b", "stop"} {
		assert.Equal(t, want, recvWithin(t, s.got))
	}
	recvWithin(t, s.done)
	assert.Empty(t, s.got, "nothing is handed over once each said stop")
}

func TestServeGoesOnPastAConnectionsEndAndStopsWhenTheSocketCloses(t *testing.T) {
	s := serve(t, "")
	s.send(t, "first")
	assert.Equal(t, "first", recvWithin(t, s.got))
	require.NoError(t, s.dealer.Close())
	err := recvWithin(t, s.ended)
	assert.False(t, Closed(err), "a connection's end, not the socket's: %v", err)
	select {
	case <-s.done:
		t.Fatal("Serve returned on a connection's end")
	default:
	}
	_ = s.server.Close() // NB: may report the connection already closed
	recvWithin(t, s.done)
}

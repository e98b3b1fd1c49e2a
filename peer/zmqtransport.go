package peer

import (
	"context"
	"net"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// Links dial through a zmq4 transport of our own ("kvtier-peer+tcp") that
// dials exactly as zmq4's tcp does but closes the connection when the
// dialing socket's context ends. NB: zmq4 v0.17.0 runs the ZMTP handshake
// with no deadline and outside the socket's context, so a peer that accepts
// but never greets would hold Dial (and its goroutine) forever, and
// Socket.Close would not reach it; closing on the context bounds both by
// the session's handshake timeout (which closes the link). The listening
// side bounds its handshakes through scheduler.BoundedListenAddr.
const dialScheme = "kvtier-peer+tcp"

var registerDial sync.Once

func dialAddr(addr string) string {
	registerDial.Do(func() {
		if err := zmq4.RegisterTransport(dialScheme, closingTransport{transport.New("tcp")}); err != nil {
			panic(err) // once per process: cannot collide
		}
	})
	if rest, ok := strings.CutPrefix(addr, "tcp://"); ok {
		return dialScheme + "://" + rest
	}
	return addr
}

type closingTransport struct{ transport.Transport }

// Dial implements transport.Transport.
func (t closingTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	conn, err := t.Transport.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	return &closingConn{Conn: conn, stop: stop}, nil
}

type closingConn struct {
	net.Conn
	stop func() bool
}

// Close implements net.Conn.
func (c *closingConn) Close() error {
	c.stop()
	return c.Conn.Close()
}

// Package zmqx holds what every ZeroMQ socket of kvtier needs beyond zmq4
// itself: dialing transports whose connections close with their socket. It
// owns no sockets and no goroutines of its own.
package zmqx

import (
	"context"
	"net"
	"strings"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// Dialing sockets (the engine client's DEALER, the peer links) go through
// zmq4 transports of our own (registered once, under schemes of their own),
// which dial exactly as zmq4's ipc and tcp do but tie every connection to
// the socket that made it: when the socket closes, the connection closes.
//
// NB: zmq4 v0.17.0 needs this for Dial and Close to be bounded (docs/DESIGN.md
// §10). Its handshake (greeting, READY) reads with no deadline and ignores
// the socket's context, so a daemon that accepts but never greets — one
// whose single accept goroutine is busy, or stopped — holds Dial forever;
// and Socket.Close closes only the connections it finished adding, so a
// handshake in flight, or a reader goroutine on a connection zmq4 already
// dropped from its list, would outlive Close. zmq4 passes the socket's
// context to Transport.Dial, so closing on that context reaches all of them.

// schemes maps an engine address's transport to the client's own.
var schemes = map[string]string{"ipc": "kvtier+ipc", "tcp": "kvtier+tcp"}

func init() {
	register(schemes, func(network string) transport.Transport { return closingTransport{transport.New(network)} })
}

// register installs, once per process, a transport of ours for each of
// zmq4's ipc and tcp schemes, under the names in ours.
func register(ours map[string]string, build func(network string) transport.Transport) {
	for zmq, name := range ours {
		network := map[string]string{"ipc": "unix", "tcp": "tcp"}[zmq]
		if err := zmq4.RegisterTransport(name, build(network)); err != nil {
			panic(err) // registered once per process, at init: cannot collide
		}
	}
}

// rewrite points an ipc:// or tcp:// address at our transport for its
// scheme; any other address is left for zmq4 to accept or refuse.
func rewrite(addr string, ours map[string]string) string {
	scheme, rest, ok := strings.Cut(addr, "://")
	if name, known := ours[scheme]; ok && known {
		return name + "://" + rest
	}
	return addr
}

// ClosingDialAddr rewrites ipc:// and tcp:// to the closing transports; any
// other address is left for zmq4 to accept or refuse. Dial it instead of
// addr so that the socket's Close (or a handshake deadline that closes it)
// reaches a connection whose ZMTP handshake never ends.
func ClosingDialAddr(addr string) string { return rewrite(addr, schemes) }

// closingTransport is a zmq4 transport whose connections close when the
// dialing socket's context ends.
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

// closingConn is a connection that also closes when its socket does.
type closingConn struct {
	net.Conn
	stop func() bool
}

// Close implements net.Conn.
func (c *closingConn) Close() error {
	c.stop()
	return c.Conn.Close()
}

package events

import (
	"context"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// A connecting PUB (PublisherConfig.Mode connect) dials through zmq4
// transports of its own, registered once under schemes of their own, which
// dial exactly as zmq4's tcp and ipc do but report when the connection
// ends, so the publisher dials again: its router restarted, or was not up
// yet. A connection's ZMTP handshake runs under a deadline (zmq4 v0.17.0
// sets none), cleared once Dial returned, so a peer that accepts and never
// greets is given up on and dialled again; and the connection closes with
// the socket (its context), so nothing holds Dial past Close.
//
// NB: not zmq4's WithAutomaticReconnect (v0.17.0): it dials again from
// inside the callback of whichever goroutine saw the connection fail,
// which for a PUB is the writer holding its connection list's lock, which
// the new connection then needs: a deadlock.

var linkSchemes = map[string]string{"tcp": "kvtier-events+tcp", "ipc": "kvtier-events+ipc"}

func init() {
	for zmq, name := range linkSchemes {
		network := map[string]string{"tcp": "tcp", "ipc": "unix"}[zmq]
		if err := zmq4.RegisterTransport(name, linkTransport{transport.New(network)}); err != nil {
			panic(err) // registered once per process, at init: cannot collide
		}
	}
}

// linkAddr points a tcp:// or ipc:// address at the link transports; any
// other address is left for zmq4 to accept or refuse.
func linkAddr(addr string) string {
	scheme, rest, ok := strings.Cut(addr, "://")
	if name, known := linkSchemes[scheme]; ok && known {
		return name + "://" + rest
	}
	return addr
}

// link is the connection of a socket that dials one peer at a time. It
// rides in the socket's context (zmq4 hands that to Transport.Dial).
type link struct {
	ended     chan struct{} // capacity 1: the dialled connection closed
	handshake time.Duration // bound on a new connection's ZMTP handshake

	mu   sync.Mutex
	last net.Conn // the latest dialled connection
}

type linkKey struct{}

func newLink(handshake time.Duration) *link {
	return &link{ended: make(chan struct{}, 1), handshake: handshake}
}

func (l *link) context(ctx context.Context) context.Context {
	return context.WithValue(ctx, linkKey{}, l)
}

// reset forgets an end reported before the next dial.
func (l *link) reset() {
	select {
	case <-l.ended:
	default:
	}
}

// established clears the latest connection's handshake deadline: Dial
// returned, the handshake is over.
func (l *link) established() {
	l.mu.Lock()
	c := l.last
	l.mu.Unlock()
	if c != nil {
		_ = c.SetDeadline(time.Time{})
	}
}

// abandon closes the latest connection: its Dial failed after connecting
// (zmq4 drops a connection whose handshake failed without closing it).
func (l *link) abandon() {
	l.mu.Lock()
	c := l.last
	l.last = nil
	l.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

type linkTransport struct{ transport.Transport }

// Dial implements transport.Transport.
func (t linkTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	conn, err := t.Transport.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	l, _ := ctx.Value(linkKey{}).(*link)
	c := &linkConn{Conn: conn, link: l}
	c.stop = context.AfterFunc(ctx, func() { _ = conn.Close() })
	if l != nil {
		_ = conn.SetDeadline(time.Now().Add(l.handshake))
		l.mu.Lock()
		l.last = c
		l.mu.Unlock()
	}
	return c, nil
}

// linkConn is a dialled connection that reports its end to its link.
type linkConn struct {
	net.Conn
	link *link
	stop func() bool
	once sync.Once
}

// Close implements net.Conn: zmq4 closes a connection once a read or a
// write on it failed (the peer went away) and when the socket closes.
func (c *linkConn) Close() error {
	c.once.Do(func() {
		c.stop()
		if c.link != nil {
			select {
			case c.link.ended <- struct{}{}:
			default:
			}
		}
	})
	return c.Conn.Close()
}

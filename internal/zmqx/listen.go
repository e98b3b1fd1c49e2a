package zmqx

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4/transport"
)

// Listening ROUTERs (the engine endpoint's, the peer control plane's)
// listen through zmq4 transports of their own (registered once, under
// schemes of their own, as the dialing transports are), which wrap every
// accepted connection:
//
//   - the ZMTP handshake is bounded: zmq4 v0.17.0 runs it with no deadline
//     inside its single accept loop, so one connection that never greets
//     would hold every later engine's connection (docs/DESIGN.md §10). The read
//     deadline is cleared once the client's READY is read.
//   - the connection's end is an event: the wrapper learns the client's
//     ZMQ identity from that READY (the routing id the endpoint knows its
//     session by) and, when zmq4 closes the connection (its read failed:
//     the engine exited or was killed), reports it. A dead engine's session
//     is released at once, with no heartbeat and no timer.

// handshakeTimeout bounds a new engine connection's ZMTP handshake.
const handshakeTimeout = 5 * time.Second

// watchSchemes maps an endpoint address's transport to the watching one.
var watchSchemes = map[string]string{"ipc": "kvtier-endpoint+ipc", "tcp": "kvtier-endpoint+tcp"}

func init() {
	register(watchSchemes, func(network string) transport.Transport { return watchTransport{transport.New(network)} })
}

// ConnWatch receives the end of every connection whose identity is known.
// It must not block.
type ConnWatch func(identity string)

type connWatchKey struct{}

// WithConnWatch is the context to make a ROUTER with (listening on a
// BoundedListenAddr) so that w learns the ZMQ identity of every connection
// that ends: zmq4 hands the socket's context (derived from it) to the
// transport's Listen. w must not block.
func WithConnWatch(ctx context.Context, w ConnWatch) context.Context {
	return context.WithValue(ctx, connWatchKey{}, w)
}

// BoundedListenAddr rewrites a tcp:// or ipc:// address so that a ROUTER
// listening on it runs each connection's ZMTP handshake under a deadline
// (handshakeTimeout): one connection that never greets cannot hold zmq4's
// single accept loop.
func BoundedListenAddr(addr string) string { return rewrite(addr, watchSchemes) }

type watchTransport struct{ transport.Transport }

// Listen implements transport.Transport.
func (t watchTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	ln, err := t.Transport.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	w, _ := ctx.Value(connWatchKey{}).(ConnWatch)
	return newWatchedListener(ln, w), nil
}

// watchedListener hands zmq4 only connections whose peer has begun its
// greeting (sent the 10-byte ZMTP signature, which every ZMTP 3 peer, zmq4
// or libzmq, sends unprompted). zmq4 runs each handshake inside its single
// accept loop, so a connection that never speaks would otherwise hold every
// later one for handshakeTimeout; here it waits in a goroutine of its own.
type watchedListener struct {
	net.Listener
	watch  ConnWatch
	ready  chan net.Conn // connections that have sent their signature
	failed chan error    // the raw listener's Accept errors
	done   chan struct{} // closed by Close

	mu      sync.Mutex
	closed  bool
	waiting map[net.Conn]struct{} // accepted, signature not yet read
}

func newWatchedListener(ln net.Listener, w ConnWatch) *watchedListener {
	l := &watchedListener{Listener: ln, watch: w, ready: make(chan net.Conn),
		failed: make(chan error), done: make(chan struct{}), waiting: map[net.Conn]struct{}{}}
	go l.acceptRaw()
	return l
}

func (l *watchedListener) acceptRaw() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			select {
			case l.failed <- err:
			case <-l.done:
				return
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if !l.track(c) {
			_ = c.Close()
			return
		}
		go l.awaitSignature(c)
	}
}

// track notes c as waiting for its signature; false once the listener closed.
func (l *watchedListener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.waiting[c] = struct{}{}
	return true
}

func (l *watchedListener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.waiting, c)
	l.mu.Unlock()
}

func (l *watchedListener) awaitSignature(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(handshakeTimeout))
	sig := make([]byte, zmtpSignature)
	_, err := io.ReadFull(c, sig)
	l.untrack(c)
	if err != nil {
		_ = c.Close()
		return
	}
	select {
	case l.ready <- &watchedConn{Conn: c, watch: l.watch, unread: sig}:
	case <-l.done:
		_ = c.Close()
	}
}

// Accept implements net.Listener.
func (l *watchedListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case err := <-l.failed:
		return nil, err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener: it also ends the connections still
// waiting for their signature.
func (l *watchedListener) Close() error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.done)
		for c := range l.waiting {
			_ = c.Close()
		}
	}
	l.mu.Unlock()
	return l.Listener.Close()
}

// watchedConn is one engine connection.
type watchedConn struct {
	net.Conn
	watch  ConnWatch
	unread []byte // read by the listener before zmq4 got the connection

	// Read only by zmq4's one reader at a time (its handshake, then its
	// connection reader): no lock.
	hs       []byte // handshake bytes read so far
	greeted  bool   // handshake over (identity parsed or given up on)
	identity string

	once sync.Once
}

// Read implements net.Conn.
func (c *watchedConn) Read(p []byte) (int, error) {
	var n int
	var err error
	if len(c.unread) > 0 {
		n = copy(p, c.unread)
		c.unread = c.unread[n:]
	} else {
		n, err = c.Conn.Read(p)
	}
	if !c.greeted {
		if err != nil {
			// NB: zmq4 drops a connection whose handshake failed without
			// closing it.
			c.greeted = true
			_ = c.Conn.Close()
			return n, err
		}
		c.hs = append(c.hs, p[:n]...)
		if id, done := readyIdentity(c.hs); done {
			c.greeted, c.identity, c.hs = true, id, nil
			_ = c.Conn.SetReadDeadline(time.Time{})
		}
	}
	return n, err
}

// Close implements net.Conn: zmq4 closes a connection once its read failed
// (the engine went away) or when the socket closes.
func (c *watchedConn) Close() error {
	c.once.Do(func() {
		if c.identity != "" && c.watch != nil {
			c.watch(c.identity)
		}
	})
	return c.Conn.Close()
}

// ZMTP 3.x framing (rfc.zeromq.org/spec/23): a 64-byte greeting, then, for
// the NULL mechanism, the client's READY command: a flags byte (0x04, or
// 0x06 with an 8-byte size), the size, then the command name as a short
// string and its metadata as (short-string name, 4-byte-length value)
// pairs, among which "Identity".
const (
	zmtpSignature   = 10 // 0xFF, 8 padding bytes, 0x7F: sent before anything is read
	zmtpGreeting    = 64
	zmtpCommand     = 0x04
	zmtpLong        = 0x02
	maxReadyBytes   = 64 << 10
	zmtpReadyName   = "READY"
	zmtpIdentityKey = "identity"
)

// readyIdentity parses the handshake bytes read so far. done is true once
// they hold the whole READY command (identity is its Identity, possibly
// empty) or cannot be one (identity empty: the connection goes unwatched).
func readyIdentity(b []byte) (identity string, done bool) {
	if len(b) < zmtpGreeting+2 {
		return "", false
	}
	b = b[zmtpGreeting:]
	flags := b[0]
	if flags&zmtpCommand == 0 {
		return "", true
	}
	var size uint64
	if flags&zmtpLong != 0 {
		if len(b) < 9 {
			return "", false
		}
		size, b = binary.BigEndian.Uint64(b[1:9]), b[9:]
	} else {
		size, b = uint64(b[1]), b[2:]
	}
	if size > maxReadyBytes {
		return "", true
	}
	if uint64(len(b)) < size {
		return "", false
	}
	body := b[:size]
	if len(body) < 1 || int(body[0]) > len(body)-1 || string(body[1:1+body[0]]) != zmtpReadyName {
		return "", true
	}
	body = body[1+body[0]:]
	for len(body) > 0 {
		nl := int(body[0])
		if len(body) < 1+nl+4 {
			return "", true
		}
		name := body[1 : 1+nl]
		vl := binary.BigEndian.Uint32(body[1+nl : 5+nl])
		body = body[5+nl:]
		if uint64(len(body)) < uint64(vl) {
			return "", true
		}
		if bytes.EqualFold(name, []byte(zmtpIdentityKey)) {
			return string(body[:vl]), true
		}
		body = body[vl:]
	}
	return "", true
}

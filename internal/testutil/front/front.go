// Package front holds the stable endpoint of a test server that dies and
// comes back (objtest's versitygw, testetcd's etcd): a loopback port this
// process holds for the Front's life, relaying each connection to the
// server's current address. The server behind it listens on a port of its
// own, a new one at each start, so a restart never races another process
// for the port it just freed.
//
// A Front owns its port, its listener while the server is up, and the
// goroutines and connections of the relays; Close ends them all. It never
// touches the server: it does not start, stop or pick a port for it, and
// it only learns where the server is from Serve and that it is gone from
// Down.
package front

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrClosed: Serve on a Front that Close ended.
var ErrClosed = errors.New("front: closed")

// Front is the stable endpoint of a restartable server.
//
// The port is held by a socket bound with SO_REUSEPORT that never listens:
// no other process can bind the port (a plain bind is refused while it is
// held), and while the server is down nothing listens on it, so a client's
// connection is refused, as against a dead server's port. While the server
// is up a listener on the same port (SO_REUSEPORT too) accepts and relays.
type Front struct {
	hold int // the bound, never-listening socket that keeps the port ours
	port int
	wg   sync.WaitGroup

	mu      sync.Mutex
	closed  bool         // NB: hold is closed once: again, it could be a descriptor reused meanwhile
	ln      net.Listener // nil while the server is down
	backend string
	conns   map[net.Conn]struct{}
}

// New holds a free loopback port, not listening yet (connections to it
// are refused until Serve).
func New() (*Front, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("front: socket: %w", err)
	}
	sa := &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}
	if err := reusePort(fd); err != nil {
		_ = syscall.Close(fd)
		return nil, err
	}
	if err := syscall.Bind(fd, sa); err != nil {
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("front: bind: %w", err)
	}
	bound, err := syscall.Getsockname(fd)
	if err != nil {
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("front: address: %w", err)
	}
	return &Front{hold: fd, port: bound.(*syscall.SockaddrInet4).Port, conns: map[net.Conn]struct{}{}}, nil
}

func reusePort(fd int) error {
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		return fmt.Errorf("front: SO_REUSEPORT: %w", err)
	}
	return nil
}

// Addr is the endpoint, 127.0.0.1:port, the same for the Front's life.
func (f *Front) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(f.port)) }

// Serve relays new connections to backend (host:port), listening if it
// was not.
func (f *Front) Serve(backend string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return ErrClosed
	}
	f.backend = backend
	if f.ln != nil {
		return nil
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = reusePort(int(fd)) }); cerr != nil {
			return cerr
		}
		return err
	}}
	ln, err := lc.Listen(context.Background(), "tcp4", f.Addr())
	if err != nil {
		return fmt.Errorf("front: listen: %w", err)
	}
	f.ln = ln
	f.wg.Add(1)
	go f.accept(ln)
	return nil
}

// Down stops listening (new connections are refused) and closes every
// relayed connection: the server is gone, and its clients see it so.
func (f *Front) Down() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.backend = ""
	if f.ln != nil {
		_ = f.ln.Close()
		f.ln = nil
	}
	for c := range f.conns {
		_ = c.Close()
	}
}

// Close ends the front: the listener, every connection and goroutine, the
// port. Calling it again does nothing.
func (f *Front) Close() {
	f.mu.Lock()
	first := !f.closed
	f.closed = true // NB: before Down: a Serve meanwhile would start an accept loop past the Wait
	f.mu.Unlock()
	f.Down()
	f.wg.Wait()
	if first {
		_ = syscall.Close(f.hold)
	}
}

func (f *Front) accept(ln net.Listener) {
	defer f.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		f.wg.Add(1)
		go f.relay(c)
	}
}

// relay copies c to and from the backend until either side ends.
func (f *Front) relay(c net.Conn) {
	defer f.wg.Done()
	f.mu.Lock()
	backend := f.backend
	f.mu.Unlock()
	b, err := net.Dial("tcp", backend)
	if err != nil {
		_ = c.Close()
		return
	}
	if !f.track(c, b) {
		return
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(b, c)
		_ = b.Close()
		close(done)
	}()
	_, _ = io.Copy(c, b)
	_ = c.Close()
	<-done
	f.untrack(c, b)
}

// track registers a relayed pair, or closes it when the server went down
// meanwhile.
func (f *Front) track(c, b net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ln == nil {
		_ = c.Close()
		_ = b.Close()
		return false
	}
	f.conns[c], f.conns[b] = struct{}{}, struct{}{}
	return true
}

func (f *Front) untrack(c, b net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	delete(f.conns, b)
	f.mu.Unlock()
}

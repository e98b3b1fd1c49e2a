package objtest

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// front is the stable endpoint of a restartable server: a loopback port
// this process holds for the server's life, relaying each connection to
// the server's current address.
//
// The port is held by a socket bound with SO_REUSEPORT that never listens:
// no other process can bind the port (a plain bind is refused while it is
// held), and while the server is down nothing listens on it, so a client's
// connection is refused, as against a dead server's port. While the server
// is up a listener on the same port (SO_REUSEPORT too) accepts and relays.
type front struct {
	hold int // the bound, never-listening socket that keeps the port ours
	port int
	wg   sync.WaitGroup

	mu      sync.Mutex
	ln      net.Listener // nil while the server is down
	backend string
	conns   map[net.Conn]struct{}
}

func newFront() (*front, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("objtest: front socket: %w", err)
	}
	sa := &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}
	if err := reusePort(fd); err != nil {
		_ = syscall.Close(fd)
		return nil, err
	}
	if err := syscall.Bind(fd, sa); err != nil {
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("objtest: front bind: %w", err)
	}
	bound, err := syscall.Getsockname(fd)
	if err != nil {
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("objtest: front address: %w", err)
	}
	return &front{hold: fd, port: bound.(*syscall.SockaddrInet4).Port, conns: map[net.Conn]struct{}{}}, nil
}

func reusePort(fd int) error {
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		return fmt.Errorf("objtest: front SO_REUSEPORT: %w", err)
	}
	return nil
}

func (f *front) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(f.port)) }

// serve relays new connections to backend, listening if it was not.
func (f *front) serve(backend string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
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
	ln, err := lc.Listen(context.Background(), "tcp4", f.addr())
	if err != nil {
		return fmt.Errorf("objtest: front listen: %w", err)
	}
	f.ln = ln
	f.wg.Add(1)
	go f.accept(ln)
	return nil
}

// down stops listening (new connections are refused) and closes every
// relayed connection.
func (f *front) down() {
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

// close ends the front: the listener, every connection and goroutine, the
// port.
func (f *front) close() {
	f.down()
	f.wg.Wait()
	_ = syscall.Close(f.hold)
}

func (f *front) accept(ln net.Listener) {
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
func (f *front) relay(c net.Conn) {
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
func (f *front) track(c, b net.Conn) bool {
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

func (f *front) untrack(c, b net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	delete(f.conns, b)
	f.mu.Unlock()
}

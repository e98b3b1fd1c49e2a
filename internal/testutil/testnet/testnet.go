// Package testnet holds the listeners tests stand up in place of a peer: one
// that hands each accepted connection to the test, and one that accepts and
// then never speaks; a connected loopback pair; and a directory short
// enough for unix sockets. Every goroutine it starts ends by the time the
// test's cleanups have run, so goleak checks stay meaningful.
package testnet

import (
	"net"
	"os"
	"testing"
)

// Listen listens on network and address, failing the test on an error;
// the listener is closed when the test ends.
func Listen(t testing.TB, network, address string) net.Listener {
	t.Helper()
	ln, err := net.Listen(network, address)
	if err != nil {
		t.Fatalf("testnet: listen %s %s: %v", network, address, err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// Accept accepts on ln on a goroutine and sends each connection on the
// returned channel (buffered; the goroutine waits while it is full). The
// channel is closed once Accept fails: after ln is closed, ranging over
// it yields the connections not yet received. When the test ends, ln is
// closed and every connection still in the channel is closed.
func Accept(t testing.TB, ln net.Listener) <-chan net.Conn {
	conns := make(chan net.Conn, 16)
	go func() {
		defer close(conns)
		acceptAll(ln, func(c net.Conn) { conns <- c })
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		for c := range conns {
			_ = c.Close()
		}
	})
	return conns
}

// Silent accepts every connection on ln and never reads or writes one: a
// peer that is up but hangs every handshake. When the test ends, ln is
// closed, the accepting goroutine waited for, and every connection closed.
func Silent(t testing.TB, ln net.Listener) net.Listener {
	done := make(chan struct{})
	var held []net.Conn // written by the goroutine, read after done
	go func() {
		defer close(done)
		acceptAll(ln, func(c net.Conn) { held = append(held, c) })
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		for _, c := range held {
			_ = c.Close()
		}
	})
	return ln
}

// Pair is the two ends of one TCP connection over loopback: the one that
// dialed and the one accepted. Both are closed when the test ends.
func Pair(t testing.TB) (dialed, accepted net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		_ = a.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	return a, b
}

// SocketDir is a new temporary directory whose unix socket paths fit
// sun_path (108 bytes), which t.TempDir's, named after the test, may not;
// it is removed when the test ends.
func SocketDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvtier-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// acceptAll calls handle with each connection ln accepts until Accept
// fails.
func acceptAll(ln net.Listener, handle func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		handle(c)
	}
}

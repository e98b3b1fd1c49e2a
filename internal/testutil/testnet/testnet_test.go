package testnet

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func dial(t *testing.T, ln net.Listener) net.Conn {
	t.Helper()
	c, err := net.Dial(ln.Addr().Network(), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestAcceptHandsOverConnectionsAndClosesTheRest(t *testing.T) {
	outer := t
	var left net.Conn
	t.Run("serve", func(t *testing.T) {
		ln := Listen(t, "tcp", "127.0.0.1:0")
		conns := Accept(t, ln)
		dial(t, ln)
		select {
		case c := <-conns:
			_ = c.Close()
		case <-time.After(5 * time.Second):
			t.Fatal("no connection accepted")
		}
		left = dial(outer, ln) // never received: closed by the cleanup
		for range 100 {        // let it be accepted before the cleanup runs
			if len(conns) == 1 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	_ = left.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := left.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection left in the channel is still open")
	}
}

func TestAcceptClosesItsChannelWhenTheListenerCloses(t *testing.T) {
	ln := Listen(t, "tcp", "127.0.0.1:0")
	conns := Accept(t, ln)
	_ = ln.Close()
	for c := range conns {
		_ = c.Close()
	}
}

func TestSilentNeverSpeaksAndClosesEverything(t *testing.T) {
	outer := t
	var c net.Conn
	t.Run("serve", func(t *testing.T) {
		ln := Silent(t, Listen(t, "tcp", "127.0.0.1:0"))
		c = dial(outer, ln)
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if n, err := c.Read(make([]byte, 1)); n != 0 || !isTimeout(err) {
			t.Fatalf("read from a silent peer: %d, %v", n, err)
		}
	})
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("the silent peer did not close its end: %v", err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func TestPairIsConnected(t *testing.T) {
	a, b := Pair(t)
	if _, err := a.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	_ = b.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := b.Read(buf); err != nil || buf[0] != 'x' {
		t.Fatalf("read %q, %v", buf, err)
	}
}

func TestSocketDirFitsASocketAndIsRemoved(t *testing.T) {
	var dir string
	t.Run("use", func(t *testing.T) {
		dir = SocketDir(t)
		Listen(t, "unix", filepath.Join(dir, "engine.sock"))
	})
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s after the test: %v, want it removed", dir, err)
	}
}

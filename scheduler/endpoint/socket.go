package endpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/internal/zmqx"
	"github.com/kvtier/kvtier/messages"
)

// The engine endpoint's socket side: binding (local only unless allowed,
// ipc socket file with restricted mode), the reader goroutine that decodes
// frames off any mailbox, and the writer goroutine that owns every send, so
// a ROUTER send that blocks never stalls an actor (docs/DESIGN.md §10).

// ListenOptions say where and how the endpoint binds.
type ListenOptions struct {
	Addr        string      // ipc:///path, unix:///path or tcp://host:port
	AllowRemote bool        // permit a tcp address that is not loopback
	Mode        os.FileMode // ipc socket file mode (0600 by default)
	GID         int         // group of the ipc socket file; -1 = unchanged
	// Poll: how long a unix:// connection is polled after its last frame
	// or reply before its reader waits in the network poller (pollConn);
	// 0 or less: never polled. Other transports ignore it.
	Poll time.Duration
}

// listener is a bound engine socket: a ZeroMQ ROUTER (ipc://, tcp://) or
// a Unix stream listener (unix://, unix.go).
type listener struct {
	sock engineSocket
	addr string // the bound address (a tcp port of 0 resolved)
	path string // ipc or unix socket file we own, "" for tcp
}

// engineSocket is the endpoint's transport: frames in, each with the
// engine connection it came from, and frames out to one.
type engineSocket interface {
	// serve hands every frame to deliver, from the goroutine that read it
	// (deliver never blocks), until the socket closes or fails.
	serve(deliver func(inFrame)) error
	// send queues or writes reply frames to peer, in order (a stream
	// writes them all in one system call).
	send(peer string, bodies ...[]byte) error
	close() error
}

// inFrame is one message from an engine connection.
type inFrame struct {
	peer  string // the connection's id
	body  []byte // the frame; nil unless parts == 1
	parts int    // message parts after the routing id (ZeroMQ); always 1 on a stream
}

// zmqSocket is a ROUTER as an engineSocket.
type zmqSocket struct{ s zmq4.Socket }

func (z zmqSocket) serve(deliver func(inFrame)) error {
	for {
		msg, err := z.s.Recv()
		if err != nil {
			return err
		}
		if len(msg.Frames) == 0 {
			continue
		}
		in := inFrame{peer: string(msg.Frames[0]), parts: len(msg.Frames) - 1}
		if in.parts == 1 {
			in.body = msg.Frames[1]
		}
		deliver(in)
	}
}

func (z zmqSocket) send(peer string, bodies ...[]byte) error {
	id := []byte(peer)
	for _, body := range bodies {
		if err := z.s.Send(zmq4.NewMsgFrom(id, body)); err != nil {
			return err
		}
	}
	return nil
}

func (z zmqSocket) close() error { return z.s.Close() }

// listen binds a ROUTER socket as o says; watch hears of every engine
// connection's end (internal/zmqx/listen.go).
func listen(o ListenOptions, logger zerolog.Logger, watch zmqx.ConnWatch) (*listener, error) {
	network, rest, ok := strings.Cut(o.Addr, "://")
	if !ok {
		return nil, fmt.Errorf("%w: engine_listen %q: want ipc:///path or tcp://127.0.0.1:PORT", messages.ErrBadConfig, o.Addr)
	}
	zlog := log.New(logger, "", 0)
	switch network {
	case "ipc":
		return listenIPC(rest, o, zlog, watch)
	case "unix":
		return listenUnix(rest, o, logger, watch)
	case "tcp":
		host, _, err := net.SplitHostPort(rest)
		if err != nil {
			return nil, fmt.Errorf("%w: engine_listen %q: %w", messages.ErrBadConfig, o.Addr, err)
		}
		if !o.AllowRemote && !isLoopback(host) {
			return nil, fmt.Errorf("%w: engine_listen %q is not a loopback address (set engine_allow_remote to serve other hosts)", messages.ErrBadConfig, o.Addr)
		}
		sock := zmq4.NewRouter(zmqx.WithConnWatch(context.Background(), watch), zmq4.WithLogger(zlog))
		if err := sock.Listen(zmqx.BoundedListenAddr(o.Addr)); err != nil {
			sock.Close()
			return nil, fmt.Errorf("engine endpoint: %w", err)
		}
		return &listener{sock: zmqSocket{sock}, addr: "tcp://" + sock.Addr().String()}, nil
	}
	return nil, fmt.Errorf("%w: engine_listen %q: transport %q (want ipc, unix or tcp)", messages.ErrBadConfig, o.Addr, network)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// listenIPC binds a unix socket at path with mode and group set before the
// socket becomes reachable by its name: it is bound under a temporary name
// in the same directory, restricted, then renamed into place.
func listenIPC(path string, o ListenOptions, zlog *log.Logger, watch zmqx.ConnWatch) (*listener, error) {
	sock := zmq4.NewRouter(zmqx.WithConnWatch(context.Background(), watch), zmq4.WithLogger(zlog))
	err := bindSocketFile("ipc", path, o, func(tmp string) (func(), error) {
		return func() { sock.Close() }, sock.Listen(zmqx.BoundedListenAddr("ipc://" + tmp))
	})
	if err != nil {
		return nil, err
	}
	return &listener{sock: zmqSocket{sock}, addr: "ipc://" + path, path: path}, nil
}

// bindSocketFile binds a socket file at path (an absolute path; a stale
// socket there is replaced, a live one refused) with bind, under a
// temporary name in the same directory, and restricts it
// (restrictSocketFile) before renaming it into place, so that it is never
// reachable with wider permissions. bind returns what undoes it, run on
// any failure.
func bindSocketFile(kind, path string, o ListenOptions, bind func(tmp string) (undo func(), err error)) error {
	if path == "" || !filepath.IsAbs(path) {
		return fmt.Errorf("%w: engine_listen %s path %q must be absolute", messages.ErrBadConfig, kind, path)
	}
	if err := removeStaleSocket(path); err != nil {
		return err
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	tmp := fmt.Sprintf("%s.%s.tmp", path, hex.EncodeToString(b[:]))
	undo, err := bind(tmp)
	if err != nil {
		undo()
		return fmt.Errorf("engine endpoint: %w", err)
	}
	if err := restrictSocketFile(tmp, o); err != nil {
		undo()
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		undo()
		_ = os.Remove(tmp)
		return fmt.Errorf("engine endpoint: %w", err)
	}
	return nil
}

// removeStaleSocket removes a socket file left by a daemon that died; a live
// one (it accepts a connection) is refused.
func removeStaleSocket(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("engine endpoint: %w", err)
	}
	if st.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%w: engine_listen %s exists and is not a socket", messages.ErrBadConfig, path)
	}
	c, err := net.Dial("unix", path)
	if err == nil {
		c.Close()
		return fmt.Errorf("engine endpoint: %s is in use by a live process", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("engine endpoint: probing %s: %w", path, err)
	}
	return os.Remove(path)
}

func (l *listener) close() error {
	err := l.sock.close()
	if errors.Is(err, net.ErrClosed) {
		// NB: zmq4 reports a connection its peer already closed; nothing leaks.
		err = nil
	}
	if l.path != "" {
		if rmErr := os.Remove(l.path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			err = errors.Join(err, rmErr)
		}
	}
	return err
}

// outbound is one reply frame for a peer.
type outbound struct {
	peer []byte
	body []byte
}

// tracker starts goroutines that Close waits for, and refuses new ones once
// closing began (nats-server's habit).
type tracker struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func (t *tracker) goTracked(f func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f()
	}()
	return true
}

func (t *tracker) closeAndWait() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.wg.Wait()
}

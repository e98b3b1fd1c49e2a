package endpoint

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/internal/zmqx"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// The unix:// engine transport: the same requests and replies as over
// ZeroMQ, length-prefixed on a Unix stream socket (wire.WriteFrame), one
// connection per engine session. It exists for speed: a frame crosses one
// socket write and one read, with no I/O thread between the engine and the
// endpoint (docs/PERFORMANCE.md, "Small Lookups and the floors under
// them").

// unixWriteTimeout bounds one reply write: an engine that stops reading is
// dropped rather than stalling every other engine's replies.
const unixWriteTimeout = 5 * time.Second

// unixSocket is a Unix stream listener as an engineSocket.
type unixSocket struct {
	ln    net.Listener
	watch zmqx.ConnWatch
	log   zerolog.Logger
	done  chan struct{}
	wg    sync.WaitGroup

	mu    sync.Mutex
	conns map[string]net.Conn // by connection id
	seq   uint64
	poll  time.Duration // each connection's polling window (pollConn); <= 0: none
}

// listenUnix binds a Unix stream socket at path, restricted as listenIPC
// restricts its socket file (bound under a temporary name, then renamed).
func listenUnix(path string, o ListenOptions, log zerolog.Logger, watch zmqx.ConnWatch) (*listener, error) {
	var ln net.Listener
	err := bindSocketFile("unix", path, o, func(tmp string) (func(), error) {
		l, err := net.Listen("unix", tmp)
		if err != nil {
			return func() {}, err
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false) // NB: the renamed path is removed by listener.close
		ln = l
		return func() { l.Close() }, nil
	})
	if err != nil {
		return nil, err
	}
	s := &unixSocket{ln: ln, watch: watch, log: log, done: make(chan struct{}), conns: map[string]net.Conn{}, poll: o.Poll}
	return &listener{sock: s, addr: "unix://" + path, path: path}, nil
}

// restrictSocketFile sets a socket file's group and mode before it is
// reachable by its real name.
func restrictSocketFile(path string, o ListenOptions) error {
	mode := o.Mode
	if mode == 0 {
		mode = 0o600
	}
	if o.GID >= 0 {
		if err := os.Lchown(path, -1, o.GID); err != nil {
			return fmt.Errorf("engine endpoint: chown %s: %w", path, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		return fmt.Errorf("engine endpoint: chmod %s: %w", path, err)
	}
	return nil
}

// serve accepts connections until the socket closes; each connection's
// goroutine reads its frames and delivers them itself (one hand-off fewer
// than a shared reader).
func (s *unixSocket) serve(deliver func(inFrame)) error {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return err
		}
		s.mu.Lock()
		select {
		case <-s.done:
			s.mu.Unlock()
			c.Close()
			return net.ErrClosed
		default:
		}
		s.seq++
		id := "unix-" + strconv.FormatUint(s.seq, 10)
		c = newPollConn(c, s.poll)
		s.conns[id] = c
		s.wg.Add(1)
		s.mu.Unlock()
		go s.read(id, c, deliver)
	}
}

// read delivers one connection's frames until it ends, then tells the
// endpoint (its session is released at once, as a ZeroMQ peer's is).
func (s *unixSocket) read(id string, c net.Conn, deliver func(inFrame)) {
	defer s.wg.Done()
	r := bufio.NewReaderSize(c, 64<<10)
	for {
		frame, err := wire.ReadFrame(r)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Debug().Err(err).Str("conn", id).Msg("engine endpoint: unix connection ended")
			}
			break
		}
		deliver(inFrame{peer: id, body: frame, parts: 1})
	}
	s.mu.Lock()
	delete(s.conns, id)
	s.mu.Unlock()
	c.Close()
	select {
	case <-s.done:
	default:
		s.watch(id)
	}
}

func (s *unixSocket) send(peer string, bodies ...[]byte) error {
	s.mu.Lock()
	c := s.conns[peer]
	s.mu.Unlock()
	if c == nil {
		return fmt.Errorf("engine connection %s: %w", peer, net.ErrClosed)
	}
	w, polled := raw(c)
	w.SetWriteDeadline(time.Now().Add(unixWriteTimeout))
	if err := wire.WriteFrames(w, bodies...); err != nil {
		c.Close() // its reader ends and reports the connection lost
		return err
	}
	if polled != nil {
		polled.touch()
	}
	return nil
}

// close stops accepting, closes every connection and waits for the
// socket's goroutines.
func (s *unixSocket) close() error {
	s.mu.Lock()
	select {
	case <-s.done:
		s.mu.Unlock()
		return nil
	default:
	}
	close(s.done)
	err := s.ln.Close()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

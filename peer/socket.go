package peer

import (
	"log"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/internal/zmqx"
)

// The socket side of the control plane. zmq4's sharp edges (docs/DESIGN.md §10)
// are contained here: every socket is read by one goroutine and written by
// one goroutine through a bounded queue, so a send that blocks (a ROUTER
// with no connection yet, a peer that stopped reading) never stalls an
// actor; a full queue drops the frame and counts it, and the protocol's
// deadlines turn the loss into a failed round, not a hang. A DEALER is only
// ever connected to one peer (a DEALER sends to all its peers).

// sendTimeout bounds one blocked zmq4 send on a writer goroutine.
const sendTimeout = 2 * time.Second

// sockIO owns one zmq4 socket's goroutines.
type sockIO struct {
	sock  zmq4.Socket
	out   chan zmq4.Msg
	quit  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
	drops func(reason string)
}

func newSockIO(sock zmq4.Socket, queue int, drops func(string)) *sockIO {
	return &sockIO{sock: sock, out: make(chan zmq4.Msg, queue), quit: make(chan struct{}), drops: drops}
}

// zlogger routes zmq4's own log lines to zerolog at debug level.
func zlogger(l zerolog.Logger) *log.Logger {
	return log.New(l.Level(zerolog.DebugLevel), "zmq4: ", 0)
}

// goTracked runs f on a goroutine close waits for.
func (s *sockIO) goTracked(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

// startWriter starts the goroutine that owns every send.
func (s *sockIO) startWriter() {
	s.goTracked(func() {
		for {
			select {
			case <-s.quit:
				return
			case m := <-s.out:
				if err := s.sock.Send(m); err != nil {
					s.drops("send_failed")
				}
			}
		}
	})
}

// startReader starts the goroutine that receives every message and hands it
// to onMsg; a connection's failure goes to onErr (nil: ignored). Both must
// not block: they send an actor message.
func (s *sockIO) startReader(onMsg func(zmq4.Msg), onErr func(error)) {
	s.goTracked(func() {
		zmqx.Serve(s.sock, func(m zmq4.Msg) bool { onMsg(m); return true }, func(err error) bool {
			select {
			case <-s.quit:
				return false
			default:
			}
			if onErr != nil {
				onErr(err)
			}
			return true
		})
	})
}

// send queues m without blocking; false when the queue is full or closed.
func (s *sockIO) send(m zmq4.Msg) bool {
	select {
	case <-s.quit:
		return false
	default:
	}
	select {
	case s.out <- m:
		return true
	default:
		s.drops("send_queue_full")
		return false
	}
}

// close closes the socket and waits for its goroutines.
func (s *sockIO) close() {
	s.once.Do(func() {
		close(s.quit)
		_ = s.sock.Close()
	})
	s.wg.Wait()
}

package peer

import (
	"context"

	"github.com/go-zeromq/zmq4"

	"github.com/kvtier/kvtier/internal/zmqx"
	"github.com/kvtier/kvtier/peer/wire"
)

// link is one outbound DEALER to a peer's ROUTER, owned by that peer's
// session: one socket per peer, because a zmq4 DEALER sends every message
// to all its peers. Its identity is this node's id. A link lives for one
// session epoch; a reset closes it and dials a fresh one.
type link struct {
	io *sockIO
}

// Messages a link sends its session; gen names the link, so that messages
// of a link the session already replaced are ignored.
type (
	linkUp   struct{ gen uint64 }
	linkDown struct {
		gen uint64
		err error
	}
	outboundFrame struct {
		gen   uint64
		frame wire.Frame
		err   error
		raw   []byte // the frame as received, for its seal
		seal  []byte // the message's seal part; nil when it came unsealed
	}
)

// openLink dials addr on its own goroutine (a zmq4 Dial blocks; through
// zmqx.ClosingDialAddr, so closing the link — the session's handshake
// timeout does — ends a handshake a peer never answers) and then reads the
// socket; deliver must only send an actor message.
func openLink(cfg *Config, ctr *Counters, addr string, gen uint64, deliver func(any)) *link {
	sock := zmq4.NewDealer(context.Background(), zmq4.WithID(zmq4.SocketIdentity(cfg.Node)),
		zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(cfg.HandshakeTimeout),
		zmq4.WithLogger(zlogger(cfg.Log)), zmq4.WithTimeout(sendTimeout))
	l := &link{io: newSockIO(sock, cfg.SendQueue, ctr.drop)}
	l.io.goTracked(func() {
		if err := sock.Dial(zmqx.ClosingDialAddr(addr)); err != nil {
			deliver(&linkDown{gen: gen, err: err})
			return
		}
		l.io.startWriter()
		l.io.startReader(func(m zmq4.Msg) {
			if len(m.Frames) != 1 && len(m.Frames) != 2 {
				deliver(&outboundFrame{gen: gen, err: wire.ErrMalformed})
				return
			}
			f, err := wire.Decode(m.Frames[0])
			deliver(&outboundFrame{gen: gen, frame: f, err: err, raw: m.Frames[0], seal: sealPart(m.Frames)})
		}, func(err error) { deliver(&linkDown{gen: gen, err: err}) })
		deliver(&linkUp{gen: gen})
	})
	return l
}

// send queues an encoded frame and its seal (nil: unsealed); false when it
// was dropped.
func (l *link) send(b, seal []byte) bool { return l.io.send(zmq4.NewMsgFrom(message(b, seal)...)) }

// message is a frame's message parts: the frame, then its seal if any.
func message(b, seal []byte) [][]byte {
	if seal == nil {
		return [][]byte{b}
	}
	return [][]byte{b, seal}
}

// sealPart is a message's seal part (the one after the frame), nil when
// the message has none.
func sealPart(parts [][]byte) []byte {
	if len(parts) < 2 {
		return nil
	}
	return parts[len(parts)-1]
}

// close closes the socket and waits for its goroutines.
func (l *link) close() { l.io.close() }

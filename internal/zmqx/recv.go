package zmqx

import (
	"context"
	"errors"
	"net"

	"github.com/go-zeromq/zmq4"
)

// Closed reports whether err, returned by a socket's Recv, says that the
// socket itself is closed (its context ended) rather than that one of its
// connections ended. zmq4 reports each connection's end once, as an error
// on Recv, and the socket goes on serving its other connections.
func Closed(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, net.ErrClosed)
}

// Serve receives from s and hands each message to each until s is closed
// or each returns false. The end of one of s's connections goes to ended,
// which says whether to go on; a nil ended passes over it. Serve blocks:
// its caller runs it on a goroutine it owns and waits for.
func Serve(s zmq4.Socket, each func(zmq4.Msg) bool, ended func(error) bool) {
	for {
		m, err := s.Recv()
		switch {
		case err == nil:
			if !each(m) {
				return
			}
		case Closed(err):
			return
		case ended != nil && !ended(err):
			return
		}
	}
}

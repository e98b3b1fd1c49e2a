package client

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvtier/kvtier/internal/zmqx"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// conn is the client's transport to the daemon: a ZeroMQ DEALER (ipc://,
// tcp://) or a Unix stream socket with length-prefixed frames (unix://,
// docs/PROTOCOL.md). Its methods are safe for concurrent use; close ends
// a blocked send or recv.
type conn interface {
	send(frame []byte) error
	recv() ([]byte, error) // the next one-frame message
	close() error
}

// dialConn connects to addr, retrying a refused or absent socket (the
// daemon may still be starting) until ctx ends.
func dialConn(ctx context.Context, addr string, opts Options) (conn, error) {
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		return dialUnix(ctx, addr, path)
	}
	// NB: zmq4's send timeout (default 5 min) bounds a send the daemon does
	// not read; a call's own deadline still ends its wait for the reply.
	sock := zmq4.NewDealer(context.Background(), zmq4.WithDialerMaxRetries(0), zmq4.WithTimeout(opts.CallTimeout))
	if err := dialWithin(ctx, sock, addr); err != nil {
		return nil, err
	}
	return zmqConn{sock}, nil
}

type zmqConn struct{ s zmq4.Socket }

func (z zmqConn) send(frame []byte) error { return z.s.Send(zmq4.NewMsg(frame)) }
func (z zmqConn) close() error            { return z.s.Close() }

func (z zmqConn) recv() ([]byte, error) {
	for {
		msg, err := z.s.Recv()
		if err != nil {
			return nil, err
		}
		if len(msg.Frames) == 1 {
			return msg.Frames[0], nil
		}
	}
}

// dialWithin connects a DEALER, retrying until ctx ends. The ZMTP handshake
// is bounded by ctx too (transport.go). On error the socket is closed.
func dialWithin(ctx context.Context, sock zmq4.Socket, addr string) error {
	zaddr := zmqx.ClosingDialAddr(addr)
	return retry(ctx, addr, func() error {
		dialed := make(chan error, 1)
		go func() { dialed <- sock.Dial(zaddr) }()
		select {
		case err := <-dialed:
			return err
		case <-ctx.Done():
			// Closing the socket closes the connection whose handshake
			// is in flight, so the dial goroutine ends now.
			_ = sock.Close()
			<-dialed
			return ctx.Err()
		}
	}, func() { _ = sock.Close() })
}

// retry calls dial until it succeeds or ctx ends (then giveUp runs).
func retry(ctx context.Context, addr string, dial func() error, giveUp func()) error {
	backoff := 10 * time.Millisecond
	for {
		err := dial()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			giveUp()
			return fmt.Errorf("kvtier client: dial %s: %w", addr, ctx.Err())
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			giveUp()
			return fmt.Errorf("kvtier client: dial %s: %w (last error: %v)", addr, ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// unixConn is a Unix stream connection to the endpoint.
type unixConn struct {
	c   net.Conn
	r   *bufio.Reader
	wmu sync.Mutex // one frame at a time on the stream
}

func dialUnix(ctx context.Context, addr, path string) (conn, error) {
	var c net.Conn
	var d net.Dialer
	err := retry(ctx, addr, func() (err error) {
		c, err = d.DialContext(ctx, "unix", path)
		return err
	}, func() {})
	if err != nil {
		return nil, err
	}
	return &unixConn{c: c, r: bufio.NewReaderSize(c, 64<<10)}, nil
}

func (u *unixConn) send(frame []byte) error {
	u.wmu.Lock()
	defer u.wmu.Unlock()
	return wire.WriteFrame(u.c, frame)
}

func (u *unixConn) recv() ([]byte, error) { return wire.ReadFrame(u.r) }
func (u *unixConn) close() error          { return u.c.Close() }

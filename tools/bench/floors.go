package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvtier/kvtier/internal/zmqx"
)

// The floors under the engine endpoint's round trip, measured in the same
// run: what a small request and its answer cost through a ZeroMQ
// DEALER/ROUTER pair over ipc (the endpoint's transport, the same zmq4
// library, both ends in this process) and through a plain Unix socket. A
// Lookup through the endpoint cannot be cheaper than the first; the second
// says what another local transport could reach.

// floorPayload is a small request's size (a 16-key Lookup is ~400 bytes).
const floorPayload = 256

// zmqIPCFloor returns the p50 and p99 round trip, µs, of n echoes through a
// zmq4 DEALER → ROUTER → DEALER over an ipc socket in dir.
func zmqIPCFloor(ctx context.Context, dir string, n int) (p50, p99 float64, err error) {
	addr := "ipc://" + filepath.Join(dir, "floor.sock")
	router := zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("floor-router")))
	defer router.Close()
	if err := router.Listen(addr); err != nil {
		return 0, 0, err
	}
	dealer := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity("floor-dealer")))
	defer dealer.Close()
	if err := dealer.Dial(addr); err != nil {
		return 0, 0, err
	}
	echoed := make(chan struct{})
	go func() {
		defer close(echoed)
		zmqx.Serve(router, func(m zmq4.Msg) bool { return router.Send(m) == nil },
			func(error) bool { return false })
	}()
	msg := zmq4.NewMsg(make([]byte, floorPayload))
	rtt := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := dealer.Send(msg); err != nil {
			return 0, 0, err
		}
		if _, err := dealer.Recv(); err != nil {
			return 0, 0, err
		}
		rtt = append(rtt, time.Since(start))
	}
	router.Close()
	<-echoed
	return percentileUs(rtt, 0.50), percentileUs(rtt, 0.99), nil
}

// unixFloor returns the p50 and p99 round trip, µs, of n echoes of a
// length-prefixed message over a Unix stream socket in dir.
func unixFloor(dir string, n int) (p50, p99 float64, err error) {
	ln, err := net.Listen("unix", filepath.Join(dir, "floor-unix.sock"))
	if err != nil {
		return 0, 0, err
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		buf := make([]byte, floorPayload)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				served <- nil
				return
			}
			if _, err := c.Write(buf); err != nil {
				served <- err
				return
			}
		}
	}()
	c, err := net.Dial("unix", filepath.Join(dir, "floor-unix.sock"))
	if err != nil {
		return 0, 0, err
	}
	buf := make([]byte, floorPayload)
	rtt := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if _, err := c.Write(buf); err != nil {
			c.Close()
			return 0, 0, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			c.Close()
			return 0, 0, err
		}
		rtt = append(rtt, time.Since(start))
	}
	c.Close()
	if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
		return 0, 0, fmt.Errorf("unix floor: %w", err)
	}
	return percentileUs(rtt, 0.50), percentileUs(rtt, 0.99), nil
}

package endpoint

import (
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
)

// SuggestedEnginePoll is a polling window for a unix:// engine connection
// that covers the gap between an engine's back-to-back calls (tens of µs
// from Python) and costs an engine between steps no CPU. Polling is off
// unless configured: see pollConn for what it costs the rest of the node.
const SuggestedEnginePoll = 100 * time.Microsecond

// pollConn reads an engine connection by polling it for a window after
// its last activity (a frame read, a reply written) before parking in the
// network poller.
//
// Why: an engine makes its calls in bursts (a vLLM scheduler step makes
// tens of them back to back), and on a VM whose idle vCPUs halt, every
// park is paid at the next frame by a wake-up of the poller's thread and
// the goroutine hand-offs after it, tens of µs each (docs/PERFORMANCE.md,
// "Round 4"). While it polls, the reader yields its P between tries
// (runtime.Gosched), so the call it just delivered runs on the same thread
// instead of queueing behind it; outside a burst it reads exactly as a
// plain connection does.
//
// The cost: while a reader polls it keeps one of the node's Ps busy, and
// the Go scheduler polls the network for the node's other goroutines only
// from an idle P (or sysmon), so their I/O waits longer while an engine's
// burst lasts. Measured with the engine in the node's own process
// (BenchmarkEndpointLookupRoundTrip, warm-pool-polled): 3.5× slower. Worth
// it where the engine is another process and the node has cores to spare.
type pollConn struct {
	net.Conn
	rc     syscall.RawConn
	window int64         // ns polled after the last activity
	last   atomic.Int64  // monoNanos of the last activity
	closed atomic.Bool   // Close was called: stop polling at once
	parks  atomic.Uint64 // reads that waited in the poller (tests)
}

// monoEpoch is the origin of pollConn's activity stamps (monotonic).
var monoEpoch = time.Now()

func monoNanos() int64 { return int64(time.Since(monoEpoch)) }

// newPollConn wraps c; c itself when the window is not positive or c has
// no raw descriptor.
func newPollConn(c net.Conn, window time.Duration) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok || window <= 0 {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	p := &pollConn{Conn: c, rc: rc, window: int64(window)}
	p.touch()
	return p
}

// touch restarts the polling window: after a frame read, and after a reply
// went out (unixSocket.send), when the engine's next call is nearest.
func (p *pollConn) touch() { p.last.Store(monoNanos()) }

// Read polls while the connection was active within the window, then
// waits in the network poller as a plain read does. A Close meanwhile
// ends the polling at the next try (Close waits for the read to let go of
// the descriptor), and the read returns net.ErrClosed.
func (p *pollConn) Read(b []byte) (int, error) {
	var n int
	var errno error
	err := p.rc.Read(func(fd uintptr) bool {
		for {
			n, errno = syscall.Read(int(fd), b)
			switch {
			case errno == syscall.EINTR:
				continue
			case errno != syscall.EAGAIN:
				return true
			case p.closed.Load(), monoNanos()-p.last.Load() > p.window:
				p.parks.Add(1)
				return false // NB: parks in the poller, then calls again
			}
			runtime.Gosched()
		}
	})
	switch {
	case err != nil:
		return 0, err
	case errno != nil:
		return 0, &net.OpError{Op: "read", Net: "unix", Addr: p.LocalAddr(), Err: errno}
	case n == 0 && len(b) > 0:
		return 0, io.EOF
	}
	p.touch()
	return n, nil
}

// Close stops the polling, then closes the connection.
func (p *pollConn) Close() error {
	p.closed.Store(true)
	return p.Conn.Close()
}

// raw is the connection replies are written to: the wrapped one, so that
// a frame stays one writev (net.Buffers writes in one call only to net's
// own connections), and the pollConn to touch after, if any.
func raw(c net.Conn) (net.Conn, *pollConn) {
	if p, ok := c.(*pollConn); ok {
		return p.Conn, p
	}
	return c, nil
}

// Package client is the Go client of kvtierd's engine endpoint (standalone
// mode, docs/PROTOCOL.md): Dial says Hello, maps the shared CPU pool
// read-write by the path the daemon returns, and implements the same manager
// interface as an embedded node's Node.Manager() — so an engine (or the
// simulator) runs unchanged against either.
//
// It owns one DEALER socket, the table of calls awaiting replies, the
// heartbeat timer and the pool mapping. It never touches daemon state except
// through protocol calls, and never reads or writes a slot it was not handed
// by a reply (every slot index is checked against the mapped pool).
package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/engine"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// Options tune a client.
type Options struct {
	// Name identifies the client in the daemon's logs.
	Name string
	// CallTimeout bounds a call whose ctx has no deadline (default 10 s).
	CallTimeout time.Duration
	// BlockBytes, when > 0, is declared in the hello: the bytes one block
	// of this engine takes in a slot. A daemon started with no block size
	// sizes its slots from the first engine's and answers that hello
	// messages.ErrSizing: dial again.
	BlockBytes int
	// Topic, when set, is the topic of this engine's own KV events
	// (kv@<pod>@<model>): the daemon announces the blocks of its key
	// namespace under it too, so a router credits this engine with them.
	Topic string
}

// Client is a connection to kvtierd. Its methods are safe for concurrent use.
type Client struct {
	opts  Options
	sock  conn
	hello wire.Hello
	pool  *Pool

	nextID  atomic.Uint64
	mu      sync.Mutex // guards pending
	pending map[uint64]chan []byte

	sendMu    sync.Mutex // guards closed, open and the heartbeat timer; never held across a send
	heartbeat *time.Timer
	closed    bool
	open      map[string]struct{} // request ids sent and not finished: the daemon's view of the session

	done     chan struct{}
	readDone chan struct{} // closed when readLoop ends: the socket closed or the connection was lost
	readErr  error         // why readLoop ended; written before readDone closes
	closeErr error
	once     sync.Once
}

// readLoopStop bounds how long Close waits for the read loop once the socket
// is closed (zmq4's Recv returns at once when its socket closes; the bound
// turns a regression into an error instead of a hang).
const readLoopStop = 5 * time.Second

// Dial connects to the endpoint at addr (ipc:///path, unix:///path or tcp://host:port),
// says Hello within ctx, and maps the pool.
func Dial(ctx context.Context, addr string, opts Options) (*Client, error) {
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 10 * time.Second
	}
	sock, err := dialConn(ctx, addr, opts)
	if err != nil {
		return nil, err
	}
	c := &Client{opts: opts, sock: sock, pending: map[uint64]chan []byte{}, open: map[string]struct{}{},
		done: make(chan struct{}), readDone: make(chan struct{})}
	go c.readLoop()
	rp, err := c.do(ctx, &wire.Request{Op: wire.OpHello, Client: opts.Name, BlockBytes: opts.BlockBytes, Topic: opts.Topic})
	if err != nil {
		_ = c.shutdown()
		return nil, fmt.Errorf("kvtier client: hello %s: %w", addr, err)
	}
	c.hello = rp.Hello
	if c.hello.Protocol != wire.Version {
		_ = c.shutdown()
		return nil, fmt.Errorf("%w: daemon speaks protocol %d, client %d", messages.ErrProtocolVersion, c.hello.Protocol, wire.Version)
	}
	// The daemon's liveness timer runs only while the session holds
	// requests, and so do the pings (armHeartbeat): an idle engine and its
	// daemon wake for nothing.
	c.sendMu.Lock()
	c.heartbeat = time.AfterFunc(c.hello.Heartbeat, c.ping)
	c.armHeartbeat()
	c.sendMu.Unlock()
	if c.pool, err = MapPool(c.hello.PoolPath, c.hello.Slots, c.hello.BlockBytes); err != nil {
		_ = c.shutdown()
		return nil, err
	}
	return c, nil
}

// Hello is what the daemon said when the session began.
func (c *Client) Hello() wire.Hello { return c.hello }

// readLoop hands each reply to its caller until the socket closes or the
// connection is lost (zmq4 reports a connection's read error through Recv;
// this client has one connection and never redials).
func (c *Client) readLoop() {
	defer close(c.readDone)
	for {
		frame, err := c.sock.recv()
		if err != nil {
			c.readErr = err
			return
		}
		id, err := wire.ReplyID(frame)
		if err != nil {
			continue
		}
		c.mu.Lock()
		ch := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if ch != nil {
			ch <- frame // buffered: the caller may have given up
		}
	}
}

// ping keeps a session that holds requests alive while the engine is
// silent; any call re-arms it.
func (c *Client) ping() {
	c.sendMu.Lock()
	if c.closed || len(c.open) == 0 {
		c.sendMu.Unlock()
		return
	}
	c.heartbeat.Reset(c.hello.Heartbeat)
	c.sendMu.Unlock()
	// The reply (id 0) matches no caller and is dropped by readLoop.
	_ = c.sock.send(wire.EncodeRequest(&wire.Request{Op: wire.OpPing}))
}

// send sends one frame. The lock is not held across the send: a send the
// daemon does not read blocks (up to the socket's send timeout), and Close
// must not wait behind it — closing the socket is what ends it.
func (c *Client) send(q *wire.Request) error {
	frame := wire.EncodeRequest(q)
	c.sendMu.Lock()
	if c.closed {
		c.sendMu.Unlock()
		return messages.ErrClosed
	}
	if q.Req != nil {
		if q.Op == wire.OpRequestFinished {
			delete(c.open, q.Req.RequestID)
		} else {
			c.open[q.Req.RequestID] = struct{}{}
		}
	}
	c.armHeartbeat()
	c.sendMu.Unlock()
	return c.sock.send(frame)
}

// armHeartbeat (re)arms the ping for a full period after the last frame,
// while the session holds requests; with none, the daemon arms no
// liveness timer for it and no ping is due. REQUIRES c.sendMu.
func (c *Client) armHeartbeat() {
	if c.heartbeat == nil {
		return // the Hello is not answered yet
	}
	if len(c.open) == 0 {
		c.heartbeat.Stop()
		return
	}
	c.heartbeat.Reset(c.hello.Heartbeat)
}

// do sends q and waits for its reply within ctx (or CallTimeout). The
// daemon is told the deadline, so it gives up no later than the caller.
func (c *Client) do(ctx context.Context, q *wire.Request) (*wire.Reply, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.CallTimeout)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	q.Timeout = max(min(time.Until(deadline), wire.MaxTimeout), time.Millisecond)
	q.ID = c.nextID.Add(1)
	q.PackedKeys = c.hello.PackedKeys // NB: only when the daemon reads them
	ch := make(chan []byte, 1)
	c.mu.Lock()
	c.pending[q.ID] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, q.ID)
		c.mu.Unlock()
	}()
	if err := c.send(q); err != nil {
		select {
		case <-c.readDone:
			return nil, c.lost(q.Op)
		default:
		}
		if connectionGone(err) {
			// The daemon went away; the read loop has not noticed yet.
			return nil, fmt.Errorf("kvtier client %s: connection to the daemon lost (%v): %w", q.Op, err, messages.ErrClosed)
		}
		return nil, fmt.Errorf("kvtier client %s: send: %w", q.Op, err)
	}
	select {
	case frame := <-ch:
		return c.decode(q, frame)
	case <-ctx.Done():
		return nil, fmt.Errorf("kvtier client %s: %w", q.Op, ctx.Err())
	case <-c.done:
		return nil, fmt.Errorf("kvtier client %s: %w", q.Op, messages.ErrClosed)
	case <-c.readDone:
		// No reply can arrive any more (a reply read just before the loop
		// ended is already in ch): fail now rather than at the deadline.
		select {
		case frame := <-ch:
			return c.decode(q, frame)
		default:
		}
		return nil, c.lost(q.Op)
	}
}

// connectionGone reports whether a send failed because the daemon's end of
// the connection is gone (closed, reset, or the socket already closed).
func connectionGone(err error) bool {
	return errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNRESET) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, zmq4.ErrClosedConn)
}

// lost is the error of a call once readLoop has ended.
func (c *Client) lost(op wire.Op) error {
	select {
	case <-c.done:
		return fmt.Errorf("kvtier client %s: %w", op, messages.ErrClosed)
	default:
	}
	return fmt.Errorf("kvtier client %s: connection to the daemon lost (%v): %w", op, c.readErr, messages.ErrClosed)
}

func (c *Client) decode(q *wire.Request, frame []byte) (*wire.Reply, error) {
	rp, err := wire.DecodeReply(frame, q.Op)
	if err != nil {
		return nil, err
	}
	if rp.Err != nil {
		return nil, fmt.Errorf("%s: %w", q.Op, rp.Err)
	}
	return rp, nil
}

// Close says Bye (so the daemon releases the session now rather than after
// its grace period), then closes the socket and unmaps the pool. Slices
// from Pool().Slot must not be used afterwards.
func (c *Client) Close(ctx context.Context) error {
	c.once.Do(func() {
		_, byeErr := c.do(ctx, &wire.Request{Op: wire.OpBye})
		c.closeErr = errors.Join(byeErr, c.shutdown())
	})
	return c.closeErr
}

// shutdown closes the socket, waits (bounded) for the read loop, and unmaps
// the pool. It never waits on a send: closing the socket ends any.
func (c *Client) shutdown() error {
	c.sendMu.Lock()
	c.closed = true
	if c.heartbeat != nil {
		c.heartbeat.Stop()
	}
	c.sendMu.Unlock()
	close(c.done)
	err := c.sock.close()
	if errors.Is(err, net.ErrClosed) {
		err = nil // zmq4: the daemon closed the connection first
	}
	t := time.NewTimer(readLoopStop)
	defer t.Stop()
	select {
	case <-c.readDone:
	case <-t.C:
		err = errors.Join(err, fmt.Errorf("%w: kvtier client: read loop still running %v after the socket closed", messages.ErrInternal, readLoopStop))
	}
	if c.pool != nil {
		err = errors.Join(err, c.pool.Close())
	}
	return err
}

// Pool is the shared CPU pool, mapped read-write.
func (c *Client) Pool() engine.SlotMemory { return c.pool }

// checkSlots refuses a reply whose slots fall outside the mapped pool.
func (c *Client) checkSlots(op wire.Op, slots []int, keys int) error {
	if len(slots) != keys {
		return fmt.Errorf("%w: %s: %d slots for %d keys", messages.ErrBadReply, op, len(slots), keys)
	}
	for _, s := range slots {
		if s < 0 || s >= c.pool.Slots() {
			return fmt.Errorf("%w: %s: slot %d outside the pool of %d", messages.ErrBadReply, op, s, c.pool.Slots())
		}
	}
	return nil
}

// Pool is the daemon's slot memory mapped into this process.
type Pool struct {
	mem        []byte
	blockBytes int
	slots      int
}

// MapPool maps the pool file at path, which must hold exactly slots blocks
// of blockBytes.
func MapPool(path string, slots, blockBytes int) (*Pool, error) {
	if path == "" || slots <= 0 || blockBytes <= 0 {
		return nil, fmt.Errorf("%w: pool %q of %d slots of %d bytes", messages.ErrBadReply, path, slots, blockBytes)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("kvtier client: open pool: %w", err)
	}
	defer f.Close() // the mapping outlives the descriptor
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("kvtier client: stat pool: %w", err)
	}
	// NB: at least: a session of another block size than the pool's first
	// has the slots of its size that fit the one file, not always all of it.
	size := int64(slots) * int64(blockBytes)
	if st.Size() < size {
		return nil, fmt.Errorf("%w: pool %s is %d bytes, hello says %d×%d", messages.ErrBadReply, path, st.Size(), slots, blockBytes)
	}
	// NB: MAP_POPULATE maps every page now, so no copy on the hot path pays
	// a page fault (the daemon allocated the pages up front).
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("kvtier client: mmap pool: %w", err)
	}
	return &Pool{mem: mem, blockBytes: blockBytes, slots: slots}, nil
}

// Slot returns the bytes of slot i, aliasing the shared pool.
func (p *Pool) Slot(i int) []byte {
	off := i * p.blockBytes
	return p.mem[off : off+p.blockBytes : off+p.blockBytes]
}

// BlockBytes is the size of one slot.
func (p *Pool) BlockBytes() int { return p.blockBytes }

// Slots is the number of slots.
func (p *Pool) Slots() int { return p.slots }

// Close unmaps the pool.
func (p *Pool) Close() error {
	if p.mem == nil {
		return nil
	}
	err := unix.Munmap(p.mem)
	p.mem = nil
	return err
}

func wireErr(op wire.Op, format string, a ...any) error {
	return wireErrIs(messages.ErrBadReply, op, format, a...)
}

func wireErrIs(sentinel error, op wire.Op, format string, a ...any) error {
	return fmt.Errorf("%w: %s: %s", sentinel, op, fmt.Sprintf(format, a...))
}

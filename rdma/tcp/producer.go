package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"github.com/kvtier/kvtier/rdma"
)

// writeOp is one accepted Write, owned by the peer's queue or by exactly
// one worker: whoever owns it calls done.
type writeOp struct {
	tok      rdma.Token
	src, dst []int
	lens     []int // bytes of each block, from the start of its src slot into the start of its dst slot
	done     func(rdma.Completion)
}

// pconn is an outbound connection. Only the worker holding it touches
// prefaced.
type pconn struct {
	net.Conn
	prefaced bool      // the preface went out; later transfers start with their header
	parked   time.Time // when it last went idle
}

// defaultProbeAfter is how long a connection must have been idle before
// it is probed (alive) ahead of reuse. Back-to-back transfers skip the
// probe's syscall; a close that slips past (or through) it is covered by
// the retry in attempt.
const defaultProbeAfter = time.Second

// Write sends the first lens[i] bytes of each local src[i] into the start
// of peer's dst[i] under tok (nil lens: whole local slots). It refuses,
// without calling done, a peer that is not Connect'ed (ErrPeerUnknown),
// slot lists that are empty, of different lengths, outside the local pool
// or outside the pool the peer advertised (ErrBadSlot), and lengths that
// are not one per slot within 1..the smaller of both sides' slot sizes
// (ErrBadLength): the two pools' slots may differ in size, a block must
// fit both. Otherwise done is called exactly once, after the consumer's
// ack (the src slots are then no longer read) or after the failure, at
// most WriteTimeout after a worker picked the Write up.
func (t *Transport) Write(peerID string, tok rdma.Token, src, dst, lens []int, done func(rdma.Completion)) error {
	if done == nil {
		return fmt.Errorf("rdma/tcp: write %s to %s: nil done", tok, peerID)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.openLocked(); err != nil {
		return writeErr(tok, peerID, err)
	}
	p := t.peers[peerID]
	if p == nil {
		return writeErr(tok, peerID, rdma.ErrPeerUnknown)
	}
	lens, err := t.checkWrite(p, src, dst, lens)
	if err != nil {
		return writeErr(tok, peerID, err)
	}
	t.pendingWrites++
	t.dispatchLocked(p, &writeOp{tok: tok, src: slices.Clone(src), dst: slices.Clone(dst), lens: lens, done: done})
	return nil
}

// checkWrite checks the slot lists against both pools and resolves the
// lengths: each block must fit the local slot it is read from and the
// peer's largest slot (the peer checks its own slot exactly).
func (t *Transport) checkWrite(p *peer, src, dst, lens []int) ([]int, error) {
	switch {
	case len(src) == 0 || len(src) != len(dst):
		return nil, fmt.Errorf("%d src slots for %d dst slots: %w", len(src), len(dst), rdma.ErrBadSlot)
	case !t.region.Valid(src):
		return nil, fmt.Errorf("src slots not all slots of the local pool: %w", rdma.ErrBadSlot)
	}
	for _, s := range dst {
		if s < 0 || s >= p.meta.Slots {
			return nil, fmt.Errorf("dst slot %d not within the peer's 0..%d: %w", s, p.meta.Slots-1, rdma.ErrBadSlot)
		}
	}
	return t.region.Lengths(src, lens, p.meta.SlotBytes)
}

// dispatchLocked hands op to a worker on an idle connection, to a new
// worker that dials, or to the queue once MaxConnsPerPeer workers run.
// Connections (idle + busy) never exceed MaxConnsPerPeer.
// REQUIRES t.mu, !t.closed, p connected.
func (t *Transport) dispatchLocked(p *peer, op *writeOp) {
	switch {
	case len(p.idle) > 0:
		c := p.idle[len(p.idle)-1] // the most recently used: its liveness is the freshest
		p.idle = p.idle[:len(p.idle)-1]
		p.busy[c] = struct{}{}
		p.workers++
		t.spawnLocked(func() { t.work(p, c, op) })
	case p.workers < t.cfg.MaxConnsPerPeer:
		p.workers++
		t.spawnLocked(func() { t.work(p, nil, op) })
	default:
		p.queue = append(p.queue, op)
	}
}

// work runs op, then whatever the peer's queue holds, on one connection
// (redialing after a failure), and parks the connection idle when the
// queue is empty. An idle connection has no goroutine. The connection is
// parked before done runs, so that a Write issued from done reuses it.
func (t *Transport) work(p *peer, c *pconn, op *writeOp) {
	for op != nil {
		var n int64
		var err error
		c, n, err = t.attempt(p, c, op)
		var next *writeOp
		next, c = t.next(p, c)
		t.finish(p, op, n, err)
		op = next
	}
}

// attempt sends op within one WriteTimeout. A reused connection that
// breaks (the consumer closed it while idle, and the close crossed our
// transfer) is retried once on a fresh one: safe, because a token is
// accepted once — a consumer that did take the bytes refuses the retry,
// and one that got part of them has kept the expectation pending. On
// failure the connection is discarded and nil returned.
func (t *Transport) attempt(p *peer, c *pconn, op *writeOp) (*pconn, int64, error) {
	deadline := time.Now().Add(t.cfg.WriteTimeout)
	c, n, reused, err := t.sendOn(p, c, op, deadline)
	if err != nil && reused && errors.Is(err, rdma.ErrPeerGone) && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.log.Debug().Err(err).Str("peer", p.id).Msg("reused data-plane connection broke; retrying on a new one")
		c, n, _, err = t.sendOn(p, nil, op, deadline)
	}
	return c, n, err
}

// sendOn sends op on c (or on a new connection when c is nil or dead);
// reused reports whether the connection had carried a transfer before.
func (t *Transport) sendOn(p *peer, c *pconn, op *writeOp, deadline time.Time) (_ *pconn, n int64, reused bool, err error) {
	if c, err = t.ready(p, c, deadline); err != nil {
		return nil, 0, false, err
	}
	reused = c.prefaced
	if n, err = t.send(p, c, op, deadline); err != nil {
		t.discard(p, c)
		return nil, n, reused, err
	}
	return c, n, reused, nil
}

// ready returns a connection to send on: c if it is fresh or still
// alive, else a new one dialed before deadline.
func (t *Transport) ready(p *peer, c *pconn, deadline time.Time) (*pconn, error) {
	if c != nil {
		if !c.prefaced || time.Since(c.parked) < t.probeAfter || alive(c.Conn) {
			return c, nil
		}
		t.log.Debug().Str("peer", p.id).Msg("idle data-plane connection closed by the peer; redialing")
		t.discard(p, c)
	}
	d := net.Dialer{Deadline: deadline}
	conn, err := d.DialContext(p.ctx, "tcp", p.meta.Addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w: %w", p.meta.Addr, rdma.ErrPeerGone, err)
	}
	if t.cfg.TLS != nil {
		ctx, cancel := context.WithDeadline(p.ctx, deadline)
		conn, err = dialTLS(ctx, conn, t.cfg.TLS, p.id)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	nc := &pconn{Conn: conn}
	t.mu.Lock()
	defer t.mu.Unlock()
	if p.gone != nil {
		conn.Close()
		return nil, p.gone
	}
	p.busy[nc] = struct{}{}
	return nc, nil
}

// send writes one transfer — preface if the connection is new, header,
// then the payload straight from the pool slots in one writev (no copy)
// — and waits for the consumer's ack, all before deadline. It returns
// the payload bytes that left.
func (t *Transport) send(p *peer, c *pconn, op *writeOp, deadline time.Time) (int64, error) {
	c.SetDeadline(deadline)
	defer c.SetDeadline(time.Time{}) // an idle connection has no timer armed
	hdr := make([]byte, 0, prefaceFixed+len(t.cfg.Node)+headerFixed+entryBytes*len(op.dst))
	if !c.prefaced {
		hdr = appendPreface(hdr, t.cfg.Node)
	}
	hdr = appendHeader(hdr, op.tok, op.dst, op.lens)
	bufs := make(net.Buffers, 1, 1+len(op.src))
	bufs[0] = hdr
	for i, s := range op.src {
		bufs = append(bufs, t.region.Block(s, op.lens[i]))
	}
	batch := batchOf(c.Conn)
	if batch != nil {
		batch.start()
	}
	n, werr := bufs.WriteTo(c.Conn)
	if batch != nil {
		// NB: the records gathered are on the wire only after this; a
		// failure here is the payload's.
		if err := batch.flush(); werr == nil && err != nil {
			werr = err
		}
	}
	c.prefaced = true
	sent := max(0, n-int64(len(hdr)))
	t.bytesSent.Add(uint64(sent))
	// Read the ack even after a failed write: a consumer that refused the
	// header closes without reading the payload, and its ack says why.
	code, rerr := readAck(c.Conn)
	if werr != nil && (rerr != nil || code == ackOK) {
		return sent, fmt.Errorf("send: %w: %w", rdma.ErrPeerGone, werr)
	}
	return sent, ackErr(code, rerr, p.id)
}

func readAck(r io.Reader) (byte, error) {
	var b [1]byte
	_, err := io.ReadFull(r, b[:])
	return b[0], err
}

// ackErr maps the consumer's ack (or the failure to read it) to the
// Write's result.
func ackErr(code byte, err error, peerID string) error {
	switch {
	case err != nil:
		return fmt.Errorf("waiting for ack: %w: %w", rdma.ErrPeerGone, err)
	case code == ackOK:
		return nil
	case code == ackRefused:
		return fmt.Errorf("refused by %s: %w", peerID, rdma.ErrProtocol)
	}
	return fmt.Errorf("bad ack %#x from %s: %w", code, peerID, rdma.ErrProtocol)
}

// finish completes op. When the peer was dropped meanwhile, the drop's
// cause (ErrPeerGone, ErrClosed) is the reason, not the socket error it
// provoked.
func (t *Transport) finish(p *peer, op *writeOp, n int64, err error) {
	t.mu.Lock()
	t.pendingWrites--
	gone := p.gone
	t.mu.Unlock()
	c := rdma.Completion{Token: op.tok, Peer: p.id}
	switch {
	case err == nil:
		t.writesOK.Add(1)
		c.Bytes = n
	case gone != nil:
		c.Err = writeErr(op.tok, p.id, fmt.Errorf("%w (%v)", gone, err))
	default:
		c.Err = writeErr(op.tok, p.id, err)
	}
	if c.Err != nil {
		t.writesFailed.Add(1)
		t.log.Debug().Err(c.Err).Msg("data plane write failed")
	}
	op.done(c)
}

// next hands the worker the peer's next queued Write, or parks c idle
// and ends the worker.
func (t *Transport) next(p *peer, c *pconn) (*writeOp, *pconn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p.gone == nil && len(p.queue) > 0 {
		op := p.queue[0]
		p.queue[0] = nil
		p.queue = p.queue[1:]
		return op, c
	}
	p.workers--
	if c != nil {
		delete(p.busy, c)
		if p.gone == nil {
			c.parked = time.Now()
			p.idle = append(p.idle, c)
		} // else the drop closed it
	}
	return nil, nil
}

// discard forgets and closes a connection that failed.
func (t *Transport) discard(p *peer, c *pconn) {
	t.mu.Lock()
	delete(p.busy, c)
	t.mu.Unlock()
	c.Close()
}

func writeErr(tok rdma.Token, peerID string, cause error) error {
	return fmt.Errorf("rdma/tcp: write %s to %s: %w", tok, peerID, cause)
}

package tcp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"syscall"
	"time"

	"github.com/kvtier/kvtier/rdma"
)

// expect is one pending expectation (consumer side).
type expect struct {
	tok  rdma.Token
	p    *peer // the Connect epoch it was made in; bytes are accepted only from it
	dst  []int
	lens []int // bytes of each block, at the start of its dst slot
	done func(rdma.Completion)

	// REQUIRES Transport.mu for both.
	// Invariant: abort != nil only while conn != nil.
	conn  net.Conn // non-nil while a reader has claimed it and may write dst
	abort error    // why the claiming reader must end it (Cancel, Disconnect, Close)
}

// Expect registers one transfer from peer under tok into dst, lens[i]
// bytes at the start of dst[i] (nil lens: whole slots). It refuses a peer
// that is not Connect'ed (ErrPeerUnknown), an empty or out-of-range dst
// (ErrBadSlot), lengths that are not one per slot within 1..the slot size
// (ErrBadLength) and a token already pending (ErrDuplicateToken); then
// done is never called. Otherwise done is called exactly once.
func (t *Transport) Expect(peerID string, tok rdma.Token, dst, lens []int, done func(rdma.Completion)) error {
	if done == nil {
		return fmt.Errorf("rdma/tcp: expect %s from %s: nil done", tok, peerID)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.openLocked(); err != nil {
		return fmt.Errorf("rdma/tcp: expect %s from %s: %w", tok, peerID, err)
	}
	p := t.peers[peerID]
	if p == nil {
		return fmt.Errorf("rdma/tcp: expect %s from %s: %w", tok, peerID, rdma.ErrPeerUnknown)
	}
	if len(dst) == 0 || !t.region.Valid(dst) {
		return fmt.Errorf("rdma/tcp: expect %s from %s: %d dst slots, not all slots of the pool: %w",
			tok, peerID, len(dst), rdma.ErrBadSlot)
	}
	lens, err := t.region.Lengths(dst, lens, 0)
	if err != nil {
		return fmt.Errorf("rdma/tcp: expect %s from %s: %w", tok, peerID, err)
	}
	if t.expects[tok] != nil {
		return fmt.Errorf("rdma/tcp: expect %s from %s: %w", tok, peerID, rdma.ErrDuplicateToken)
	}
	exp := &expect{tok: tok, p: p, dst: slices.Clone(dst), lens: lens, done: done}
	t.expects[tok] = exp
	p.expects[tok] = exp
	return nil
}

// Cancel abandons tok's expectation. If no reader is inside its payload,
// done(ErrCanceled) comes at once (on a transport goroutine); otherwise
// the reader's connection is closed and the reader calls done once it has
// stopped writing the slots.
func (t *Transport) Cancel(tok rdma.Token) {
	var ob outbox
	t.mu.Lock()
	if exp := t.expects[tok]; exp != nil {
		t.abortExpectLocked(exp, rdma.ErrCanceled, &ob)
	}
	t.mu.Unlock()
	t.flush(&ob)
}

// abortExpectLocked ends exp with cause: at once if unclaimed, else by
// handing cause to its reader and closing the reader's connection.
// REQUIRES t.mu.
func (t *Transport) abortExpectLocked(exp *expect, cause error, ob *outbox) {
	if exp.abort != nil {
		return // already ending
	}
	if exp.conn != nil {
		exp.abort = cause
		ob.close = append(ob.close, exp.conn)
		return
	}
	t.removeExpectLocked(exp)
	t.expectsFailed.Add(1)
	ob.add(t, exp.done, rdma.Completion{Token: exp.tok, Peer: exp.p.id, Err: expectErr(exp, cause)})
}

// removeExpectLocked forgets exp. REQUIRES t.mu.
func (t *Transport) removeExpectLocked(exp *expect) {
	delete(t.expects, exp.tok)
	delete(exp.p.expects, exp.tok)
}

func expectErr(exp *expect, cause error) error {
	return fmt.Errorf("rdma/tcp: expect %s from %s: %w", exp.tok, exp.p.id, cause)
}

// accept runs the listener until Close. A failing Accept (EMFILE, ...)
// is retried after a backoff timer, never in a hot loop.
func (t *Transport) accept(ln net.Listener) {
	const minBackoff, maxBackoff = 5 * time.Millisecond, time.Second
	backoff := minBackoff
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t.log.Warn().Err(err).Dur("backoff", backoff).Msg("data plane accept failed")
			timer := time.NewTimer(backoff)
			select {
			case <-t.quit:
				timer.Stop()
				return
			case <-timer.C:
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff = minBackoff
		if !t.adopt(c) {
			c.Close()
			return
		}
	}
}

// adopt tracks an accepted connection and starts its reader; false once
// the transport is closed.
func (t *Transport) adopt(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.inbound[c] = nil
	t.spawnLocked(func() { t.serve(c) })
	return true
}

// serve is one accepted connection's reader: the preface, then transfers
// one after another until the connection ends or a transfer is refused.
// Between transfers it is blocked in Read with no deadline armed.
func (t *Transport) serve(c net.Conn) {
	defer t.release(c)
	p, err := t.greet(c)
	if err != nil {
		if !quiet(err) {
			t.refuse(c, nil, err)
		}
		return
	}
	var buf []byte
	for t.transfer(c, p, &buf) {
	}
}

// release forgets and closes an accepted connection.
func (t *Transport) release(c net.Conn) {
	t.mu.Lock()
	if p := t.inbound[c]; p != nil {
		delete(p.inbound, c)
	}
	delete(t.inbound, c)
	t.mu.Unlock()
	c.Close()
}

// greet reads the preface (within WriteTimeout: a connection that never
// speaks does not hold a reader forever) and binds the connection to the
// Connect'ed peer it names, so that Disconnect closes it.
func (t *Transport) greet(c net.Conn) (*peer, error) {
	c.SetReadDeadline(time.Now().Add(t.cfg.WriteTimeout))
	node, err := readPreface(c) // NB: on a TLS connection, after its handshake
	c.SetReadDeadline(time.Time{})
	if err != nil {
		return nil, err
	}
	if err := checkPeerName(c, node); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, net.ErrClosed
	}
	p := t.peers[node]
	if p == nil {
		return nil, fmt.Errorf("preface from %q, not a connected peer: %w", node, rdma.ErrProtocol)
	}
	t.inbound[c] = p
	p.inbound[c] = struct{}{}
	return p, nil
}

// transfer reads and settles one transfer; false ends the connection.
// The token, sender and count are checked before the entries are read (so
// their size is the expectation's), and the entries — slots and lengths —
// before any payload byte touches the pool.
func (t *Transport) transfer(c net.Conn, p *peer, buf *[]byte) bool {
	var fixed [headerFixed]byte
	if _, err := io.ReadFull(c, fixed[:]); err != nil {
		if !quiet(err) {
			t.refuse(c, p, fmt.Errorf("header: %w", err))
		}
		return false
	}
	tok, count, err := decodeHeaderFixed(&fixed, t.region.IDLimit())
	if err == nil {
		err = t.match(p, tok, count)
	}
	var dst, lens []int
	if err == nil {
		dst, lens, *buf, err = readEntries(c, count, t.region.IDLimit(), t.region.MaxSlot(), *buf)
	}
	var exp *expect
	if err == nil {
		exp, err = t.claim(p, tok, dst, lens, c)
	}
	if errors.Is(err, net.ErrClosed) {
		return false // Disconnect or Close
	}
	if err != nil {
		t.refuse(c, p, err)
		return false
	}
	if t.hooks.claimed != nil {
		t.hooks.claimed(tok)
	}
	n, err := t.readPayload(c, exp.dst, exp.lens)
	return t.settle(c, exp, n, err)
}

// match checks a header against tok's expectation without claiming it.
func (t *Transport) match(p *peer, tok rdma.Token, count int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	exp := t.expects[tok]
	switch {
	case exp == nil:
		return fmt.Errorf("token %s not expected: %w", tok, rdma.ErrProtocol)
	case exp.p != p:
		return fmt.Errorf("token %s expected from %s, sent by %s: %w", tok, exp.p.id, p.id, rdma.ErrProtocol)
	case exp.conn != nil:
		return fmt.Errorf("token %s already being received: %w", tok, rdma.ErrProtocol)
	case count != len(exp.dst):
		return fmt.Errorf("token %s: %d slots sent, %d expected: %w", tok, count, len(exp.dst), rdma.ErrProtocol)
	}
	return nil
}

// claim re-checks tok's expectation (it may have ended while the entries
// were read), compares the slots and lengths exactly and claims it for c.
func (t *Transport) claim(p *peer, tok rdma.Token, dst, lens []int, c net.Conn) (*expect, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	exp := t.expects[tok]
	if exp == nil || exp.p != p || exp.conn != nil {
		return nil, fmt.Errorf("token %s no longer claimable: %w", tok, rdma.ErrProtocol)
	}
	if !slices.Equal(dst, exp.dst) {
		return nil, fmt.Errorf("token %s: dst slots differ from the expected ones: %w", tok, rdma.ErrProtocol)
	}
	if !slices.Equal(lens, exp.lens) {
		return nil, fmt.Errorf("token %s: block lengths differ from the expected ones: %w", tok, rdma.ErrProtocol)
	}
	exp.conn = c
	return exp, nil
}

// readPayload reads the payload straight into the registered slots, one
// io.ReadFull per block into the start of its slot: no intermediate buffer.
func (t *Transport) readPayload(c net.Conn, dst, lens []int) (int64, error) {
	var n int64
	for i, s := range dst {
		m, err := io.ReadFull(c, t.region.Block(s, lens[i]))
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// settle ends a claimed transfer after the reader stopped touching the
// slots. Aborted (Cancel, Disconnect, Close): done with the abort cause.
// Complete: done(nil), then the ok ack. Broken off by the producer
// mid-payload: refused and counted, and the expectation is released
// intact — still pending, for a complete transfer or the owner's Cancel
// (its slots may hold partial bytes, which only a complete transfer can
// make done). True keeps the connection for the next transfer.
func (t *Transport) settle(c net.Conn, exp *expect, n int64, err error) bool {
	t.bytesReceived.Add(uint64(n))
	t.mu.Lock()
	exp.conn = nil
	cause := exp.abort
	if cause != nil || err == nil {
		t.removeExpectLocked(exp)
	}
	t.mu.Unlock()
	switch {
	case cause != nil:
		t.expectsFailed.Add(1)
		exp.done(rdma.Completion{Token: exp.tok, Peer: exp.p.id, Err: expectErr(exp, cause)})
		return false // abort closed c
	case err != nil:
		t.refuse(c, exp.p, fmt.Errorf("token %s: payload broken off after %d bytes: %w: %w", exp.tok, n, rdma.ErrProtocol, err))
		return false
	}
	t.expectsOK.Add(1)
	exp.done(rdma.Completion{Token: exp.tok, Peer: exp.p.id, Bytes: n})
	return t.ack(c, ackOK)
}

// refuse counts a refused transfer or connection, logs it and tries to
// tell the producer; the caller then closes the connection.
func (t *Transport) refuse(c net.Conn, p *peer, err error) {
	if !errors.Is(err, rdma.ErrProtocol) {
		err = fmt.Errorf("%w: %w", rdma.ErrProtocol, err) // a short or silent frame
	}
	t.refused.Add(1)
	ev := t.log.Warn().Err(err).Str("remote", c.RemoteAddr().String())
	if p != nil {
		ev = ev.Str("peer", p.id)
	}
	ev.Msg("data plane transfer refused")
	if t.hooks.refused != nil {
		t.hooks.refused(err)
	}
	t.ack(c, ackRefused)
}

// ack writes a one-byte ack. NB: no deadline: only acks are ever written
// on an inbound connection and the producer reads each before it sends
// the next transfer, so the send buffer cannot fill; Disconnect and Close
// unblock it regardless.
func (t *Transport) ack(c net.Conn, code byte) bool {
	_, err := c.Write([]byte{code})
	return err == nil
}

// quiet reports a connection ending at a frame boundary: the producer
// closed it (EOF, reset) or we did (Disconnect, Close). Not a refusal.
func quiet(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET)
}

package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/rdma"
)

// Transport is the TCP data plane: an rdma.Transport whose producer side
// dials peers lazily and whose consumer side reads payloads straight into
// the registered pool. Safe for concurrent use.
type Transport struct {
	cfg Config
	log zerolog.Logger

	// Counters, updated without t.mu.
	bytesSent, bytesReceived atomic.Uint64
	writesOK, writesFailed   atomic.Uint64
	expectsOK, expectsFailed atomic.Uint64
	refused                  atomic.Uint64

	probeAfter time.Duration // idle time after which reuse probes the connection; tests lower it

	// hooks are set by tests only, before Register.
	hooks struct {
		refused func(error)      // after a refusal is counted, before its ack
		claimed func(rdma.Token) // a reader claimed an expectation; payload next
	}

	// wg counts every goroutine the transport starts; Close waits on it.
	// Invariant: wg.Add happens under mu while !closed, or inside Close
	// before its Wait, so Add never races Wait.
	wg   sync.WaitGroup
	quit chan struct{} // closed by Close: wakes the accept loop's backoff

	// region is set once by Register and immutable after; goroutines
	// started after Register read it without mu.
	region rdma.Region

	mu sync.Mutex
	// REQUIRES mu for everything below.
	closed        bool
	registered    bool
	ln            net.Listener
	meta          []byte
	peers         map[string]*peer       // Connect'ed peers, both roles
	expects       map[rdma.Token]*expect // pending expectations, by token
	inbound       map[net.Conn]*peer     // accepted conns; nil value until the preface names a peer
	pendingWrites int                    // Writes accepted whose done has not been called
}

var _ rdma.Transport = (*Transport)(nil)

// New builds a transport; Register starts it.
func New(cfg Config) (*Transport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Transport{
		cfg:        cfg,
		log:        cfg.Log.With().Str("component", "rdma/tcp").Str("node", cfg.Node).Logger(),
		quit:       make(chan struct{}),
		probeAfter: defaultProbeAfter,
		peers:      map[string]*peer{},
		expects:    map[rdma.Token]*expect{},
		inbound:    map[net.Conn]*peer{},
	}, nil
}

// Kind is "tcp".
func (t *Transport) Kind() string { return "tcp" }

// Register checks r, binds the listener and starts the accept loop.
func (t *Transport) Register(r rdma.Region) error {
	if err := checkRegion(r); err != nil {
		return fmt.Errorf("rdma/tcp: register: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return fmt.Errorf("rdma/tcp: register: %w", rdma.ErrClosed)
	}
	if t.registered {
		return errors.New("rdma/tcp: register: already registered")
	}
	ln, err := net.Listen("tcp", t.cfg.Listen)
	if err != nil {
		return fmt.Errorf("rdma/tcp: register: listen %s: %w", t.cfg.Listen, err)
	}
	adv := t.advertise(ln)
	if t.cfg.TLS != nil {
		ln = tls.NewListener(ln, serverTLS(t.cfg.TLS))
	}
	if err := checkAddr(adv); err != nil {
		ln.Close()
		return fmt.Errorf("rdma/tcp: register: advertise: %w", err)
	}
	t.region, t.ln, t.registered = r, ln, true
	// NB: a pool of several block sizes tells its largest slot and its id
	// bound: a peer checks a write against them, we check it exactly.
	t.meta = encodeMeta(peerMeta{Addr: adv, SlotBytes: r.MaxSlot(), Slots: r.IDLimit()})
	t.spawnLocked(func() { t.accept(ln) })
	t.log.Info().Str("listen", ln.Addr().String()).Str("advertise", adv).
		Int("slots", r.Slots).Int("slot_bytes", r.SlotBytes).Msg("data plane listening")
	return nil
}

// checkRegion refuses a geometry the wire cannot carry or the mapping
// cannot hold.
func checkRegion(r rdma.Region) error {
	if r.SlotBytes <= 0 || r.Slots <= 0 || r.MaxSlot() > math.MaxInt32 || r.IDLimit() > math.MaxInt32 {
		return fmt.Errorf("geometry %d×%d (ids below %d, slots up to %d bytes): want 1..2^31-1 each",
			r.Slots, r.SlotBytes, r.IDLimit(), r.MaxSlot())
	}
	if len(r.Base)/r.SlotBytes < r.Slots {
		return fmt.Errorf("base of %d bytes holds fewer than %d slots of %d", len(r.Base), r.Slots, r.SlotBytes)
	}
	return nil
}

// advertise is the address peers dial: the configured one, else the
// listener's (which is only reachable from elsewhere if Listen named a
// concrete interface).
func (t *Transport) advertise(ln net.Listener) string {
	if t.cfg.Advertise != "" {
		return t.cfg.Advertise
	}
	a := ln.Addr().(*net.TCPAddr)
	if a.IP.IsUnspecified() {
		t.log.Warn().Str("listen", a.String()).Msg("listening on a wildcard address without Advertise: peers get an undialable address")
	}
	return a.String()
}

// Metadata is this node's versioned address and geometry (doc.go,
// "Metadata"); nil before Register.
func (t *Transport) Metadata() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.meta...)
}

// Connect decodes peer's metadata and makes it reachable; dialing is lazy.
// A second Connect for the same peer fails the old epoch's pending work
// and closes its connections first.
func (t *Transport) Connect(id string, meta []byte) error {
	if id == "" || len(id) > maxNodeID {
		return fmt.Errorf("rdma/tcp: connect: peer id %q: want 1..%d bytes", id, maxNodeID)
	}
	m, err := decodeMeta(meta)
	if err != nil {
		return fmt.Errorf("rdma/tcp: connect %s: %w", id, err)
	}
	var ob outbox
	t.mu.Lock()
	if err := t.openLocked(); err != nil {
		t.mu.Unlock()
		return fmt.Errorf("rdma/tcp: connect %s: %w", id, err)
	}
	if t.peers[id] != nil {
		t.dropPeerLocked(id, fmt.Errorf("peer %s reconnected (new session): %w", id, rdma.ErrPeerGone), &ob)
	}
	t.peers[id] = newPeer(id, m)
	t.mu.Unlock()
	t.flush(&ob)
	t.log.Debug().Str("peer", id).Str("addr", m.Addr).Msg("peer connected")
	return nil
}

// Disconnect forgets peer: its pending Expects and Writes fail with
// ErrPeerGone and its connections (both directions) close.
func (t *Transport) Disconnect(id string) {
	var ob outbox
	t.mu.Lock()
	t.dropPeerLocked(id, fmt.Errorf("peer %s disconnected: %w", id, rdma.ErrPeerGone), &ob)
	t.mu.Unlock()
	t.flush(&ob)
}

// Stats is a snapshot of the counters.
func (t *Transport) Stats() rdma.Stats {
	t.mu.Lock()
	pe, pw := len(t.expects), t.pendingWrites
	t.mu.Unlock()
	return rdma.Stats{
		Kind:           t.Kind(),
		BytesSent:      t.bytesSent.Load(),
		BytesReceived:  t.bytesReceived.Load(),
		WritesOK:       t.writesOK.Load(),
		WritesFailed:   t.writesFailed.Load(),
		ExpectsOK:      t.expectsOK.Load(),
		ExpectsFailed:  t.expectsFailed.Load(),
		Refused:        t.refused.Load(),
		PendingExpects: pe,
		PendingWrites:  pw,
	}
}

// Close fails everything pending with ErrClosed, closes the listener and
// every connection, and returns once every goroutine of the transport has
// ended (so it must not be called from a done callback). Idempotent: a
// second Close also returns only once everything has ended.
func (t *Transport) Close() error {
	var ob outbox
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.wg.Wait() // a concurrent Close may still be draining
		return nil
	}
	t.closed = true
	close(t.quit)
	errClosed := fmt.Errorf("transport closed: %w", rdma.ErrClosed)
	for id := range t.peers {
		t.dropPeerLocked(id, errClosed, &ob)
	}
	for c := range t.inbound {
		ob.close = append(ob.close, c) // conns whose preface has not named a peer yet
	}
	if t.ln != nil {
		ob.close = append(ob.close, t.ln)
	}
	t.mu.Unlock()
	t.flush(&ob)
	t.wg.Wait()
	t.log.Debug().Msg("data plane closed")
	return nil
}

// openLocked reports whether calls other than Register may proceed.
// REQUIRES t.mu.
func (t *Transport) openLocked() error {
	if t.closed {
		return rdma.ErrClosed
	}
	if !t.registered {
		return rdma.ErrNotRegistered
	}
	return nil
}

// spawnLocked starts a tracked goroutine. REQUIRES t.mu and !t.closed
// (see the wg invariant).
func (t *Transport) spawnLocked(f func()) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f()
	}()
}

// dropPeerLocked removes peer id (if connected) and fails its work with
// cause: queued Writes and unclaimed Expects complete through ob; a
// claimed Expect is marked so that its reader completes it once it stops
// touching the slots; every connection of the peer is closed by ob, which
// also interrupts in-flight Writes (their workers complete them).
// REQUIRES t.mu.
func (t *Transport) dropPeerLocked(id string, cause error, ob *outbox) {
	p := t.peers[id]
	if p == nil {
		return
	}
	delete(t.peers, id)
	p.gone = cause
	p.cancel() // aborts dials in progress
	for _, c := range p.idle {
		ob.close = append(ob.close, c)
	}
	p.idle = nil
	for c := range p.busy {
		ob.close = append(ob.close, c)
	}
	for _, op := range p.queue {
		t.pendingWrites--
		t.writesFailed.Add(1)
		ob.add(t, op.done, rdma.Completion{Token: op.tok, Peer: id, Err: writeErr(op.tok, id, cause)})
	}
	p.queue = nil
	for _, exp := range p.expects {
		t.abortExpectLocked(exp, cause, ob)
	}
	for c := range p.inbound {
		ob.close = append(ob.close, c)
	}
}

// outbox collects what a locked section decided — completions to deliver
// and connections to close — so that both happen after the lock is
// released: done callbacks never run under t.mu, and never on the
// caller's goroutine (the contract says transport goroutines).
type outbox struct {
	calls []call
	close []io.Closer
}

type call struct {
	done func(rdma.Completion)
	c    rdma.Completion
}

// add queues one completion. The first one reserves the delivering
// goroutine in t.wg while the caller still holds t.mu (wg invariant).
func (ob *outbox) add(t *Transport, done func(rdma.Completion), c rdma.Completion) {
	if len(ob.calls) == 0 {
		t.wg.Add(1)
	}
	ob.calls = append(ob.calls, call{done, c})
}

// flush closes ob's connections, then delivers its completions on one
// goroutine reserved by add. Call without t.mu.
func (t *Transport) flush(ob *outbox) {
	for _, c := range ob.close {
		c.Close()
	}
	if len(ob.calls) == 0 {
		return
	}
	calls := ob.calls
	go func() {
		defer t.wg.Done()
		for _, c := range calls {
			c.done(c.c)
		}
	}()
}

// peer is one Connect'ed node, in both roles: the producer's connection
// pool and queue towards it, and the consumer's expectations from it and
// the connections it opened to us. A Connect replaces the object, so a
// goroutine holding the old one sees gone and fails its work.
type peer struct {
	id     string
	meta   peerMeta
	ctx    context.Context // canceled when the peer is dropped: aborts dials
	cancel context.CancelFunc

	// REQUIRES Transport.mu for everything below.
	gone    error                  // non-nil once dropped (disconnected, replaced, closed)
	idle    []*pconn               // producer: connections with no Write in flight
	busy    map[*pconn]struct{}    // producer: connections a worker is using
	workers int                    // producer: worker goroutines (dialing or busy); <= MaxConnsPerPeer
	queue   []*writeOp             // producer: Writes waiting for a worker
	expects map[rdma.Token]*expect // consumer: pending expectations from this peer
	inbound map[net.Conn]struct{}  // consumer: accepted conns whose preface named this peer
}

func newPeer(id string, m peerMeta) *peer {
	ctx, cancel := context.WithCancel(context.Background())
	return &peer{
		id: id, meta: m, ctx: ctx, cancel: cancel,
		busy:    map[*pconn]struct{}{},
		expects: map[rdma.Token]*expect{},
		inbound: map[net.Conn]struct{}{},
	}
}

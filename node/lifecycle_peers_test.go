package node

// Lifecycle with peers attached (docs/DESIGN.md §3.1, §6.4; seed 002): pending work
// means "needs an engine step" and nothing a peer does; a paused node keeps
// serving peers from its CPU tier; pause with clearCache copes with rounds
// parked at any phase; shutdown under peer load, with a stalled peer or a
// stuck disk, returns within its context and leaves nothing behind.
//
// Nothing here asserts a duration: a bound is checked by the call
// returning at all before a generous test deadline.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/internal/testutil/testleak"
	"github.com/kvtier/kvtier/internal/testutil/testloop"
	"github.com/kvtier/kvtier/internal/testutil/testnet"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer/wire"
	"github.com/kvtier/kvtier/rdma"
	"github.com/kvtier/kvtier/rdma/tcp"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/fs"
)

// stallTransport is the tcp data plane with a switch: while stalled, a
// producer's Write is accepted and then held — no byte moves and its done
// does not run — as with a peer that stopped reading mid-fetch. release
// runs the held writes for real; Close fails them (ErrClosed), as the
// contract says.
type stallTransport struct {
	rdma.Transport
	mu      sync.Mutex
	stalled bool
	held    []heldWrite
	wrote   chan struct{} // one token per Write held
}

type heldWrite struct {
	peer     string
	tok      rdma.Token
	src, dst []int
	lens     []int
	done     func(rdma.Completion)
}

func newStallTransport(t *testing.T, node string) *stallTransport {
	t.Helper()
	inner, err := tcp.New(tcp.Config{Node: node, Listen: "127.0.0.1:0", Log: zerolog.Nop()})
	require.NoError(t, err)
	return &stallTransport{Transport: inner, wrote: make(chan struct{}, 1024)}
}

// prodTransport gives the node "prod" of openPair the data plane tr.
func prodTransport(tr rdma.Transport) func(*config.Config) {
	return func(c *config.Config) {
		if c.Peers.NodeID == "prod" {
			c.Peers.TransportImpl = tr
		}
	}
}

func (s *stallTransport) stall() {
	s.mu.Lock()
	s.stalled = true
	s.mu.Unlock()
}

func (s *stallTransport) Write(peer string, tok rdma.Token, src, dst, lens []int, done func(rdma.Completion)) error {
	s.mu.Lock()
	if s.stalled {
		s.held = append(s.held, heldWrite{peer: peer, tok: tok, src: src, dst: dst, lens: lens, done: done})
		s.mu.Unlock()
		s.wrote <- struct{}{}
		return nil
	}
	s.mu.Unlock()
	return s.Transport.Write(peer, tok, src, dst, lens, done)
}

// release ends the stall: held writes run for real.
func (s *stallTransport) release() {
	s.mu.Lock()
	held := s.held
	s.held, s.stalled = nil, false
	s.mu.Unlock()
	for _, w := range held {
		if err := s.Transport.Write(w.peer, w.tok, w.src, w.dst, w.lens, w.done); err != nil {
			go w.done(rdma.Completion{Token: w.tok, Peer: w.peer, Err: err})
		}
	}
}

func (s *stallTransport) Close() error {
	s.mu.Lock()
	held := s.held
	s.held = nil
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range held {
		wg.Add(1)
		go func() { // NB: never on the caller's goroutine (the contract)
			defer wg.Done()
			w.done(rdma.Completion{Token: w.tok, Peer: w.peer, Err: rdma.ErrClosed})
		}()
	}
	wg.Wait()
	return s.Transport.Close()
}

// awaitHeld waits until n more producer writes are held.
func (s *stallTransport) awaitHeld(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	for range n {
		select {
		case <-s.wrote:
		case <-ctx.Done():
			t.Fatalf("no peer fetch reached the producer's data plane: %v", ctx.Err())
		}
	}
}

func realClock(c *config.Config) { c.Clock = supervision.RealClock{} }

func (h *harness) pending() bool {
	h.t.Helper()
	has, err := h.m.HasPendingWork(h.ctx)
	require.NoError(h.t, err)
	return has
}

// storeReady stores ids on h and waits until they are readable there.
func (h *harness) storeReady(ids ...int) {
	h.t.Helper()
	h.store(&messages.ReqContext{RequestID: "w"}, ids...)
	probe := &messages.ReqContext{RequestID: "probe"}
	require.Equal(h.t, statuses(len(ids), messages.Hit), h.lookupUntilSettled(probe, keys(ids...)))
	require.NoError(h.t, h.m.RequestFinished(h.ctx, probe))
}

// fetchAndVerify fetches ids from h's peers into h and checks every byte.
func (h *harness) fetchAndVerify(req *messages.ReqContext, ids ...int) {
	h.t.Helper()
	ks := keys(ids...)
	h.lookup(req, ks, true)
	h.idle()
	require.Equal(h.t, statuses(len(ids), messages.Hit), h.lookup(req, ks, true), "fetched from the peer")
	h.loadAndVerify(req, ids...)
}

// A consumer fetching from an idle producer, with the producer's write
// parked mid-fetch: neither side has engine work pending — the producer's
// lease and pin, the consumer's promotion and its write-pending slots all
// progress without an engine step. An engine job (the control) is pending
// work until its worker reports.
func TestLifecycleHasPendingWorkCountsOnlyEngineJobs(t *testing.T) {
	tr := newStallTransport(t, "prod")
	prod, cons := openPair(t, 32, prodTransport(tr))
	prod.storeReady(ids(0, 4)...)
	require.False(t, prod.pending(), "stored and committed: nothing pending")

	tr.stall()
	req := &messages.ReqContext{RequestID: "r"}
	require.Equal(t, messages.Retry, cons.lookup(req, keys(ids(0, 4)...), true)[0])
	tr.awaitHeld(t, prod.ctx, 1)
	require.Equal(t, 4, prod.stats().Pinned, "the peer's round pins the producer's blocks")
	require.Equal(t, 4, cons.stats().WritePending, "the consumer's promotion is in flight")
	require.False(t, prod.pending(), "serving a peer is not engine work")
	require.False(t, cons.pending(), "fetching from a peer is not engine work")

	plan, err := cons.m.PrepareStore(cons.ctx, &messages.ReqContext{RequestID: "w"}, keys(100))
	require.NoError(t, err)
	require.True(t, cons.pending(), "an engine store job awaits its worker")
	require.NoError(t, cons.m.JobDone(cons.ctx, plan.Job, 0, true))
	require.False(t, cons.pending())

	require.NoError(t, prod.m.Pause(prod.ctx, false), "pause returns with a peer round parked")
	tr.release()
	cons.idle()
	require.Equal(t, statuses(4, messages.Hit), cons.lookup(req, keys(ids(0, 4)...), true))
	cons.loadAndVerify(req, ids(0, 4)...)
	require.False(t, cons.pending())
	prod.quiet()
	cons.quiet()
}

// A paused producer stops its engine's intake but keeps serving peers from
// its CPU tier; Resume restores its engine's intake.
func TestLifecyclePausedProducerServesPeers(t *testing.T) {
	prod, cons := openPair(t, 64)
	prod.storeReady(ids(0, 16)...)
	require.NoError(t, prod.m.Pause(prod.ctx, false))
	require.True(t, prod.stats().Paused)

	own := &messages.ReqContext{RequestID: "own"}
	require.Equal(t, statuses(4, messages.Miss), prod.lookup(own, keys(ids(0, 4)...), false), "paused: the engine gets MISS")
	_, err := prod.m.PrepareStore(prod.ctx, own, keys(99))
	require.ErrorIs(t, err, messages.ErrPaused)
	_, err = prod.m.PrepareLoad(prod.ctx, own, keys(0))
	require.ErrorIs(t, err, messages.ErrPaused)

	cons.fetchAndVerify(&messages.ReqContext{RequestID: "r1"}, ids(0, 8)...)
	cons.fetchAndVerify(&messages.ReqContext{RequestID: "r2"}, ids(8, 8)...)
	require.False(t, prod.pending())
	ps, err := prod.node.PeerStats(prod.ctx)
	require.NoError(t, err)
	require.Len(t, ps, 1)
	require.Equal(t, uint64(16), ps[0].Served, "every block was served while paused")
	prod.quiet()

	require.NoError(t, prod.m.Resume(prod.ctx))
	require.False(t, prod.stats().Paused)
	require.Equal(t, statuses(4, messages.Hit), prod.lookup(own, keys(ids(0, 4)...), false), "resumed: HITs again")
	require.NoError(t, prod.m.RequestFinished(prod.ctx, own))
	prod.quiet()
}

// Pause with clearCache while peers' rounds are parked at the producer:
// one leased and never fetched (a raw peer), one pinned with its write in
// flight (a stalled data plane). The clear neither asserts nor waits for
// them: leased blocks go (their fetch then fails cleanly), blocks being
// written are unindexed at once and their slots freed when the write ends,
// and the consumer of that write gets every byte intact.
func TestLifecyclePauseClearCacheWithParkedPeerRounds(t *testing.T) {
	tr := newStallTransport(t, "prod")
	prod, cons := openPair(t, 32, prodTransport(tr))
	prod.storeReady(ids(0, 8)...)

	raw := dialRaw(t, prod.ctx, prod.node.PeerAddr(), "raw")
	_, ok := raw.handshake(testSecret, raw.hello()).(*wire.Ready)
	require.True(t, ok)
	wk := wireKeys(keys(ids(0, 4)...))
	raw.send(&wire.Lookup{Epoch: raw.epoch, Round: 1, Keys: wk})
	resp, ok := raw.recv().(*wire.LookupResp)
	require.True(t, ok)
	require.Equal(t, []bool{true, true, true, true}, resp.Hits)

	tr.stall()
	req := &messages.ReqContext{RequestID: "r"}
	cons.lookup(req, keys(ids(4, 4)...), true)
	tr.awaitHeld(t, prod.ctx, 1)
	s := prod.stats()
	require.Equal(t, 4, s.Leased, "the raw peer's round is parked, leased")
	require.Equal(t, 4, s.Pinned, "the consumer's round is parked, pinned")

	require.NoError(t, prod.m.Pause(prod.ctx, true))
	s = prod.stats()
	require.Zero(t, s.Leased, "the clear ended the parked leases")
	require.Equal(t, 4, s.Pinned, "blocks being written to a peer are kept")
	require.Equal(t, 4, s.Ready)
	require.False(t, prod.pending())

	raw.send(&wire.Fetch{Epoch: raw.epoch, Round: 1, Keys: wk, Dest: []int{0, 1, 2, 3}, Token: make([]byte, wire.TokenBytes), TTLms: 5000})
	done, ok := raw.recv().(*wire.TransferDone)
	require.True(t, ok)
	require.False(t, done.OK, "a fetch of cleared blocks fails; it is not served stale")

	tr.release()
	cons.idle()
	require.Equal(t, statuses(4, messages.Hit), cons.lookup(req, keys(ids(4, 4)...), true))
	cons.loadAndVerify(req, ids(4, 4)...)
	prod.quiet()
	cons.quiet()
	require.NoError(t, prod.m.Resume(prod.ctx))
	// The blocks the peer was reading during the clear went with it: their
	// slots were freed when the write ended, and they are never served
	// again (after a weight update that would be wrong KV).
	require.Zero(t, prod.stats().Ready, "the cleared blocks' slots are free")
	after := &messages.ReqContext{RequestID: "after-clear"}
	prod.lookup(after, keys(ids(4, 4)...), false)
	prod.idle()
	require.Equal(t, statuses(4, messages.Miss), prod.lookup(after, keys(ids(4, 4)...), false))
}

// fetchLoop fetches ids from cons's peers over and over, clearing cons's
// primary between rounds so each round goes to a peer. Every verified
// round is counted; a round that finds no peer copy (the producer went
// away) is counted as missed.
type fetchLoop struct {
	*testloop.Loop
	verified, missed atomic.Int64
}

func startFetchLoop(t *testing.T, cons *harness, ids ...int) *fetchLoop {
	t.Helper()
	l := &fetchLoop{}
	ks := keys(ids...)
	want := make([]byte, testBlock)
	l.Loop = testloop.Start(t, func(n int, _ <-chan struct{}) error { return l.round(cons, n, ks, ids, want) })
	return l
}

func (l *fetchLoop) round(cons *harness, n int, ks []messages.Key, ids []int, want []byte) error {
	ctx, m := cons.ctx, cons.m
	req := &messages.ReqContext{RequestID: fmt.Sprintf("loop-%d", n)}
	defer m.RequestFinished(ctx, req) //nolint:errcheck // best effort; checked by quiet()
	if _, err := m.Lookup(ctx, req, ks, true); err != nil {
		return err
	}
	if err := cons.node.TieringIdle(ctx); err != nil {
		return err
	}
	st, err := m.Lookup(ctx, req, ks, true)
	if err != nil {
		return err
	}
	for _, s := range st {
		if s != messages.Hit {
			l.missed.Add(1)
			return m.ResetCache(ctx)
		}
	}
	job, err := m.PrepareLoad(ctx, req, ks)
	if err != nil {
		return err
	}
	for i, id := range ids {
		fill(want, id)
		if string(want) != string(m.Pool().Slot(job.Slots[i])) {
			return errors.New("a fetched block differs from what the producer stored")
		}
	}
	if err := m.CompleteLoad(ctx, req, ks); err != nil {
		return err
	}
	l.verified.Add(1)
	return m.ResetCache(ctx)
}

// socketFDs counts this process's open sockets.
func socketFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.HasPrefix(target, "socket:") {
			n++
		}
	}
	return n
}

// The CI test of seed 002's scenario: a producer under continuous peer
// load pauses (its peer keeps fetching and verifying from it while it is
// paused), resumes, and shuts down with the peer still fetching. Shutdown
// returns cleanly, the consumer is left consistent (it recomputes what it
// cannot fetch), and nothing remains: no goroutine, no socket, no pool
// file — only the persistent fs tier's blocks.
func TestLifecycleShutdownUnderPeerLoad(t *testing.T) {
	before := goleak.IgnoreCurrent()
	sockets := socketFDs(t)
	dir, fsRoot := t.TempDir(), t.TempDir()
	pool := filepath.Join(dir, "prod.pool")
	prod, cons := openPair(t, 64, realClock, func(c *config.Config) {
		if c.Peers.NodeID == "prod" {
			c.PoolPath = pool
			withFS(fsRoot)(c)
		}
	})
	prod.storeReady(ids(0, 8)...)
	prod.idle() // cascaded to the fs tier

	loop := startFetchLoop(t, cons, ids(0, 8)...)
	loop.Await(t, cons.ctx, &loop.verified, 2, "verified rounds")

	require.NoError(t, prod.m.Pause(prod.ctx, false))
	require.False(t, prod.pending())
	loop.Await(t, cons.ctx, &loop.verified, 3, "rounds served while paused")
	require.True(t, prod.stats().Paused)
	require.NoError(t, prod.m.Resume(prod.ctx))
	loop.Await(t, cons.ctx, &loop.verified, 1, "a verified round after resume")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, prod.node.Close(ctx), "graceful shutdown with a peer still fetching")
	_, err := os.Stat(pool)
	require.ErrorIs(t, err, os.ErrNotExist, "the pool file is removed")
	require.NotZero(t, countFiles(t, fsRoot), "the persistent tier keeps its blocks")
	_, err = prod.m.Lookup(prod.ctx, &messages.ReqContext{RequestID: "late"}, keys(0), false)
	require.ErrorIs(t, err, messages.ErrClosed)
	_, err = prod.m.Stats(prod.ctx)
	require.ErrorIs(t, err, messages.ErrClosed, "a call after Close fails at once")

	// The consumer keeps running: its rounds now find no peer copy.
	loop.Await(t, cons.ctx, &loop.missed, 2, "rounds that found no peer copy")
	require.NoError(t, loop.Halt())
	cons.idle()
	cons.quiet()

	require.NoError(t, cons.node.Close(ctx))
	goleak.VerifyNone(t, before, testleak.ZMQPubWriter)
	// NB: at most as many as before: a socket of an earlier test in this
	// process may still have been closing when this one began.
	require.LessOrEqual(t, socketFDs(t), sockets, "no socket outlives the nodes")
}

func countFiles(t *testing.T, root string) int {
	t.Helper()
	n := 0
	require.NoError(t, filepath.WalkDir(root, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return err
	}))
	return n
}

// A peer that stops mid-fetch — its data plane holds the write and never
// completes it — bounds both sides' shutdown by the drain deadline: the
// consumer aborts its round, the producer gives up on the write; neither
// hangs, and both close cleanly.
func TestLifecycleShutdownWithStalledPeer(t *testing.T) {
	before := goleak.IgnoreCurrent()
	tr := newStallTransport(t, "prod")
	prod, cons := openPair(t, 32, realClock, prodTransport(tr))
	prod.storeReady(ids(0, 4)...)
	tr.stall()
	cons.lookup(&messages.ReqContext{RequestID: "r"}, keys(ids(0, 4)...), true)
	tr.awaitHeld(t, prod.ctx, 1)

	for _, h := range []*harness{cons, prod} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		closed := make(chan error, 1)
		go func() { closed <- h.node.Close(ctx) }()
		select {
		case err := <-closed:
			require.NoError(t, err)
		case <-time.After(20 * time.Second): // NB: a liveness bound, far past ctx's
			t.Fatalf("Close hung past its context; goroutines:\n%s", stacks())
		}
		cancel()
	}
	goleak.VerifyNone(t, before, testleak.ZMQPubWriter)
}

// A stuck disk (an fs write that never returns) does not hold shutdown:
// Close returns when its context ends, says the tier's I/O is still
// running, and keeps the pool mapped rather than pull memory from under
// that write. A cascade stuck on the disk is never engine work.
func TestLifecycleShutdownWithStuckDisk(t *testing.T) {
	faulty := fs.NewFaulty(fs.OS{})
	unstick := make(chan struct{})
	stuck := make(chan struct{}, 64)
	remove := faulty.Inject(func(op fs.Op, _ string) error {
		if op == fs.OpWrite {
			stuck <- struct{}{}
			<-unstick
		}
		return nil
	})
	defer remove()
	// NB: not open(): its cleanup requires a clean Close.
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	cfg := config.Config{PoolBytes: 8 * testBlock, BlockBytes: testBlock}
	withFS(t.TempDir(), func(tc *config.TierConfig) { tc.FS = faulty })(&cfg)
	node, err := Open(ctx, cfg)
	require.NoError(t, err)
	h := &harness{t: t, mode: embeddedMode, node: node, m: node.Manager(), ctx: ctx}
	h.store(&messages.ReqContext{RequestID: "w"}, 1)
	select {
	case <-stuck:
	case <-ctx.Done():
		t.Fatal("the cascade never reached the disk")
	}
	require.False(t, h.pending(), "a cascade stuck on disk is not engine work")

	requireCloseMisses(t, node, "stop tier I/O (pool left mapped)")
	close(unstick) // the disk comes back: the worker ends (goleak in TestMain)
}

// requireCloseMisses closes node with a second's deadline, which it must
// miss, saying what it left (want).
func requireCloseMisses(t *testing.T, node *Node, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := node.Close(ctx)
	require.Error(t, err)
	require.Contains(t, err.Error(), want)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func stacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// A peer frozen before it could greet (SIGSTOPped: its kernel accepts the
// connection, its process never speaks) holds our dial in zmq4's ZMTP
// handshake, which reads with no deadline. Shutdown must not wait for it.
func TestLifecycleShutdownWhileDialingAFrozenPeer(t *testing.T) {
	before := goleak.IgnoreCurrent()
	ln := testnet.Listen(t, "tcp", "127.0.0.1:0")
	accepted := testnet.Accept(t, ln)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	cfg := config.Config{PoolBytes: 8 * testBlock, BlockBytes: testBlock}
	withPeers("cons", config.PeerAddr{NodeID: "frozen", Addr: "tcp://" + ln.Addr().String()})(&cfg)
	node, err := Open(ctx, cfg)
	require.NoError(t, err)
	var conns []net.Conn
	select {
	case c := <-accepted:
		conns = append(conns, c) // the dial is in its handshake now
	case <-ctx.Done():
		t.Fatal("the node never dialed its peer")
	}

	closeCtx, closeCancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer closeCancel()
	closed := make(chan error, 1)
	go func() { closed <- node.Close(closeCtx) }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(20 * time.Second): // NB: a liveness bound, far past closeCtx's
		t.Fatalf("Close hung past its context; goroutines:\n%s", stacks())
	}
	require.NoError(t, ln.Close())
	for c := range accepted {
		conns = append(conns, c)
	}
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	goleak.VerifyNone(t, before)
}

// zmq4 v0.17.0 runs the ZMTP handshake (greeting, READY) with no deadline
// and outside the socket's context — on a DEALER inside Dial, on a ROUTER
// inside its single accept loop. peer/ dials through a transport that
// closes on the socket's context and listens through one that bounds the
// handshake (internal/zmqx); these tests hold it to that.

// A connection that never greets must not stop other peers from
// connecting, nor outlive Close.
func TestLifecyclePeersConnectWhileAConnectionNeverGreets(t *testing.T) {
	before := goleak.IgnoreCurrent()
	prod := open(t, 8, withPeers("prod"))
	silent, err := net.Dial("tcp", strings.TrimPrefix(prod.node.PeerAddr(), "tcp://"))
	require.NoError(t, err)
	defer silent.Close()
	cons := open(t, 8, withPeers("cons", config.PeerAddr{NodeID: "prod", Addr: prod.node.PeerAddr()}))
	ctx, cancel := context.WithTimeout(cons.ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, cons.node.WaitPeers(ctx, "prod"), "a silent connection blocks no one")
	for _, h := range []*harness{cons, prod} {
		require.NoError(t, h.node.Close(h.ctx))
	}
	goleak.VerifyNone(t, before)
}

// A checksum an actor runs off its mailbox (here one stuck in flight) keeps
// the pool mapped: Close waits for it until its deadline, then says so, and
// the slot memory it reads stays valid.
func TestCloseKeepsThePoolMappedWhileASlotReaderRuns(t *testing.T) {
	// NB: not open(): its cleanup requires a clean Close.
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	node, err := Open(ctx, config.Config{PoolBytes: 8 * testBlock, BlockBytes: testBlock})
	require.NoError(t, err)
	slot := node.Manager().Pool().Slot(3)
	unstick, read := make(chan struct{}), make(chan byte)
	require.True(t, node.offload.Go(func() { <-unstick; read <- slot[testBlock-1] }))

	requireCloseMisses(t, node, "stop slot readers (pool left mapped)")
	close(unstick)
	require.Equal(t, byte(0), <-read, "the reader still reads mapped memory after Close")
}

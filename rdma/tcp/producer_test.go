package tcp

import (
	"bytes"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/internal/testutil/testnet"
	"github.com/kvtier/kvtier/rdma"
)

// fakeConsumer is a raw listener Connect'ed to the producer under test as
// peer "c": the test reads the producer's bytes and writes its acks.
type fakeConsumer struct {
	t     *testing.T
	slots int             // of the producer's pool
	conns <-chan net.Conn // closed only after the test
}

func newFakeConsumer(t *testing.T, tr *Transport, slots, slotBytes int) *fakeConsumer {
	ln := testnet.Listen(t, "tcp", "127.0.0.1:0")
	f := &fakeConsumer{t: t, slots: slots, conns: testnet.Accept(t, ln)}
	if err := tr.Connect("c", encodeMeta(peerMeta{Addr: ln.Addr().String(), SlotBytes: slotBytes, Slots: slots})); err != nil {
		t.Fatal(err)
	}
	return f
}

// accept returns the producer's next connection.
func (f *fakeConsumer) accept() net.Conn {
	f.t.Helper()
	c := recv(f.t, f.conns, "connection from the producer")
	f.t.Cleanup(func() { c.Close() })
	return c
}

// firstWrite has tr write slot 0 to slot 0 and serves it, acked, on the
// producer's first connection: that connection, idle once the Write is
// done.
func (f *fakeConsumer) firstWrite(tr *Transport) net.Conn {
	f.t.Helper()
	d := tr.mustWrite(f.t, rdma.NewToken(), []int{0}, []int{0})
	c := f.accept()
	readTransfer(f.t, c, true, tr.cfg.Node, f.slots)
	send(f.t, c, []byte{ackOK})
	if got := d.wait(f.t); got.Err != nil {
		f.t.Fatal(got.Err)
	}
	return c
}

// none checks that the producer opened no further connection.
func (f *fakeConsumer) none() {
	f.t.Helper()
	select {
	case c := <-f.conns:
		c.Close()
		f.t.Fatal("the producer opened another connection")
	default:
	}
}

// readTransfer reads one transfer (with the preface if first) and
// returns its header and payload.
func readTransfer(t *testing.T, c net.Conn, first bool, node string, slots int) (header, []byte) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(waitBound))
	if first {
		got, err := readPreface(c)
		if err != nil || got != node {
			t.Fatalf("preface: node %q, %v; want %q", got, err, node)
		}
	}
	h, err := readHeader(c, slots, math.MaxInt32)
	if err != nil {
		t.Fatalf("header: %v", err)
	}
	payload := make([]byte, rdma.Sum(h.Lens))
	if _, err := io.ReadFull(c, payload); err != nil {
		t.Fatalf("payload: %v", err)
	}
	return h, payload
}

// producerRig is a registered producer with random slot contents.
func producerRig(t *testing.T, cfg Config, slots, slotBytes int) (*Transport, rdma.Region) {
	tr := newTransport(t, cfg)
	r := region(slots, slotBytes)
	rand.NewChaCha8([32]byte{3}).Read(r.Base)
	register(t, tr, r)
	return tr, r
}

func (tr *Transport) mustWrite(t *testing.T, tok rdma.Token, src, dst []int) *doneRec {
	t.Helper()
	d := newDone()
	if err := tr.Write("c", tok, src, dst, nil, d.done); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestProducerWireFormat reads what Write sends, byte for byte: the
// preface once, each header, the payload from the src slots in order;
// the second Write reuses the connection.
func TestProducerWireFormat(t *testing.T) {
	tr, r := producerRig(t, Config{}, rigSlots, rigSlotBytes)
	f := newFakeConsumer(t, tr, rigSlots, rigSlotBytes)
	var c net.Conn // the first Write's connection carries both
	for i, x := range []struct{ src, dst []int }{{[]int{3, 1}, []int{5, 6}}, {[]int{0, 15, 7}, []int{15, 0, 2}}} {
		tok := rdma.NewToken()
		d := tr.mustWrite(t, tok, x.src, x.dst)
		if i == 0 {
			c = f.accept()
		}
		h, payload := readTransfer(t, c, i == 0, tr.cfg.Node, rigSlots)
		if h.Token != tok || !equalInts(h.Lens, whole(len(x.dst), rigSlotBytes)) || !equalInts(h.Dst, x.dst) {
			t.Fatalf("header %+v, want token %s, %d bytes, dst %v", h, tok, rigSlotBytes, x.dst)
		}
		var want []byte
		for _, s := range x.src {
			want = append(want, r.Slot(s)...)
		}
		if !bytes.Equal(payload, want) {
			t.Fatal("payload differs from the src slots")
		}
		d.pending(t) // not before the ack
		send(t, c, []byte{ackOK})
		if got := d.wait(t); got.Err != nil || got.Token != tok || got.Peer != "c" || got.Bytes != int64(len(want)) {
			t.Fatalf("completion %+v", got)
		}
	}
	f.none()
	if s := tr.Stats(); s.WritesOK != 2 || s.BytesSent != 5*rigSlotBytes || s.PendingWrites != 0 {
		t.Fatalf("Stats %+v", s)
	}
}

func equalInts(a, b []int) bool { return bytes.Equal(intsBytes(a), intsBytes(b)) }

func intsBytes(a []int) []byte {
	var b []byte
	for _, x := range a {
		b = append(b, byte(x>>24), byte(x>>16), byte(x>>8), byte(x))
	}
	return b
}

// TestProducerAcks: a refusal or an unknown ack fails the Write with
// ErrProtocol and the connection is dropped; the next Write redials.
func TestProducerAcks(t *testing.T) {
	tr, _ := producerRig(t, Config{}, rigSlots, rigSlotBytes)
	f := newFakeConsumer(t, tr, rigSlots, rigSlotBytes)
	for _, code := range []byte{ackRefused, 0x7f} {
		d := tr.mustWrite(t, rdma.NewToken(), []int{0}, []int{0})
		c := f.accept()
		readTransfer(t, c, true, tr.cfg.Node, rigSlots)
		send(t, c, []byte{code})
		wantErr(t, "non-ok ack", d.wait(t).Err, rdma.ErrProtocol)
		waitClosed(t, c)
	}
	if s := tr.Stats(); s.WritesFailed != 2 || s.PendingWrites != 0 {
		t.Fatalf("Stats %+v", s)
	}
}

// bigPayload is larger than loopback socket buffers, so that a Write is
// still inside its writev when the test acts.
const bigSlots, bigSlotBytes = 256, 64 << 10

func allSlots(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestProducerConsumerDiesMidWrite: the consumer reads part of the
// payload and dies; the Write fails with ErrPeerGone, well within
// WriteTimeout.
func TestProducerConsumerDiesMidWrite(t *testing.T) {
	const timeout = 5 * time.Second
	tr, _ := producerRig(t, Config{WriteTimeout: timeout}, bigSlots, bigSlotBytes)
	f := newFakeConsumer(t, tr, bigSlots, bigSlotBytes)
	start := time.Now()
	d := tr.mustWrite(t, rdma.NewToken(), allSlots(bigSlots), allSlots(bigSlots))
	c := f.accept()
	c.SetReadDeadline(time.Now().Add(waitBound))
	if _, err := io.ReadFull(c, make([]byte, 100<<10)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	wantErr(t, "consumer died", d.wait(t).Err, rdma.ErrPeerGone)
	if el := time.Since(start); el >= timeout {
		t.Fatalf("failed after %v, not within WriteTimeout %v", el, timeout)
	}
}

// TestProducerWriteTimeout: a consumer that accepts and then neither
// reads nor acks fails the Write after WriteTimeout.
func TestProducerWriteTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	for _, size := range []int{1, bigSlots} { // stalls in the ack wait, then in the writev
		tr, _ := producerRig(t, Config{WriteTimeout: timeout}, bigSlots, bigSlotBytes)
		f := newFakeConsumer(t, tr, bigSlots, bigSlotBytes)
		start := time.Now()
		d := tr.mustWrite(t, rdma.NewToken(), allSlots(size), allSlots(size))
		f.accept()
		wantErr(t, "stalled consumer", d.wait(t).Err, rdma.ErrPeerGone, os.ErrDeadlineExceeded)
		if el := time.Since(start); el < timeout || el > timeout+waitBound/2 {
			t.Fatalf("%d slots: failed after %v, want about WriteTimeout %v", size, el, timeout)
		}
	}
}

// TestProducerAbortStalledWrite: Disconnect and Close fail a Write stuck
// in its writev, and the Writes queued behind it, at once — long before
// WriteTimeout.
func TestProducerAbortStalledWrite(t *testing.T) {
	eachAbort(t, "c", func(t *testing.T, tc abortCase) {
		tr, _ := producerRig(t, Config{WriteTimeout: time.Hour, MaxConnsPerPeer: 1}, bigSlots, bigSlotBytes)
		f := newFakeConsumer(t, tr, bigSlots, bigSlotBytes)
		d1 := tr.mustWrite(t, rdma.NewToken(), allSlots(bigSlots), allSlots(bigSlots))
		d2 := tr.mustWrite(t, rdma.NewToken(), []int{0}, []int{0}) // queued: one connection only
		f.accept()
		if s := tr.Stats(); s.PendingWrites != 2 {
			t.Fatalf("Stats %+v, want 2 pending writes", s)
		}
		tc.abort(tr)
		wantErr(t, "in flight", d1.wait(t).Err, tc.want)
		wantErr(t, "queued", d2.wait(t).Err, tc.want)
		if s := tr.Stats(); s.PendingWrites != 0 || s.WritesFailed != 2 {
			t.Fatalf("Stats %+v", s)
		}
	})
}

// TestProducerMaxConnsPerPeer: five concurrent Writes use at most
// MaxConnsPerPeer connections; later Writes reuse them.
func TestProducerMaxConnsPerPeer(t *testing.T) {
	tr, _ := producerRig(t, Config{MaxConnsPerPeer: 2}, rigSlots, rigSlotBytes)
	f := newFakeConsumer(t, tr, rigSlots, rigSlotBytes)
	var ds []*doneRec
	for i := range 5 {
		ds = append(ds, tr.mustWrite(t, rdma.NewToken(), []int{i}, []int{i}))
	}
	quit := make(chan struct{})
	served := make(chan struct{}, 2)
	for range 2 {
		c := f.accept()
		go func() { // acks every transfer on c, until the test ends
			defer func() { served <- struct{}{} }()
			for first := true; ; first = false {
				if first {
					if _, err := readPreface(c); err != nil {
						return
					}
				}
				h, err := readHeader(c, rigSlots, rigSlotBytes)
				if err != nil {
					return
				}
				if _, err := io.CopyN(io.Discard, c, rdma.Sum(h.Lens)); err != nil {
					return
				}
				select {
				case <-quit:
					return
				default:
				}
				c.Write([]byte{ackOK})
			}
		}()
	}
	for _, d := range ds { // a third connection would never be served: this would time out
		if got := d.wait(t); got.Err != nil {
			t.Fatal(got.Err)
		}
	}
	f.none()
	for i := range 3 {
		if got := tr.mustWrite(t, rdma.NewToken(), []int{i}, []int{i}).wait(t); got.Err != nil {
			t.Fatal(got.Err)
		}
	}
	f.none()
	close(quit)
	tr.Close() // ends the serving goroutines' reads
	<-served
	<-served
}

// TestProducerRedialsDeadIdleConn: the consumer closed an idle
// connection (as after a refusal or its Disconnect); the next Write
// probes it before sending and dials a fresh one: nothing is sent on the
// dead one.
func TestProducerRedialsDeadIdleConn(t *testing.T) {
	tr, _ := producerRig(t, Config{}, rigSlots, rigSlotBytes)
	tr.probeAfter = 0 // probe every reuse
	f := newFakeConsumer(t, tr, rigSlots, rigSlotBytes)
	c := f.firstWrite(tr)
	c.Close()
	tr.mu.Lock()
	idle := tr.peers["c"].idle
	tr.mu.Unlock()
	if len(idle) != 1 {
		t.Fatalf("%d idle connections, want 1", len(idle))
	}
	waitHangup(t, idle[0].Conn)
	d := tr.mustWrite(t, rdma.NewToken(), []int{1}, []int{1})
	c2 := f.accept()
	readTransfer(t, c2, true, tr.cfg.Node, rigSlots)
	send(t, c2, []byte{ackOK})
	if got := d.wait(t); got.Err != nil {
		t.Fatalf("Write after the consumer closed the idle connection: %v", got.Err)
	}
	if s := tr.Stats(); s.BytesSent != 2*rigSlotBytes {
		t.Fatalf("%d payload bytes sent for two 1-slot transfers: the dead connection was written", s.BytesSent)
	}
}

// waitHangup blocks until the peer's FIN has reached c (poll for
// POLLRDHUP): an event, not a delay.
func waitHangup(t *testing.T, c net.Conn) {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var perr error
	var n int
	rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		n, perr = unix.Poll(fds, int(waitBound/time.Millisecond))
	})
	if perr != nil || n != 1 {
		t.Fatalf("no hangup within %v: %v", waitBound, perr)
	}
}

// TestAlive checks the idle-connection probe on a live connection, one
// with a stray byte, and one the other side closed.
func TestAlive(t *testing.T) {
	a, b := testnet.Pair(t)
	if !alive(a) {
		t.Fatal("a fresh connection is not alive")
	}
	b.Write([]byte{1})
	rc, _ := a.(*net.TCPConn).SyscallConn()
	rc.Control(func(fd uintptr) {
		unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(waitBound/time.Millisecond))
	})
	if alive(a) {
		t.Fatal("a connection with a stray byte is alive")
	}
	a, b = testnet.Pair(t)
	b.Close()
	waitHangup(t, a)
	if alive(a) {
		t.Fatal("a connection closed by the peer is alive")
	}
}

// TestProducerDialFailure: an unreachable peer fails the Write with
// ErrPeerGone.
func TestProducerDialFailure(t *testing.T) {
	tr, _ := producerRig(t, Config{}, rigSlots, rigSlotBytes)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nobody listens there any more
	if err := tr.Connect("c", encodeMeta(peerMeta{Addr: addr, SlotBytes: rigSlotBytes, Slots: rigSlots})); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "dial refused", tr.mustWrite(t, rdma.NewToken(), []int{0}, []int{0}).wait(t).Err, rdma.ErrPeerGone)
}

// TestProducerChecksRemoteGeometry: the peer's advertised pool bounds
// dst, and a block longer than either side's slot is refused before
// anything is sent; a block that fits both goes to a peer whose slots are
// of another size.
func TestProducerChecksRemoteGeometry(t *testing.T) {
	tr, _ := producerRig(t, Config{}, rigSlots, rigSlotBytes)
	never := func(rdma.Completion) { t.Error("done called for a refused Write") }
	for _, x := range []struct {
		m    peerMeta
		lens []int
		want error
	}{
		{peerMeta{Addr: "127.0.0.1:9", SlotBytes: rigSlotBytes, Slots: 4}, nil, rdma.ErrBadSlot},
		{peerMeta{Addr: "127.0.0.1:9", SlotBytes: 512, Slots: rigSlots}, nil, rdma.ErrBadLength}, // whole slots of ours
		{peerMeta{Addr: "127.0.0.1:9", SlotBytes: 512, Slots: rigSlots}, []int{513}, rdma.ErrBadLength},
		{peerMeta{Addr: "127.0.0.1:9", SlotBytes: 4 * rigSlotBytes, Slots: rigSlots}, []int{rigSlotBytes + 1}, rdma.ErrBadLength},
		{peerMeta{Addr: "127.0.0.1:9", SlotBytes: 512, Slots: rigSlots}, []int{0}, rdma.ErrBadLength},
		{peerMeta{Addr: "127.0.0.1:9", SlotBytes: 512, Slots: rigSlots}, []int{100, 100}, rdma.ErrBadLength}, // one length per slot
	} {
		if err := tr.Connect("c", encodeMeta(x.m)); err != nil {
			t.Fatal(err)
		}
		err := tr.Write("c", rdma.NewToken(), []int{4}, []int{4}, x.lens, never)
		wantErr(t, "remote geometry", err, x.want)
	}
}

// TestProducerWritesBlocksOfSeveralLengths: each block's bytes come from
// the start of its src slot, in order, and the header carries its length;
// a peer with smaller slots takes the blocks that fit them.
func TestProducerWritesBlocksOfSeveralLengths(t *testing.T) {
	tr, r := producerRig(t, Config{}, rigSlots, rigSlotBytes)
	const theirs = rigSlotBytes / 2
	f := newFakeConsumer(t, tr, rigSlots, theirs)
	src, dst, lens := []int{9, 2, 4}, []int{1, 0, 7}, []int{theirs, 1, 300}
	tok := rdma.NewToken()
	d := newDone()
	if err := tr.Write("c", tok, src, dst, lens, d.done); err != nil {
		t.Fatal(err)
	}
	c := f.accept()
	h, payload := readTransfer(t, c, true, tr.cfg.Node, rigSlots)
	if h.Token != tok || !equalInts(h.Dst, dst) || !equalInts(h.Lens, lens) {
		t.Fatalf("header %+v, want token %s, dst %v, lengths %v", h, tok, dst, lens)
	}
	var want []byte
	for i, s := range src {
		want = append(want, r.Slot(s)[:lens[i]]...)
	}
	if !bytes.Equal(payload, want) {
		t.Fatal("payload is not the blocks' bytes in order")
	}
	send(t, c, []byte{ackOK})
	if got := d.wait(t); got.Err != nil || got.Bytes != rdma.Sum(lens) {
		t.Fatalf("completion %+v, want success of %d bytes", got, rdma.Sum(lens))
	}
}

// TestProducerRetriesBrokenReusedConn: the consumer closes an idle
// connection just as the next transfer arrives on it (the close crossed
// the transfer, so the liveness probe could not see it); the Write is
// retried once on a fresh connection and succeeds. A fresh connection
// that breaks is not retried (TestProducerConsumerDiesMidWrite).
func TestProducerRetriesBrokenReusedConn(t *testing.T) {
	tr, r := producerRig(t, Config{}, rigSlots, rigSlotBytes)
	f := newFakeConsumer(t, tr, rigSlots, rigSlotBytes)
	c1 := f.firstWrite(tr)
	tok := rdma.NewToken()
	d := tr.mustWrite(t, tok, []int{2}, []int{3})
	readTransfer(t, c1, false, tr.cfg.Node, rigSlots) // arrives on the idle connection...
	c1.Close()                                        // ...which the consumer closes without an ack
	c2 := f.accept()
	h, payload := readTransfer(t, c2, true, tr.cfg.Node, rigSlots)
	if h.Token != tok || !bytes.Equal(payload, r.Slot(2)) {
		t.Fatalf("retry carried %+v", h)
	}
	send(t, c2, []byte{ackOK})
	if got := d.wait(t); got.Err != nil {
		t.Fatalf("Write on a reused connection that broke: %v", got.Err)
	}
	f.none()
}

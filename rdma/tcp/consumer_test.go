package tcp

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/kvtier/kvtier/rdma"
)

const rigSlots, rigSlotBytes = 16, 1024

// consumerRig is a registered transport acting as consumer for raw
// producers "p" and "q": they are Connect'ed (with metadata nobody dials)
// so that their prefaces are accepted, and the test writes their bytes.
type consumerRig struct {
	t       *testing.T
	tr      *Transport
	r       rdma.Region
	rng     *rand.Rand
	refused chan error
	claimed chan rdma.Token
}

func newConsumerRig(t *testing.T, cfg Config) *consumerRig {
	g := &consumerRig{
		t: t, tr: newTransport(t, cfg), r: region(rigSlots, rigSlotBytes),
		rng:     rand.New(rand.NewPCG(7, 7)),
		refused: make(chan error, 64), claimed: make(chan rdma.Token, 64),
	}
	g.tr.hooks.refused = func(err error) { g.refused <- err }
	g.tr.hooks.claimed = func(tok rdma.Token) { g.claimed <- tok }
	register(t, g.tr, g.r)
	meta := encodeMeta(peerMeta{Addr: "127.0.0.1:9", SlotBytes: rigSlotBytes, Slots: rigSlots})
	for _, id := range []string{"p", "q"} {
		if err := g.tr.Connect(id, meta); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

// dial opens a raw producer connection to the consumer.
func (g *consumerRig) dial() net.Conn {
	g.t.Helper()
	m, err := decodeMeta(g.tr.Metadata())
	if err != nil {
		g.t.Fatal(err)
	}
	c, err := net.Dial("tcp", m.Addr)
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { c.Close() })
	return c
}

// expect registers an expectation from "p".
// partialTransfer expects a transfer of random data into dst under a new
// token, dials, and sends the transfer's header and the part of its
// payload that cut takes of the data; the connection stays open.
func (g *consumerRig) partialTransfer(dst []int, cut func(data [][]byte) [][]byte) (rdma.Token, *doneRec, [][]byte, net.Conn) {
	g.t.Helper()
	tok := rdma.NewToken()
	d := g.expect(tok, dst)
	data := randomSlots(g.rng, len(dst), rigSlotBytes)
	c := g.dial()
	send(g.t, c, append([][]byte{frame("p", tok, rigSlotBytes, dst)}, cut(data)...)...)
	return tok, d, data, c
}

func (g *consumerRig) expect(tok rdma.Token, dst []int) *doneRec {
	g.t.Helper()
	d := newDone()
	if err := g.tr.Expect("p", tok, dst, nil, d.done); err != nil {
		g.t.Fatal(err)
	}
	return d
}

// refusal waits for the consumer to refuse and checks the raw producer
// got the refusal ack and then the close.
func (g *consumerRig) refusal(c net.Conn) error {
	g.t.Helper()
	err := recv(g.t, g.refused, "refusal")
	wantErr(g.t, "refusal", err, rdma.ErrProtocol)
	if code := readAckWithin(g.t, c); code != ackRefused {
		g.t.Fatalf("ack %#x after a refusal, want %#x", code, ackRefused)
	}
	waitClosed(g.t, c)
	return err
}

// deliver sends a complete, correct transfer from "p" on a new
// connection and checks it lands.
func (g *consumerRig) deliver(tok rdma.Token, dst []int, d *doneRec) {
	g.t.Helper()
	data := randomSlots(g.rng, len(dst), rigSlotBytes)
	c := g.dial()
	send(g.t, c, frame("p", tok, rigSlotBytes, dst))
	send(g.t, c, data...)
	got := d.wait(g.t)
	if got.Err != nil || got.Token != tok || got.Peer != "p" || got.Bytes != int64(len(dst)*rigSlotBytes) {
		g.t.Fatalf("completion %+v, want success of %d bytes from p", got, len(dst)*rigSlotBytes)
	}
	if code := readAckWithin(g.t, c); code != ackOK {
		g.t.Fatalf("ack %#x, want ok", code)
	}
	for i, s := range dst {
		sameSlot(g.t, g.r, s, data[i])
	}
}

func TestConsumerRefusesBadPreface(t *testing.T) {
	tok := rdma.NewToken()
	hdr := frame("", tok, rigSlotBytes, []int{3})
	cases := map[string][]byte{
		"garbage":          []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		"version":          append([]byte{'K', 'V', 'T', 'D', 2, 1, 'p'}, hdr...),
		"empty node":       append([]byte{'K', 'V', 'T', 'D', 1, 0}, hdr...),
		"unconnected node": frame("zed", tok, rigSlotBytes, []int{3}),
		"truncated":        []byte{'K', 'V', 'T', 'D', 1, 5, 'p'},
	}
	g := newConsumerRig(t, Config{})
	d := g.expect(tok, []int{3})
	for name, b := range cases {
		c := g.dial()
		send(t, c, b)
		c.(*net.TCPConn).CloseWrite() // a truncated frame ends here
		t.Logf("%s: %v", name, g.refusal(c))
		d.pending(t)
	}
	if s := g.tr.Stats(); s.Refused != uint64(len(cases)) || s.PendingExpects != 1 {
		t.Fatalf("Stats %+v, want %d refused and the expectation intact", s, len(cases))
	}
	g.deliver(tok, []int{3}, d)
}

func TestConsumerRefusesBadHeader(t *testing.T) {
	tok := rdma.NewToken()
	dst := []int{3, 7, 5}
	overPool := frame("p", tok, rigSlotBytes, dst)
	binary.BigEndian.PutUint32(overPool[len(overPool)-12-8:], rigSlots+1) // count field
	cases := []struct {
		name string
		b    []byte
	}{
		{"count zero", frame("p", tok, rigSlotBytes, nil)},
		{"count over pool", overPool},
		{"slot bytes zero", frame("p", tok, 0, dst)},
		{"wrong slot bytes", frame("p", tok, 512, dst)},
		{"unknown token", frame("p", rdma.NewToken(), rigSlotBytes, dst)},
		{"wrong peer", frame("q", tok, rigSlotBytes, dst)},
		{"fewer slots", frame("p", tok, rigSlotBytes, dst[:2])},
		{"more slots", frame("p", tok, rigSlotBytes, append(slices.Clone(dst), 1))},
		{"reordered", frame("p", tok, rigSlotBytes, []int{7, 3, 5})},
		{"other slot", frame("p", tok, rigSlotBytes, []int{3, 7, 6})},
		{"slot outside pool", frame("p", tok, rigSlotBytes, []int{3, 7, rigSlots})},
		{"truncated slot list", frame("p", tok, rigSlotBytes, dst)[:prefaceFixed+1+headerFixed+10]},
	}
	g := newConsumerRig(t, Config{})
	d := g.expect(tok, dst)
	before := bytes.Clone(g.r.Base)
	for _, tc := range cases {
		c := g.dial()
		send(t, c, tc.b)
		c.(*net.TCPConn).CloseWrite()
		t.Logf("%s: %v", tc.name, g.refusal(c))
		d.pending(t)
	}
	if !bytes.Equal(before, g.r.Base) {
		t.Fatal("a refused header wrote the pool")
	}
	if s := g.tr.Stats(); s.Refused != uint64(len(cases)) || s.PendingExpects != 1 || s.BytesReceived != 0 {
		t.Fatalf("Stats %+v, want %d refused, nothing received, the expectation intact", s, len(cases))
	}
	g.deliver(tok, dst, d)
}

// TestConsumerSequentialOnOneConn: one preface, then transfers back to
// back on the same connection, each acked.
func TestConsumerSequentialOnOneConn(t *testing.T) {
	g := newConsumerRig(t, Config{})
	c := g.dial()
	for i := range 5 {
		tok, dst := rdma.NewToken(), []int{i, 15 - i}
		d := g.expect(tok, dst)
		node := ""
		if i == 0 {
			node = "p"
		}
		data := randomSlots(g.rng, 2, rigSlotBytes)
		send(t, c, frame(node, tok, rigSlotBytes, dst))
		send(t, c, data...)
		if got := d.wait(t); got.Err != nil {
			t.Fatalf("transfer %d: %v", i, got.Err)
		}
		if code := readAckWithin(t, c); code != ackOK {
			t.Fatalf("transfer %d: ack %#x", i, code)
		}
		sameSlot(t, g.r, dst[0], data[0])
		sameSlot(t, g.r, dst[1], data[1])
	}
}

// TestConsumerCancelMidPayload: a producer stalls inside the payload;
// Cancel ends the expectation with ErrCanceled, and once done has run the
// slots are never written again.
func TestConsumerCancelMidPayload(t *testing.T) {
	g := newConsumerRig(t, Config{})
	dst := []int{2, 9}
	tok, d, data, c := g.partialTransfer(dst, func(data [][]byte) [][]byte { return [][]byte{data[0][:rigSlotBytes/2]} })
	if got := recv(t, g.claimed, "claim"); got != tok {
		t.Fatalf("claimed %s, want %s", got, tok)
	}
	g.tr.Cancel(tok)
	got := d.wait(t)
	wantErr(t, "canceled mid-payload", got.Err, rdma.ErrCanceled)
	after := bytes.Clone(g.r.Base)
	c.Write(data[0][rigSlotBytes/2:]) // may fail: the consumer closed
	c.Write(data[1])
	waitClosed(t, c)
	if !bytes.Equal(after, g.r.Base) {
		t.Fatal("the pool changed after the canceled expectation's done")
	}
	if s := g.tr.Stats(); s.PendingExpects != 0 || s.ExpectsFailed != 1 || s.Refused != 0 {
		t.Fatalf("Stats %+v after a cancel mid-payload", s)
	}
	// The token is dead: the same transfer again is refused.
	c2 := g.dial()
	send(t, c2, frame("p", tok, rigSlotBytes, dst))
	g.refusal(c2)
	if d.calls.Load() != 1 {
		t.Fatalf("done called %d times", d.calls.Load())
	}
}

// TestConsumerProducerDiesMidPayload documents the rule: a transfer
// broken off inside its payload is refused and counted, and the
// expectation stays pending, intact, for a complete transfer (or its
// owner's Cancel or deadline); partial bytes are never reported done.
func TestConsumerProducerDiesMidPayload(t *testing.T) {
	g := newConsumerRig(t, Config{})
	dst := []int{4, 1}
	tok, d, _, c := g.partialTransfer(dst, func(data [][]byte) [][]byte { return [][]byte{data[0], data[1][:100]} })
	recv(t, g.claimed, "claim")
	c.Close()
	wantErr(t, "payload broken off", recv(t, g.refused, "refusal"), rdma.ErrProtocol)
	d.pending(t)
	if s := g.tr.Stats(); s.PendingExpects != 1 || s.Refused != 1 || s.BytesReceived != rigSlotBytes+100 {
		t.Fatalf("Stats %+v, want the expectation pending, 1 refused, %d bytes received", s, rigSlotBytes+100)
	}
	g.deliver(tok, dst, d)
}

// TestConsumerTokenBusy: while one connection is inside a token's
// payload, another connection sending the same token is refused, and the
// first completes.
func TestConsumerTokenBusy(t *testing.T) {
	g := newConsumerRig(t, Config{})
	tok, dst := rdma.NewToken(), []int{0}
	d := g.expect(tok, dst)
	data := randomSlots(g.rng, 1, rigSlotBytes)
	c1 := g.dial()
	send(t, c1, frame("p", tok, rigSlotBytes, dst), data[0][:10])
	recv(t, g.claimed, "claim")
	c2 := g.dial()
	send(t, c2, frame("p", tok, rigSlotBytes, dst))
	g.refusal(c2)
	send(t, c1, data[0][10:])
	if got := d.wait(t); got.Err != nil {
		t.Fatal(got.Err)
	}
	if code := readAckWithin(t, c1); code != ackOK {
		t.Fatalf("ack %#x", code)
	}
	sameSlot(t, g.r, 0, data[0])
}

// TestConsumerPrefaceTimeout: a connection that never speaks is refused
// after WriteTimeout instead of holding a reader forever.
func TestConsumerPrefaceTimeout(t *testing.T) {
	const timeout = 100 * time.Millisecond
	g := newConsumerRig(t, Config{WriteTimeout: timeout})
	start := time.Now()
	c := g.dial()
	g.refusal(c)
	if el := time.Since(start); el < timeout {
		t.Fatalf("silent connection refused after %v, before WriteTimeout %v", el, timeout)
	}
}

// abortCase is a way to end a transport's work at once, and the error
// that work must end with.
type abortCase struct {
	name  string
	abort func(*Transport)
	want  error
}

// eachAbort runs test once per abortCase: Disconnect(peer), then Close.
func eachAbort(t *testing.T, peer string, test func(t *testing.T, tc abortCase)) {
	for _, tc := range []abortCase{
		{"Disconnect", func(tr *Transport) { tr.Disconnect(peer) }, rdma.ErrPeerGone},
		{"Close", func(tr *Transport) { tr.Close() }, rdma.ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) { test(t, tc) })
	}
}

// TestConsumerAbortMidPayload: Disconnect and Close end a claimed
// expectation through its reader, with their own errors.
func TestConsumerAbortMidPayload(t *testing.T) {
	eachAbort(t, "p", func(t *testing.T, tc abortCase) {
		g := newConsumerRig(t, Config{})
		tok, dst := rdma.NewToken(), []int{5}
		d := g.expect(tok, dst)
		c := g.dial()
		send(t, c, frame("p", tok, rigSlotBytes, dst), make([]byte, 10))
		recv(t, g.claimed, "claim")
		tc.abort(g.tr)
		wantErr(t, tc.name, d.wait(t).Err, tc.want)
		waitClosed(t, c)
		if s := g.tr.Stats(); s.PendingExpects != 0 || s.Refused != 0 {
			t.Fatalf("Stats %+v", s)
		}
	})
}

// TestConsumerDisconnectClosesIdleConn: Disconnect closes the peer's
// idle inbound connections too, and refuses it afterwards.
func TestConsumerDisconnectClosesIdleConn(t *testing.T) {
	g := newConsumerRig(t, Config{})
	tok := rdma.NewToken()
	d := g.expect(tok, []int{1})
	c := g.dial()
	send(t, c, frame("p", tok, rigSlotBytes, []int{1}), make([]byte, rigSlotBytes))
	d.wait(t)
	readAckWithin(t, c)
	g.tr.Disconnect("p")
	waitClosed(t, c)
	if err := g.tr.Expect("p", rdma.NewToken(), []int{1}, nil, newDone().done); !errorsIs(err, rdma.ErrPeerUnknown) {
		t.Fatalf("Expect from a disconnected peer: %v, want ErrPeerUnknown", err)
	}
	c2 := g.dial()
	send(t, c2, frame("p", tok, rigSlotBytes, []int{1}))
	g.refusal(c2)
}

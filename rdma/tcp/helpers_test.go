package tcp

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvtier/kvtier/rdma"
)

// waitBound bounds every wait in these tests: a deadline that fails the
// test, never a delay that orders anything.
const waitBound = 10 * time.Second

// doneRec records one done callback.
type doneRec struct {
	ch    chan rdma.Completion
	calls atomic.Int32
}

func newDone() *doneRec { return &doneRec{ch: make(chan rdma.Completion, 4)} }

func (d *doneRec) done(c rdma.Completion) {
	d.calls.Add(1)
	d.ch <- c
}

// wait returns the completion, failing the test if none comes in time.
func (d *doneRec) wait(t testing.TB) rdma.Completion {
	t.Helper()
	select {
	case c := <-d.ch:
		return c
	case <-time.After(waitBound):
		t.Fatalf("no completion within %v", waitBound)
		return rdma.Completion{}
	}
}

// pending checks that done has not run (yet).
func (d *doneRec) pending(t testing.TB) {
	t.Helper()
	if n := d.calls.Load(); n != 0 {
		t.Fatalf("done called %d times, want still pending", n)
	}
}

// recv waits for one value from ch.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitBound):
		t.Fatalf("no %s within %v", what, waitBound)
		var zero T
		return zero
	}
}

// wantErr checks err wraps every one of want.
func wantErr(t testing.TB, what string, err error, want ...error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want %v", what, want)
	}
	for _, w := range want {
		if !errors.Is(err, w) {
			t.Fatalf("%s: %v, want it to wrap %v", what, err, w)
		}
	}
}

// randomSlots returns n slots of random bytes.
func randomSlots(rng *rand.Rand, n, slotBytes int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = make([]byte, slotBytes)
		for j := range out[i] {
			out[i][j] = byte(rng.Uint32())
		}
	}
	return out
}

// frame is a preface (when node is not empty) followed by a header of
// whole slots of slotBytes.
func frame(node string, tok rdma.Token, slotBytes int, dst []int) []byte {
	return frameLens(node, tok, dst, whole(len(dst), slotBytes))
}

// frameLens is frame with a length per block.
func frameLens(node string, tok rdma.Token, dst, lens []int) []byte {
	var b []byte
	if node != "" {
		b = appendPreface(b, node)
	}
	return appendHeader(b, tok, dst, lens)
}

// whole is n lengths of slotBytes: whole slots.
func whole(n, slotBytes int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = slotBytes
	}
	return out
}

// send writes raw bytes or fails the test.
func send(t testing.TB, c net.Conn, parts ...[]byte) {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(waitBound))
	for _, p := range parts {
		if _, err := c.Write(p); err != nil {
			t.Fatalf("raw write: %v", err)
		}
	}
}

// readAckWithin reads one ack byte within waitBound.
func readAckWithin(t testing.TB, c net.Conn) byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(waitBound))
	code, err := readAck(c)
	if err != nil {
		t.Fatalf("reading ack: %v", err)
	}
	return code
}

// waitClosed reads until the other side has closed c (EOF or reset),
// discarding whatever is still queued; the test fails on a timeout.
func waitClosed(t testing.TB, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(waitBound))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after %v", waitBound)
	}
}

// sameSlot checks one slot's bytes.
func sameSlot(t testing.TB, r rdma.Region, slot int, want []byte) {
	t.Helper()
	if !bytes.Equal(r.Slot(slot), want) {
		t.Fatalf("slot %d does not hold the expected bytes", slot)
	}
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }

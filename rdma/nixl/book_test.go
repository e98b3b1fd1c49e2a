package nixl

import (
	"errors"
	"testing"
	"time"

	"github.com/kvtier/kvtier/rdma"
)

// The book is tested with no NIXL and no goroutines: messages in,
// completions out.

type got struct{ cs []rdma.Completion }

func (g *got) done(c rdma.Completion) { g.cs = append(g.cs, c) }

func run(cs []completion) {
	for _, c := range cs {
		c.done(c.c)
	}
}

func note(tok rdma.Token, dst []int) []byte {
	return encodeNotif(notif{Token: tok, Count: len(dst), Digest: slotDigest(dst)})
}

var t0 = time.Unix(1000, 0)

// bookOfP is a book of 100-byte slots, 8 in flight, with the given grace,
// connected to producer P (agent "agent-p"), and a recorder of completions.
func bookOfP(grace time.Duration) (*book, *got) {
	b := newBook(100, 8, grace)
	b.connect("P", "agent-p")
	return b, &got{}
}

func TestBookNotificationCompletesOnce(t *testing.T) {
	b, g := bookOfP(time.Second)
	tok := rdma.NewToken()
	if err := b.expect("P", tok, []int{3, 1}, nil, g.done); err != nil {
		t.Fatal(err)
	}
	run(b.notified("agent-p", note(tok, []int{3, 1})))
	run(b.notified("agent-p", note(tok, []int{3, 1}))) // duplicate: refused
	if len(g.cs) != 1 || g.cs[0].Err != nil || g.cs[0].Bytes != 200 || g.cs[0].Peer != "P" || g.cs[0].Token != tok {
		t.Fatalf("completions %+v", g.cs)
	}
	if b.pending() != 0 || b.okCount != 1 || b.bytesIn != 200 || b.refused != 1 {
		t.Fatalf("book after: pending %d ok %d bytes %d refused %d", b.pending(), b.okCount, b.bytesIn, b.refused)
	}
}

func TestBookRefusesAndKeepsTheExpectation(t *testing.T) {
	b, g := bookOfP(time.Second)
	b.connect("Q", "agent-q")
	tok := rdma.NewToken()
	if err := b.expect("P", tok, []int{3, 1}, nil, g.done); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		agent string
		msg   []byte
	}{
		"other peer":    {"agent-q", note(tok, []int{3, 1})},
		"unknown agent": {"agent-x", note(tok, []int{3, 1})},
		"other order":   {"agent-p", note(tok, []int{1, 3})},
		"fewer slots":   {"agent-p", note(tok, []int{3})},
		"other token":   {"agent-p", note(rdma.NewToken(), []int{3, 1})},
		"malformed":     {"agent-p", []byte("junk")},
		"empty":         {"agent-p", nil},
	} {
		run(b.notified(c.agent, c.msg))
		if len(g.cs) != 0 || b.pending() != 1 {
			t.Fatalf("%s: completed %+v", name, g.cs)
		}
	}
	if b.refused != 7 {
		t.Fatalf("refused %d, want 7", b.refused)
	}
	run(b.notified("agent-p", note(tok, []int{3, 1})))
	if len(g.cs) != 1 || g.cs[0].Err != nil {
		t.Fatalf("real notification: %+v", g.cs)
	}
}

func TestBookExpectValidation(t *testing.T) {
	b := newBook(100, 4, time.Second)
	tok := rdma.NewToken()
	nop := func(rdma.Completion) {}
	for _, dst := range [][]int{{4}, {-1}, {}, {0, 9}} {
		if err := b.expect("P", tok, dst, nil, nop); !errors.Is(err, rdma.ErrBadSlot) {
			t.Errorf("expect %v: %v", dst, err)
		}
	}
	if err := b.expect("P", tok, []int{0}, nil, nil); err == nil {
		t.Error("nil done accepted")
	}
	if err := b.expect("P", tok, []int{0}, nil, nop); err != nil {
		t.Fatal(err)
	}
	if err := b.expect("P", tok, []int{1}, nil, nop); !errors.Is(err, rdma.ErrDuplicateToken) {
		t.Fatalf("duplicate: %v", err)
	}
}

// A canceled expectation keeps its slots until the producer's notification
// (the late write landed) or the grace; never both, never twice.
func TestBookCancelHoldsSlotsUntilNotificationOrGrace(t *testing.T) {
	b, g := bookOfP(time.Second)
	tok1, tok2 := rdma.NewToken(), rdma.NewToken()
	b.expect("P", tok1, []int{1}, nil, g.done)
	b.expect("P", tok2, []int{2}, nil, g.done)
	run(b.cancel(tok1, t0))
	run(b.cancel(tok2, t0))
	run(b.cancel(tok2, t0.Add(900*time.Millisecond))) // second cancel: no new deadline
	if len(g.cs) != 0 || b.pending() != 2 {
		t.Fatalf("released before it was safe: %+v", g.cs)
	}
	run(b.notified("agent-p", note(tok1, []int{1}))) // tok1's late write landed
	if len(g.cs) != 1 || !errors.Is(g.cs[0].Err, rdma.ErrCanceled) || g.cs[0].Token != tok1 {
		t.Fatalf("after tok1's notification: %+v", g.cs)
	}
	run(b.expire(t0.Add(999 * time.Millisecond)))
	if len(g.cs) != 1 {
		t.Fatalf("released before the grace: %+v", g.cs)
	}
	run(b.expire(t0.Add(time.Second)))
	if len(g.cs) != 2 || !errors.Is(g.cs[1].Err, rdma.ErrCanceled) || g.cs[1].Token != tok2 {
		t.Fatalf("after the grace: %+v", g.cs)
	}
	run(b.notified("agent-p", note(tok2, []int{2}))) // too late: refused, no second done
	run(b.expire(t0.Add(time.Hour)))
	if len(g.cs) != 2 || b.pending() != 0 || b.failed != 2 {
		t.Fatalf("end: %+v pending %d failed %d", g.cs, b.pending(), b.failed)
	}
}

func TestBookNoGraceReleasesAtOnce(t *testing.T) {
	b := newBook(100, 8, 0)
	var g got
	tok := rdma.NewToken()
	b.expect("P", tok, []int{1}, nil, g.done)
	run(b.cancel(tok, t0))
	if len(g.cs) != 1 || !errors.Is(g.cs[0].Err, rdma.ErrCanceled) {
		t.Fatalf("%+v", g.cs)
	}
}

func TestBookDisconnectAndReconnect(t *testing.T) {
	b := newBook(100, 8, time.Second)
	b.connect("P", "agent-p1")
	var g got
	old, other := rdma.NewToken(), rdma.NewToken()
	b.expect("P", old, []int{1}, nil, g.done)
	b.expect("Q", other, []int{2}, nil, g.done)
	run(b.disconnect("P", t0))
	b.connect("P", "agent-p2") // a new incarnation
	fresh := rdma.NewToken()
	b.expect("P", fresh, []int{3}, nil, g.done)
	// The old incarnation's late write still releases its expectation...
	run(b.notified("agent-p1", note(old, []int{1})))
	if len(g.cs) != 1 || !errors.Is(g.cs[0].Err, rdma.ErrPeerGone) {
		t.Fatalf("old expectation: %+v", g.cs)
	}
	run(b.notified("agent-p2", note(fresh, []int{3})))
	if len(g.cs) != 2 || g.cs[1].Err != nil {
		t.Fatalf("new incarnation: %+v", g.cs)
	}
	// Once nothing of P waits, its retired agent is forgotten: a late
	// notification from it is refused.
	if _, ok := b.agentOf["agent-p1"]; ok {
		t.Fatal("retired agent still known")
	}
	tok := rdma.NewToken()
	b.expect("P", tok, []int{4}, nil, g.done)
	run(b.notified("agent-p1", note(tok, []int{4})))
	if len(g.cs) != 2 || b.pending() != 2 {
		t.Fatalf("a forgotten agent completed an expectation: %+v", g.cs)
	}
	run(b.disconnect("P", t0)) // releasing, held by the grace; closeAll ends it
	run(b.closeAll(rdma.ErrClosed))
	if len(g.cs) != 4 || !errors.Is(g.cs[2].Err, rdma.ErrClosed) || !errors.Is(g.cs[3].Err, rdma.ErrClosed) || b.pending() != 0 {
		t.Fatalf("close: %+v", g.cs)
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{}.withDefaults()
	if c.Name != "kvtier" || c.Backend != "UCX" || c.WriteTimeout != DefaultWriteTimeout || c.LateWriteGrace != DefaultLateWriteGrace ||
		c.PollMin != DefaultPollMin || c.PollMax != DefaultPollMax || c.SpinRounds != DefaultSpinRounds {
		t.Fatalf("defaults: %+v", c)
	}
	if c.LateWriteGrace <= c.WriteTimeout {
		t.Fatal("the default grace must outlast the default write timeout")
	}
	c = Config{LateWriteGrace: -1, SpinRounds: -1, PollMin: time.Millisecond, PollMax: time.Microsecond}.withDefaults()
	if c.LateWriteGrace != 0 || c.SpinRounds != 0 || c.PollMax != c.PollMin {
		t.Fatalf("explicit: %+v", c)
	}
	env := func(v string) func(string) string { return func(string) string { return v } }
	if p := (Config{Library: "/x.so"}).libraryPath(env("/y.so")); p != "/x.so" {
		t.Fatal(p)
	}
	if p := (Config{}).libraryPath(env("/y.so")); p != "/y.so" {
		t.Fatal(p)
	}
	if p := (Config{}).libraryPath(env("")); p != DefaultLibrary {
		t.Fatal(p)
	}
}

// Blocks shorter than their slots: the whole slots move (one-sided, fixed
// registrations), the completion counts the blocks' bytes, and a length
// outside a slot is refused up front.
func TestBookCountsBlockLengths(t *testing.T) {
	b, g := bookOfP(time.Second)
	tok := rdma.NewToken()
	if err := b.expect("P", tok, []int{3, 1}, []int{40, 100}, g.done); err != nil {
		t.Fatal(err)
	}
	run(b.notified("agent-p", note(tok, []int{3, 1})))
	if len(g.cs) != 1 || g.cs[0].Err != nil || g.cs[0].Bytes != 140 || b.bytesIn != 140 {
		t.Fatalf("completions %+v, bytes in %d; want one of 140 bytes", g.cs, b.bytesIn)
	}
	for _, lens := range [][]int{{0, 1}, {101, 1}, {1}} {
		if err := b.expect("P", rdma.NewToken(), []int{4, 5}, lens, g.done); !errors.Is(err, rdma.ErrBadLength) {
			t.Errorf("lengths %v: %v, want ErrBadLength", lens, err)
		}
	}
}

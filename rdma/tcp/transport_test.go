package tcp

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/rdma"
)

func TestNewConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no node":          {},
		"long node":        {Node: strings.Repeat("n", maxNodeID+1)},
		"negative timeout": {Node: "n", WriteTimeout: -time.Second},
		"negative conns":   {Node: "n", MaxConnsPerPeer: -1},
		"bad advertise":    {Node: "n", Advertise: "no-port"},
	} {
		if _, err := New(cfg); !errors.Is(err, messages.ErrBadConfig) {
			t.Errorf("%s: %v, want ErrBadConfig", name, err)
		}
	}
	tr, err := New(Config{Node: "n"})
	if err != nil {
		t.Fatal(err)
	}
	if c := tr.cfg; c.Listen != DefaultListen || c.WriteTimeout != DefaultWriteTimeout || c.MaxConnsPerPeer != DefaultMaxConnsPerPeer {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if tr.Kind() != "tcp" {
		t.Fatalf("Kind %q", tr.Kind())
	}
	tr.Close() // never registered: nothing to wait for
}

// TestBeforeRegister: every call but Kind, Stats and Close needs the pool.
func TestBeforeRegister(t *testing.T) {
	tr := newTransport(t, Config{})
	if m := tr.Metadata(); m != nil {
		t.Fatalf("Metadata before Register: %x", m)
	}
	meta := encodeMeta(peerMeta{Addr: "127.0.0.1:9", SlotBytes: 1, Slots: 1})
	never := func(rdma.Completion) { t.Error("done called for a refused call") }
	for name, err := range map[string]error{
		"Connect": tr.Connect("p", meta),
		"Expect":  tr.Expect("p", rdma.NewToken(), []int{0}, nil, never),
		"Write":   tr.Write("p", rdma.NewToken(), []int{0}, []int{0}, nil, never),
	} {
		if !errors.Is(err, rdma.ErrNotRegistered) {
			t.Errorf("%s before Register: %v, want ErrNotRegistered", name, err)
		}
	}
	tr.Cancel(rdma.NewToken())
	tr.Disconnect("p")
}

func TestRegister(t *testing.T) {
	tr := newTransport(t, Config{Advertise: "node-7.example:7000"})
	for name, r := range map[string]rdma.Region{
		"no slots":   {Base: make([]byte, 8), SlotBytes: 8},
		"no bytes":   {Base: make([]byte, 8), Slots: 1},
		"short base": {Base: make([]byte, 15), SlotBytes: 8, Slots: 2},
	} {
		if err := tr.Register(r); err == nil {
			t.Errorf("Register(%s) accepted", name)
		}
	}
	register(t, tr, region(4, 8))
	if err := tr.Register(region(4, 8)); err == nil {
		t.Fatal("second Register accepted")
	}
	m, err := decodeMeta(tr.Metadata())
	if err != nil || m != (peerMeta{Addr: "node-7.example:7000", SlotBytes: 8, Slots: 4}) {
		t.Fatalf("Metadata %+v, %v: want the advertised address and the geometry", m, err)
	}
	if err := tr.Connect("", tr.Metadata()); err == nil {
		t.Fatal("Connect with an empty peer id accepted")
	}
	if err := tr.Connect("p", []byte("junk")); !errors.Is(err, errMeta) {
		t.Fatalf("Connect with junk metadata: %v", err)
	}
	never := func(rdma.Completion) { t.Error("done called for a refused call") }
	if err := tr.Expect("nobody", rdma.NewToken(), []int{0}, nil, never); !errors.Is(err, rdma.ErrPeerUnknown) {
		t.Fatalf("Expect from an unconnected peer: %v, want ErrPeerUnknown", err)
	}
	if err := tr.Expect("nobody", rdma.NewToken(), []int{0}, nil, nil); err == nil {
		t.Fatal("Expect with a nil done accepted")
	}
	tr.Close()
	if err := tr.Register(region(4, 8)); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("Register after Close: %v, want ErrClosed", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestIdleGoroutines: once transfers are over, every goroutine of a
// transport is parked in network I/O (the accept loop, one reader per
// inbound connection) — none waits on a timer, a channel or a select,
// so an idle transport makes no wakeups. Outbound idle connections have
// no goroutine at all.
func TestIdleGoroutines(t *testing.T) {
	a, b := newTransport(t, Config{}), newTransport(t, Config{})
	ra, rb := region(8, 4096), region(8, 4096)
	register(t, a, ra)
	register(t, b, rb)
	connect(t, a, b)
	for i := range 4 {
		for _, pr := range [][2]*Transport{{a, b}, {b, a}} {
			tok, we, ww := rdma.NewToken(), newDone(), newDone()
			if err := pr[1].Expect(pr[0].cfg.Node, tok, []int{i}, nil, we.done); err != nil {
				t.Fatal(err)
			}
			if err := pr[0].Write(pr[1].cfg.Node, tok, []int{i}, []int{i}, nil, ww.done); err != nil {
				t.Fatal(err)
			}
			if we.wait(t).Err != nil || ww.wait(t).Err != nil {
				t.Fatal("transfer failed")
			}
		}
	}
	ioWait := 0
	for _, g := range transportGoroutines() {
		state := g[strings.Index(g, "[")+1 : strings.Index(g, "]")]
		switch {
		case strings.HasPrefix(state, "IO wait"):
			ioWait++
		case strings.HasPrefix(state, "select"), strings.HasPrefix(state, "sleep"),
			strings.HasPrefix(state, "chan "), strings.HasPrefix(state, "sync.Cond"):
			t.Errorf("idle transport goroutine parked in %q:\n%s", state, g)
		}
	}
	// At most: two accept loops and one reader per inbound connection
	// (one each way, reused by every transfer).
	if ioWait < 2 || ioWait > 4 {
		t.Errorf("%d transport goroutines in IO wait, want 2..4", ioWait)
	}
}

// transportGoroutines returns the stacks of goroutines running this
// package's Transport code (test goroutines excluded).
func transportGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "rdma/tcp.(*Transport).") && !strings.Contains(g, "testing.tRunner(") {
			out = append(out, g)
		}
	}
	return out
}

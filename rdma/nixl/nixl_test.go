//go:build nixl && cgo

package nixl

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/rdma"
)

// ---- tests that need no NIXL: the library is missing or wrong ----

func TestNewMissingLibraryIsUnavailable(t *testing.T) {
	_, err := New(Config{Library: "/nonexistent/dir/libnixl_capi.so"})
	if !errors.Is(err, rdma.ErrUnavailable) {
		t.Fatalf("New with a missing library: %v, want ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "No such file") {
		t.Fatalf("error %q does not carry dlerror's reason", err)
	}
}

func TestNewNotALibraryIsUnavailable(t *testing.T) {
	p := filepath.Join(t.TempDir(), "libnixl_capi.so")
	if err := os.WriteFile(p, []byte("not an ELF file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{Library: p})
	if !errors.Is(err, rdma.ErrUnavailable) {
		t.Fatalf("New with a text file: %v, want ErrUnavailable", err)
	}
}

func TestNewWrongLibraryIsUnavailable(t *testing.T) {
	// libc loads fine but has none of NIXL's symbols.
	_, err := New(Config{Library: "libc.so.6"})
	if !errors.Is(err, rdma.ErrUnavailable) || !strings.Contains(err.Error(), "missing symbol nixl_capi_is_stub") {
		t.Fatalf("New with libc: %v, want ErrUnavailable naming the missing symbol", err)
	}
}

func TestLibraryFromEnvironment(t *testing.T) {
	old := getenv
	t.Cleanup(func() { getenv = old })
	getenv = func(k string) string {
		if k == EnvLibrary {
			return "/nonexistent/from-env/libnixl_capi.so"
		}
		return ""
	}
	_, err := New(Config{})
	if !errors.Is(err, rdma.ErrUnavailable) || !strings.Contains(err.Error(), "/nonexistent/from-env/") {
		t.Fatalf("New with $%s set: %v", EnvLibrary, err)
	}
}

// ---- tests against the real library ----

// needLibrary skips unless $KVTIER_NIXL_LIB names a NIXL C API that starts
// an agent with its UCX backend here (scripts/nixl.sh sets it up).
func needLibrary(tb testing.TB) Config {
	tb.Helper()
	lib := os.Getenv(EnvLibrary)
	if lib == "" {
		tb.Skipf("NIXL not available: $%s is not set (scripts/nixl.sh installs the nixl-cu12 wheel and sets it)", EnvLibrary)
	}
	if os.Getenv("UCX_TLS") == "" {
		os.Setenv("UCX_TLS", "tcp") // NB: before the first agent: UCX reads it when its context starts
	}
	cfg := Config{Library: lib, LateWriteGrace: 200 * time.Millisecond, WriteTimeout: 5 * time.Second}
	if _, err := Probe(cfg); err != nil {
		tb.Skipf("NIXL not available: %v", err)
	}
	return cfg
}

// pool is an mmap'd region (like the CPU pool), unmapped at cleanup.
func pool(tb testing.TB, slots, slotBytes int) rdma.Region {
	tb.Helper()
	b, err := unix.Mmap(-1, 0, slots*slotBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Munmap(b) })
	return rdma.Region{Base: b, SlotBytes: slotBytes, Slots: slots}
}

type pair struct {
	a, b   rdma.Transport // a writes into b
	ra, rb rdma.Region
}

// newPair starts two registered, mutually connected transports: "A" and "B".
func newPair(tb testing.TB, cfg Config, slots, slotBytes int) *pair {
	tb.Helper()
	p := &pair{ra: pool(tb, slots, slotBytes), rb: pool(tb, slots, slotBytes)}
	var err error
	ca, cb := cfg, cfg
	ca.Name, cb.Name = "A", "B"
	if p.a, err = New(ca); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.a.Close() })
	if p.b, err = New(cb); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.b.Close() })
	must(tb, p.a.Register(p.ra))
	must(tb, p.b.Register(p.rb))
	must(tb, p.a.Connect("B", p.b.Metadata()))
	must(tb, p.b.Connect("A", p.a.Metadata()))
	return p
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

func fill(r rdma.Region, slot int, seed byte) {
	s := r.Slot(slot)
	for i := range s {
		s[i] = seed + byte(i*7)
	}
}

// waitDone waits for one completion on ch.
func waitDone(tb testing.TB, ch <-chan rdma.Completion, what string) rdma.Completion {
	tb.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(20 * time.Second):
		tb.Fatalf("%s: no completion after 20s", what)
	}
	return rdma.Completion{}
}

func doneTo(ch chan<- rdma.Completion) func(rdma.Completion) {
	return func(c rdma.Completion) { ch <- c }
}

func TestWriteMovesEveryByte(t *testing.T) {
	cfg := needLibrary(t)
	p := newPair(t, cfg, 64, 64<<10)
	src, dst := []int{3, 4, 5, 9, 0}, []int{10, 11, 12, 40, 63}
	for i, s := range src {
		fill(p.ra, s, byte(i+1))
	}
	tok := rdma.NewToken()
	exp, wr := make(chan rdma.Completion, 1), make(chan rdma.Completion, 1)
	must(t, p.b.Expect("A", tok, dst, nil, doneTo(exp)))
	must(t, p.a.Write("B", tok, src, dst, nil, doneTo(wr)))
	if c := waitDone(t, wr, "write"); c.Err != nil || c.Bytes != int64(len(src)*p.ra.SlotBytes) || c.Token != tok || c.Peer != "B" {
		t.Fatalf("write completion %+v", c)
	}
	if c := waitDone(t, exp, "expect"); c.Err != nil || c.Bytes != int64(len(dst)*p.rb.SlotBytes) || c.Peer != "A" {
		t.Fatalf("expect completion %+v", c)
	}
	for i := range src {
		if !bytes.Equal(p.ra.Slot(src[i]), p.rb.Slot(dst[i])) {
			t.Fatalf("slot %d -> %d differs", src[i], dst[i])
		}
	}
	if bytes.Equal(p.rb.Slot(1), p.ra.Slot(3)) {
		t.Fatal("a slot that was not a destination was written")
	}
	sa, sb := p.a.Stats(), p.b.Stats()
	if sa.WritesOK != 1 || sa.BytesSent != uint64(len(src)*p.ra.SlotBytes) || sb.ExpectsOK != 1 || sb.BytesReceived != sa.BytesSent || sb.PendingExpects != 0 || sa.PendingWrites != 0 {
		t.Fatalf("stats A %+v B %+v", sa, sb)
	}
}

func TestManyConcurrentTransfersBothWays(t *testing.T) {
	cfg := needLibrary(t)
	p := newPair(t, cfg, 128, 16<<10)
	const n = 32
	var wg sync.WaitGroup
	errs := make(chan error, 4*n)
	for i := range n {
		for dir := range 2 {
			from, to, rf, rt, toName, fromName := p.a, p.b, p.ra, p.rb, "B", "A"
			if dir == 1 {
				from, to, rf, rt, toName, fromName = p.b, p.a, p.rb, p.ra, "A", "B"
			}
			src, dst := []int{i, i + 32}, []int{64 + 2*i, 64 + 2*i + 1} // sources below 64, destinations above: no overlap between directions
			fill(rf, src[0], byte(i))
			fill(rf, src[1], byte(i+100))
			tok := rdma.NewToken()
			wg.Add(2)
			check := func(c rdma.Completion) {
				defer wg.Done()
				if c.Err != nil {
					errs <- c.Err
				}
			}
			must(t, to.Expect(fromName, tok, dst, nil, func(c rdma.Completion) {
				if c.Err == nil && (!bytes.Equal(rt.Slot(dst[0]), rf.Slot(src[0])) || !bytes.Equal(rt.Slot(dst[1]), rf.Slot(src[1]))) {
					c.Err = errors.New("bytes differ after expect completed")
				}
				check(c)
			}))
			must(t, from.Write(toName, tok, src, dst, nil, check))
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestWrongSlotsNotificationIsRefusedAndExpectationKept(t *testing.T) {
	cfg := needLibrary(t)
	p := newPair(t, cfg, 16, 4<<10)
	tok := rdma.NewToken()
	exp := make(chan rdma.Completion, 1)
	must(t, p.b.Expect("A", tok, []int{1, 2}, nil, doneTo(exp)))
	wr := make(chan rdma.Completion, 2)
	must(t, p.a.Write("B", tok, []int{0, 1}, []int{2, 1}, nil, doneTo(wr))) // other slots
	if c := waitDone(t, wr, "wrong write"); c.Err != nil {
		t.Fatalf("the write itself completes: %v", c.Err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.b.Stats().Refused == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if p.b.Stats().Refused != 1 {
		t.Fatalf("refused = %d, want 1", p.b.Stats().Refused)
	}
	select {
	case c := <-exp:
		t.Fatalf("expectation completed by a wrong notification: %+v", c)
	default:
	}
	must(t, p.a.Write("B", tok, []int{5, 6}, []int{1, 2}, nil, doneTo(wr))) // the real one
	if c := waitDone(t, exp, "expect"); c.Err != nil {
		t.Fatalf("expect: %v", c.Err)
	}
}

func TestCancelWaitsForTheLateWriteOrTheGrace(t *testing.T) {
	cfg := needLibrary(t)
	cfg.LateWriteGrace = time.Hour // only the notification can release it
	p := newPair(t, cfg, 8, 4<<10)
	tok := rdma.NewToken()
	exp := make(chan rdma.Completion, 1)
	must(t, p.b.Expect("A", tok, []int{1}, nil, doneTo(exp)))
	p.b.Cancel(tok)
	select {
	case c := <-exp:
		t.Fatalf("cancel completed before the producer's write could be ruled out: %+v", c)
	case <-time.After(100 * time.Millisecond):
	}
	wr := make(chan rdma.Completion, 1)
	must(t, p.a.Write("B", tok, []int{0}, []int{1}, nil, doneTo(wr)))
	if c := waitDone(t, exp, "canceled expect"); !errors.Is(c.Err, rdma.ErrCanceled) {
		t.Fatalf("canceled expect: %+v", c)
	}

	// With a short grace and no write, the cancel completes after the grace.
	cfg.LateWriteGrace = 100 * time.Millisecond
	q := newPair(t, cfg, 8, 4<<10)
	tok = rdma.NewToken()
	must(t, q.b.Expect("A", tok, []int{1}, nil, doneTo(exp)))
	start := time.Now()
	q.b.Cancel(tok)
	if c := waitDone(t, exp, "canceled expect"); !errors.Is(c.Err, rdma.ErrCanceled) || time.Since(start) < cfg.LateWriteGrace {
		t.Fatalf("canceled expect after %v: %+v", time.Since(start), c)
	}
	q.b.Cancel(tok) // finished: ignored
}

func TestDisconnectFailsPendingAndForgetsThePeer(t *testing.T) {
	cfg := needLibrary(t)
	p := newPair(t, cfg, 8, 4<<10)
	tok := rdma.NewToken()
	exp := make(chan rdma.Completion, 1)
	must(t, p.b.Expect("A", tok, []int{1}, nil, doneTo(exp)))
	p.b.Disconnect("A")
	if c := waitDone(t, exp, "expect after disconnect"); !errors.Is(c.Err, rdma.ErrPeerGone) {
		t.Fatalf("expect after disconnect: %+v", c)
	}
	if err := p.b.Write("A", rdma.NewToken(), []int{0}, []int{0}, nil, func(rdma.Completion) {}); !errors.Is(err, rdma.ErrPeerUnknown) {
		t.Fatalf("write to a disconnected peer: %v", err)
	}
	// Reconnect and move bytes again.
	must(t, p.b.Connect("A", p.a.Metadata()))
	must(t, p.a.Connect("B", p.b.Metadata()))
	tok = rdma.NewToken()
	fill(p.ra, 2, 9)
	wr := make(chan rdma.Completion, 1)
	must(t, p.b.Expect("A", tok, []int{3}, nil, doneTo(exp)))
	must(t, p.a.Write("B", tok, []int{2}, []int{3}, nil, doneTo(wr)))
	if c := waitDone(t, exp, "expect after reconnect"); c.Err != nil || !bytes.Equal(p.ra.Slot(2), p.rb.Slot(3)) {
		t.Fatalf("after reconnect: %+v", c)
	}
}

func TestCallValidation(t *testing.T) {
	cfg := needLibrary(t)
	tr, err := New(cfg)
	must(t, err)
	defer tr.Close()
	if err := tr.Expect("A", rdma.NewToken(), []int{0}, nil, func(rdma.Completion) {}); !errors.Is(err, rdma.ErrNotRegistered) {
		t.Fatalf("expect before register: %v", err)
	}
	if tr.Metadata() != nil {
		t.Fatal("metadata before register")
	}
	must(t, tr.Register(pool(t, 4, 4096)))
	if err := tr.Expect("A", rdma.NewToken(), []int{4}, nil, func(rdma.Completion) {}); !errors.Is(err, rdma.ErrBadSlot) {
		t.Fatalf("expect slot 4 of 4: %v", err)
	}
	tok := rdma.NewToken()
	must(t, tr.Expect("A", tok, []int{0}, nil, func(rdma.Completion) {}))
	if err := tr.Expect("A", tok, []int{1}, nil, func(rdma.Completion) {}); !errors.Is(err, rdma.ErrDuplicateToken) {
		t.Fatalf("duplicate token: %v", err)
	}
	if err := tr.Write("Z", rdma.NewToken(), []int{0}, []int{0}, nil, func(rdma.Completion) {}); !errors.Is(err, rdma.ErrPeerUnknown) {
		t.Fatalf("write to unknown peer: %v", err)
	}
	if err := tr.Connect("Z", []byte("garbage")); !errors.Is(err, rdma.ErrProtocol) {
		t.Fatalf("connect with garbage metadata: %v", err)
	}
	other, err := New(cfg)
	must(t, err)
	defer other.Close()
	must(t, other.Register(pool(t, 4, 8192))) // other block size
	if err := tr.Connect("O", other.Metadata()); !errors.Is(err, rdma.ErrProtocol) {
		t.Fatalf("connect to a pool of another block size: %v", err)
	}
}

func TestCloseFailsEverythingAndIsIdempotent(t *testing.T) {
	cfg := needLibrary(t)
	cfg.LateWriteGrace = time.Hour
	p := newPair(t, cfg, 8, 4<<10)
	exp := make(chan rdma.Completion, 2)
	tok := rdma.NewToken()
	must(t, p.b.Expect("A", tok, []int{1}, nil, doneTo(exp)))
	tok2 := rdma.NewToken()
	must(t, p.b.Expect("A", tok2, []int{2}, nil, doneTo(exp)))
	p.b.Cancel(tok2) // releasing, held by the grace: Close still ends it
	must(t, p.b.Close())
	for range 2 {
		if c := waitDone(t, exp, "expect at close"); !errors.Is(c.Err, rdma.ErrClosed) && !errors.Is(c.Err, rdma.ErrCanceled) {
			t.Fatalf("expect at close: %+v", c)
		}
	}
	if err := p.b.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := p.b.Expect("A", rdma.NewToken(), []int{1}, nil, func(rdma.Completion) {}); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("expect after close: %v", err)
	}
	p.b.Cancel(tok)     // no panic, no block
	p.b.Disconnect("A") // likewise
}

func TestDescribeAndMetadataSize(t *testing.T) {
	cfg := needLibrary(t)
	p := newPair(t, cfg, 1700, 128<<10)
	info, ok := Describe(p.a)
	if !ok || info.Backend != "UCX" || !strings.HasPrefix(info.Agent, "A-") || info.Library == "" {
		t.Fatalf("Describe: %+v %v", info, ok)
	}
	if _, ok := Describe(nil); ok {
		t.Fatal("Describe(nil) ok")
	}
	t.Logf("library %s, version %q, agent %s, metadata %d bytes", info.Library, info.Version, info.Agent, len(p.a.Metadata()))
}

// TestIdleMakesNoProgressCalls: with nothing in flight the actor blocks on
// its mailbox and NIXL runs no thread of its own (no progress thread), so
// an idle connected pair uses no CPU. NIXL's default agent (progress
// thread on) burns about a third of a core here doing nothing.
func TestIdleMakesNoProgressCalls(t *testing.T) {
	cfg := needLibrary(t)
	p := newPair(t, cfg, 8, 4<<10)
	tok := rdma.NewToken()
	exp, wr := make(chan rdma.Completion, 1), make(chan rdma.Completion, 1)
	must(t, p.b.Expect("A", tok, []int{1}, nil, doneTo(exp)))
	must(t, p.a.Write("B", tok, []int{0}, []int{1}, nil, doneTo(wr)))
	waitDone(t, wr, "write")
	waitDone(t, exp, "expect")
	time.Sleep(50 * time.Millisecond) // let the last round end
	cpu := func() time.Duration {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before := cpu()
	time.Sleep(time.Second)
	if used := cpu() - before; used > 100*time.Millisecond {
		t.Fatalf("an idle pair used %v of CPU in 1s", used)
	} else {
		t.Logf("an idle connected pair used %v of CPU in 1s", used)
	}
}

// TestProbe reports what scripts/nixl.sh runs against, or why it skips.
func TestProbe(t *testing.T) {
	cfg := needLibrary(t)
	info, err := Probe(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NIXL in use: library %s (%s), backend %s, UCX_TLS=%s", info.Library, info.Version, info.Backend, os.Getenv("UCX_TLS"))
}

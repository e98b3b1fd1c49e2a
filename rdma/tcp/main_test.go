package tcp

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/rdma"
	"github.com/kvtier/kvtier/rdma/rdmatest"
)

// TestMain fails the package if any test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var nodeSeq atomic.Int64

// nodeID returns a node id unique in this test binary.
func nodeID(prefix string) string { return fmt.Sprintf("%s%d", prefix, nodeSeq.Add(1)) }

// newTransport builds a transport for node (zero Config fields default),
// closed at the end of the test. RDMA_TCP_TEST_LOG=1 shows its logs.
func newTransport(t testing.TB, cfg Config) *Transport {
	t.Helper()
	if cfg.Node == "" {
		cfg.Node = nodeID("n")
	}
	if os.Getenv("RDMA_TCP_TEST_LOG") != "" {
		cfg.Log = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	} else {
		cfg.Log = zerolog.Nop()
	}
	tr, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// region allocates a region of slots×slotBytes.
func region(slots, slotBytes int) rdma.Region {
	return rdma.Region{Base: make([]byte, slots*slotBytes), SlotBytes: slotBytes, Slots: slots}
}

// register registers tr on r or fails the test.
func register(t testing.TB, tr *Transport, r rdma.Region) {
	t.Helper()
	if err := tr.Register(r); err != nil {
		t.Fatalf("Register: %v", err)
	}
}

// connect connects a and b both ways.
func connect(t testing.TB, a, b *Transport) {
	t.Helper()
	if err := a.Connect(b.cfg.Node, b.Metadata()); err != nil {
		t.Fatalf("%s.Connect(%s): %v", a.cfg.Node, b.cfg.Node, err)
	}
	if err := b.Connect(a.cfg.Node, a.Metadata()); err != nil {
		t.Fatalf("%s.Connect(%s): %v", b.cfg.Node, a.cfg.Node, err)
	}
}

// TestConformance runs the shared rdma.Transport suite.
func TestConformance(t *testing.T) {
	rdmatest.RunWith(t, rdmatest.Options{TwoSided: true, SlotSizes: true}, func(t *testing.T, ra, rb rdma.Region) (rdma.Transport, rdma.Transport, string, string) {
		a := newTransport(t, Config{Node: nodeID("a")})
		b := newTransport(t, Config{Node: nodeID("b")})
		register(t, a, ra)
		register(t, b, rb)
		connect(t, a, b)
		return a, b, a.cfg.Node, b.cfg.Node
	})
}

package tcp

import (
	"errors"
	"testing"
	"time"

	"github.com/kvtier/kvtier/internal/testutil/testcerts"
	"github.com/kvtier/kvtier/rdma"
	"github.com/kvtier/kvtier/rdma/rdmatest"
)

// TestConformanceTLS runs the shared rdma.Transport suite over TLS (one CA
// for every pair the suite builds: its wrong-peer case needs a third node
// that the others trust).
func TestConformanceTLS(t *testing.T) {
	ca := testcerts.NewCA(t)
	rdmatest.RunWith(t, rdmatest.Options{TwoSided: true, SlotSizes: true}, func(t *testing.T, ra, rb rdma.Region) (rdma.Transport, rdma.Transport, string, string) {
		an, bn := nodeID("a"), nodeID("b")
		a := newTransport(t, Config{Node: an, TLS: ca.Config(t, an, ca)})
		b := newTransport(t, Config{Node: bn, TLS: ca.Config(t, bn, ca)})
		register(t, a, ra)
		register(t, b, rb)
		connect(t, a, b)
		return a, b, an, bn
	})
}

// write has a write n slots of src into b and waits for both ends.
func tlsWrite(t *testing.T, a, b *Transport, n int) (writeErr, expectErr error) {
	t.Helper()
	tok := rdma.NewToken()
	slots := make([]int, n)
	for i := range slots {
		slots[i] = i
	}
	expected, written := make(chan error, 1), make(chan error, 1)
	if err := b.Expect(a.cfg.Node, tok, slots, nil, func(c rdma.Completion) { expected <- c.Err }); err != nil {
		t.Fatal(err)
	}
	if err := a.Write(b.cfg.Node, tok, slots, slots, nil, func(c rdma.Completion) { written <- c.Err }); err != nil {
		t.Fatal(err)
	}
	writeErr = <-written
	b.Cancel(tok) // a refused transfer leaves the expectation for the real producer
	return writeErr, <-expected
}

// A node writes only with a certificate its peer trusts, and only as the
// node its certificate names; the bytes of a good write land intact.
func TestTLSBindsCertificatesToNodeIDs(t *testing.T) {
	ca, other := testcerts.NewCA(t), testcerts.NewCA(t)
	const slots, slotBytes = 4, 4096
	pair := func(aNode, aCert string, aCA *testcerts.CA) (*Transport, *Transport) {
		bn := nodeID("b")
		a := newTransport(t, Config{Node: aNode, TLS: aCA.Config(t, aCert, ca), WriteTimeout: 5 * time.Second})
		b := newTransport(t, Config{Node: bn, TLS: ca.Config(t, bn, ca), WriteTimeout: 5 * time.Second})
		register(t, a, region(slots, slotBytes))
		register(t, b, region(slots, slotBytes))
		connect(t, a, b)
		return a, b
	}

	an := nodeID("a")
	a, b := pair(an, an, ca)
	for i := range a.region.Base {
		a.region.Base[i] = byte(i * 13)
	}
	if werr, eerr := tlsWrite(t, a, b, slots); werr != nil || eerr != nil {
		t.Fatalf("a good pair: write %v, expect %v", werr, eerr)
	}
	if string(a.region.Base) != string(b.region.Base) {
		t.Fatal("the bytes landed differ from those written")
	}

	an = nodeID("a")
	a, b = pair(an, "mallory", ca) // a certificate from the right CA, for another node
	if werr, _ := tlsWrite(t, a, b, 1); werr == nil {
		t.Fatal("a node wrote under a certificate naming another node")
	}
	if b.Stats().Refused == 0 {
		t.Fatal("the listener did not count the refusal")
	}

	an = nodeID("a")
	a, b = pair(an, an, other) // a certificate from a CA the listener does not trust
	if werr, _ := tlsWrite(t, a, b, 1); werr == nil || !errors.Is(werr, rdma.ErrPeerGone) {
		t.Fatalf("an untrusted client certificate: write %v, want ErrPeerGone", werr)
	}
}

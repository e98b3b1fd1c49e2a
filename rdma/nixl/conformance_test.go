//go:build nixl && cgo

package nixl

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/rdma"
	"github.com/kvtier/kvtier/rdma/rdmatest"
)

// TestConformance runs the transport contract's suite (the same one rdma/tcp
// passes) against NIXL, over UCX's TCP transport unless UCX_TLS says
// otherwise. It skips, naming what is missing, when the library is absent.
func TestConformance(t *testing.T) {
	cfg := needLibrary(t)
	// NB: a short grace so the Cancel and Disconnect cases end within the
	// suite's bound; production keeps the default (docs/NIXL.md, "Cancel").
	cfg.LateWriteGrace = 50 * time.Millisecond
	var n atomic.Int64
	rdmatest.RunWith(t, rdmatest.Options{Alloc: mmapAlloc, WholeSlots: true}, func(t *testing.T, ra, rb rdma.Region) (a, b rdma.Transport, aID, bID string) {
		i := n.Add(1)
		aID, bID = fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i)
		ca, cb := cfg, cfg
		ca.Name, cb.Name = aID, bID
		var err error
		if a, err = New(ca); err != nil {
			t.Fatal(err)
		}
		if b, err = New(cb); err != nil {
			a.Close()
			t.Fatal(err)
		}
		for _, step := range []func() error{
			func() error { return a.Register(ra) },
			func() error { return b.Register(rb) },
			func() error { return a.Connect(bID, b.Metadata()) },
			func() error { return b.Connect(aID, a.Metadata()) },
		} {
			if err := step(); err != nil {
				a.Close()
				b.Close()
				t.Fatal(err)
			}
		}
		return a, b, aID, bID
	})
}

// mmapAlloc gives the suite pool-like memory: anonymous mappings outside
// the Go heap, unmapped after the case (and so after its Close).
func mmapAlloc(t *testing.T, n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

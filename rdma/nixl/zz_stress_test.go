//go:build nixl && cgo

package nixl

import (
	"os"
	"testing"
	"time"

	"github.com/kvtier/kvtier/rdma"
)

func TestZZStress(t *testing.T) {
	if os.Getenv("XSTRESS") == "" {
		t.Skip()
	}
	cfg := needLibrary(t)
	cfg.PollMax, _ = time.ParseDuration(os.Getenv("XSTRESS"))
	cfg.WriteTimeout = 20 * time.Second
	p := newPair(t, cfg, benchBlocks, benchBlockSize)
	idx := make([]int, benchBlocks)
	for i := range idx {
		idx[i] = i
	}
	exp, wr := make(chan rdma.Completion, 1), make(chan rdma.Completion, 1)
	for i := range 40 {
		t0 := time.Now()
		tok := rdma.NewToken()
		must(t, p.b.Expect("A", tok, idx, doneTo(exp)))
		must(t, p.a.Write("B", tok, idx, idx, doneTo(wr)))
		var cw, ce rdma.Completion
		var tw, te time.Duration
		for range 2 {
			select {
			case cw = <-wr:
				tw = time.Since(t0)
			case ce = <-exp:
				te = time.Since(t0)
			}
		}
		if cw.Err != nil || ce.Err != nil || tw > time.Second {
			t.Logf("iter %d: write %v %v expect %v %v; A %+v B %+v", i, tw, cw.Err, te, ce.Err, p.a.Stats(), p.b.Stats())
		}
	}
}

func TestZZStressPairs(t *testing.T) {
	if os.Getenv("XPAIRS") == "" {
		t.Skip()
	}
	cfg := needLibrary(t)
	cfg.PollMax, _ = time.ParseDuration(os.Getenv("XPAIRS"))
	cfg.WriteTimeout = 20 * time.Second
	idx := make([]int, benchBlocks)
	for i := range idx {
		idx[i] = i
	}
	for k := range 12 {
		t.Run("", func(t *testing.T) {
			p := newPair(t, cfg, benchBlocks, benchBlockSize)
			exp, wr := make(chan rdma.Completion, 1), make(chan rdma.Completion, 1)
			for i := range 4 {
				t0 := time.Now()
				tok := rdma.NewToken()
				must(t, p.b.Expect("A", tok, idx, doneTo(exp)))
				must(t, p.a.Write("B", tok, idx, idx, doneTo(wr)))
				var cw, ce rdma.Completion
				var tw, te time.Duration
				for range 2 {
					select {
					case cw = <-wr:
						tw = time.Since(t0)
					case ce = <-exp:
						te = time.Since(t0)
					}
				}
				if cw.Err != nil || ce.Err != nil || tw > time.Second {
					t.Logf("pair %d iter %d: write %v %v expect %v %v; A %+v B %+v", k, i, tw, cw.Err, te, ce.Err, p.a.Stats(), p.b.Stats())
				}
			}
		})
	}
}

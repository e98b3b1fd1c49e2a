//go:build nixl && cgo

package nixl

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/kvtier/kvtier/rdma"
)

// The benchmark moves what a large prefix fetch moves: 1,700 blocks of
// 128 KiB (about 223 MB) in one Write, the same bytes rdma/tcp's benchmark
// moves, and reports GB/s. BenchmarkLoopbackTCPBaseline copies the same
// bytes through one Go TCP loopback socket in the same run: on loopback,
// NIXL over UCX/TCP is not expected to beat it; the figure that matters
// comes from an RDMA host.
const (
	benchBlocks    = 1700
	benchBlockSize = 128 << 10
)

func BenchmarkWrite1700x128KiB(b *testing.B) {
	cfg := needLibrary(b)
	p := newPair(b, cfg, benchBlocks, benchBlockSize)
	idx := make([]int, benchBlocks)
	for i := range idx {
		idx[i] = i
		fill(p.ra, i, byte(i))
	}
	exp, wr := make(chan rdma.Completion, 1), make(chan rdma.Completion, 1)
	total := int64(benchBlocks * benchBlockSize)
	b.SetBytes(total)
	b.ResetTimer()
	start := time.Now()
	var slowest time.Duration
	for range b.N {
		t0 := time.Now()
		tok := rdma.NewToken()
		must(b, p.b.Expect("A", tok, idx, nil, doneTo(exp)))
		must(b, p.a.Write("B", tok, idx, idx, nil, doneTo(wr)))
		if c := waitDone(b, wr, "write"); c.Err != nil {
			b.Fatal(c.Err)
		}
		if c := waitDone(b, exp, "expect"); c.Err != nil {
			b.Fatal(c.Err)
		}
		slowest = max(slowest, time.Since(t0))
	}
	b.ReportMetric(float64(total)*float64(b.N)/time.Since(start).Seconds()/1e9, "GB/s")
	b.ReportMetric(float64(slowest.Microseconds())/1e3, "slowest-ms")
}

func BenchmarkLoopbackTCPBaseline(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	src, dst := pool(b, benchBlocks, benchBlockSize), pool(b, benchBlocks, benchBlockSize)
	total := int64(benchBlocks * benchBlockSize)
	recvd := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			recvd <- err
			return
		}
		defer c.Close()
		for {
			if _, err := io.ReadFull(c, dst.Base[:total]); err != nil {
				recvd <- err
				return
			}
			recvd <- nil
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.SetBytes(total)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if _, err := c.Write(src.Base[:total]); err != nil {
			b.Fatal(err)
		}
		if err := <-recvd; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(total)*float64(b.N)/time.Since(start).Seconds()/1e9, "GB/s")
}

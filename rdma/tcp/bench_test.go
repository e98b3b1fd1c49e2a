package tcp

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/kvtier/kvtier/internal/testutil/testcerts"
	"github.com/kvtier/kvtier/internal/testutil/testnet"
	"github.com/kvtier/kvtier/rdma"
)

// Benchmark shape; override with e.g.
// go test -run x -bench Fetch ./rdma/tcp -args -tcp.blocks=64 -tcp.block=65536
var (
	benchBlock  = flag.Int("tcp.block", 128<<10, "bytes per block (slot) in BenchmarkFetch")
	benchBlocks = flag.Int("tcp.blocks", 1700, "blocks per transfer in BenchmarkFetch")
	benchTotal  = flag.Int("tcp.total", 256<<20, "bytes per benchmark op (rounded up to whole transfers)")
)

// BenchmarkFetch moves the same bytes, in the same run, through the
// Transport (Expect + Write, one transfer at a time, acked) and through a
// plain TCP socket (writev from the source slots, io.ReadFull into the
// destination slots, no protocol), and reports both rates and their ratio.
// The first shape comes from the flags; the second shows per-transfer
// overhead with small transfers.
func BenchmarkFetch(b *testing.B) {
	for _, s := range []struct{ blocks, block int }{{*benchBlocks, *benchBlock}, {32, *benchBlock}} {
		b.Run(fmt.Sprintf("blocks=%d/block=%dKiB", s.blocks, s.block>>10), func(b *testing.B) {
			benchFetch(b, s.blocks, s.block)
		})
	}
}

func benchFetch(b *testing.B, blocks, block int) {
	transfers := max(1, (*benchTotal+blocks*block-1)/(blocks*block))
	perOp := int64(transfers * blocks * block)
	a, c, src, dst := benchPair(b, blocks, block)
	raw := newRawCopy(b, a.region, c.region, src, dst)
	benchTransfer(b, a, c, src, dst) // warm: connection, buffers, page faults
	raw.copy(b)
	var tTr, tRaw time.Duration
	viaTransport := func() {
		start := time.Now()
		for range transfers {
			benchTransfer(b, a, c, src, dst)
		}
		tTr += time.Since(start)
	}
	viaRaw := func() {
		start := time.Now()
		for range transfers {
			raw.copy(b)
		}
		tRaw += time.Since(start)
	}
	b.ResetTimer()
	alternate(b.N, viaTransport, viaRaw)
	b.StopTimer()
	tr, rw := gbps(perOp, b.N, tTr), gbps(perOp, b.N, tRaw)
	b.ReportMetric(tr, "transport-GB/s")
	b.ReportMetric(rw, "raw-GB/s")
	b.ReportMetric(tr/rw, "ratio")
	b.ReportMetric(float64(perOp)/(1<<20), "MiB/op")
}

// BenchmarkFetchTLS is BenchmarkFetch's transfer over TLS 1.3 (mutual,
// AES-GCM) next to the same transfer over plain TCP, alternating: what the
// data plane's encryption costs.
func BenchmarkFetchTLS(b *testing.B) {
	blocks, block := *benchBlocks, *benchBlock
	transfers := max(1, (*benchTotal+blocks*block-1)/(blocks*block))
	perOp := int64(transfers * blocks * block)
	ca := testcerts.NewCA(b)
	secure := func(c *Config) { c.TLS = ca.Config(b, c.Node, ca) }
	ta, tc, src, dst := benchPair(b, blocks, block, secure)
	pa, pc, _, _ := benchPair(b, blocks, block)
	benchTransfer(b, ta, tc, src, dst) // warm: handshake, buffers, page faults
	benchTransfer(b, pa, pc, src, dst)
	var tTLS, tPlain, cTLS, cPlain time.Duration
	run := func(a, c *Transport, total, cpu *time.Duration) {
		start, cpu0 := time.Now(), processCPU(b)
		for range transfers {
			benchTransfer(b, a, c, src, dst)
		}
		*total += time.Since(start)
		*cpu += processCPU(b) - cpu0
	}
	// The cipher's own cost: TLS 1.3's AES-128-GCM (what crypto/tls
	// negotiates between two Go peers with AES hardware) sealing and
	// opening the same bytes in 16 KiB records, in this process.
	cipherOwn := newRecordCipher(b)
	var cCipher time.Duration
	seal := func() {
		cpu0 := processCPU(b)
		cipherOwn.sealOpen(b, perOp)
		cCipher += processCPU(b) - cpu0
	}
	b.ResetTimer()
	alternate(b.N, func() { run(ta, tc, &tTLS, &cTLS) }, func() { run(pa, pc, &tPlain, &cPlain); seal() })
	b.StopTimer()
	tls, plain := gbps(perOp, b.N, tTLS), gbps(perOp, b.N, tPlain)
	b.ReportMetric(tls, "tls-GB/s")
	b.ReportMetric(plain, "tcp-GB/s")
	b.ReportMetric(tls/plain, "ratio")
	// NB: both ends share this process's cores: what a byte costs them
	// together bounds the rate when the cores are the limit (the producer's
	// AES-GCM seal and the consumer's open are on top of TCP's copies).
	gb := float64(perOp) * float64(b.N) / 1e9
	b.ReportMetric(cTLS.Seconds()/gb, "tls-cpu-s/GB")
	b.ReportMetric(cPlain.Seconds()/gb, "tcp-cpu-s/GB")
	b.ReportMetric(cCipher.Seconds()/gb, "cipher-cpu-s/GB")
	// NB: what TLS costs beyond plain tcp plus the cipher itself: framing,
	// copies into and out of records, more system calls (target ≤ 1.2).
	b.ReportMetric(cTLS.Seconds()/(cPlain+cCipher).Seconds(), "tls/(tcp+cipher)")
}

// recordCipher seals and opens bytes as TLS 1.3 records do: AES-128-GCM,
// 16 KiB of payload a record, a fresh nonce each.
type recordCipher struct {
	aead   cipher.AEAD
	plain  []byte
	sealed []byte
	nonce  []byte
}

func newRecordCipher(b *testing.B) *recordCipher {
	block, err := aes.NewCipher(make([]byte, 16))
	if err != nil {
		b.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		b.Fatal(err)
	}
	const record = 16 << 10
	return &recordCipher{aead: aead, plain: make([]byte, record), sealed: make([]byte, 0, record+aead.Overhead()),
		nonce: make([]byte, aead.NonceSize())}
}

// sealOpen seals n bytes' records and opens each again.
func (r *recordCipher) sealOpen(b *testing.B, n int64) {
	for done := int64(0); done < n; done += int64(len(r.plain)) {
		binary.BigEndian.PutUint64(r.nonce[len(r.nonce)-8:], uint64(done))
		sealed := r.aead.Seal(r.sealed[:0], r.nonce, r.plain, nil)
		if _, err := r.aead.Open(r.plain[:0], r.nonce, sealed, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// processCPU is the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// alternate runs x and y n times each, alternating which goes first, so
// that drift in a shared machine's load falls on both alike.
func alternate(n int, x, y func()) {
	for i := range n {
		if i%2 == 0 {
			x()
			y()
		} else {
			y()
			x()
		}
	}
}

// gbps is the rate of n operations of perOp bytes taking d, in GB/s.
func gbps(perOp int64, n int, d time.Duration) float64 {
	return float64(perOp*int64(n)) / d.Seconds() / 1e9
}

// benchPair builds a producer and a consumer on pools of blocks slots,
// with random source bytes and a shuffled destination order; tweak edits
// both configs (their Node is set).
func benchPair(b *testing.B, blocks, block int, tweak ...func(*Config)) (a, c *Transport, src, dst []int) {
	ca, cc := Config{Node: nodeID("a")}, Config{Node: nodeID("c")}
	for _, f := range tweak {
		f(&ca)
		f(&cc)
	}
	a, c = newTransport(b, ca), newTransport(b, cc)
	ra, rc := region(blocks, block), region(blocks, block)
	rand.NewChaCha8([32]byte{1}).Read(ra.Base)
	register(b, a, ra)
	register(b, c, rc)
	connect(b, a, c)
	src, dst = make([]int, blocks), make([]int, blocks)
	for i := range src {
		src[i], dst[i] = i, i
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(blocks, func(i, j int) { dst[i], dst[j] = dst[j], dst[i] })
	return a, c, src, dst
}

// benchTransfer runs one transfer and waits for both completions.
func benchTransfer(b *testing.B, a, c *Transport, src, dst []int) {
	tok := rdma.NewToken()
	we, ww := make(chan error, 1), make(chan error, 1)
	if err := c.Expect(a.cfg.Node, tok, dst, nil, func(x rdma.Completion) { we <- x.Err }); err != nil {
		b.Fatal(err)
	}
	if err := a.Write(c.cfg.Node, tok, src, dst, nil, func(x rdma.Completion) { ww <- x.Err }); err != nil {
		b.Fatal(err)
	}
	if err := <-we; err != nil {
		b.Fatal(err)
	}
	if err := <-ww; err != nil {
		b.Fatal(err)
	}
}

// rawCopy is the baseline: one TCP connection over the same loopback,
// the same source and destination slots, the same syscalls, no protocol.
type rawCopy struct {
	w, r     net.Conn
	from, to rdma.Region
	src, dst []int
}

func newRawCopy(b *testing.B, from, to rdma.Region, src, dst []int) *rawCopy {
	w, r := testnet.Pair(b)
	return &rawCopy{w: w, r: r, from: from, to: to, src: src, dst: dst}
}

// copy moves every source slot into its destination slot once.
func (x *rawCopy) copy(b *testing.B) {
	errc := make(chan error, 1)
	go func() {
		bufs := make(net.Buffers, 0, len(x.src))
		for _, s := range x.src {
			bufs = append(bufs, x.from.Slot(s))
		}
		_, err := bufs.WriteTo(x.w)
		errc <- err
	}()
	for _, d := range x.dst {
		if _, err := io.ReadFull(x.r, x.to.Slot(d)); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkTransferLatency is one small transfer (one 4 KiB block,
// Expect + Write, both completions awaited) per op: the transport's fixed
// cost per transfer, next to a raw ping-pong of the same block and a
// one-byte reply on a plain socket.
func BenchmarkTransferLatency(b *testing.B) {
	const block = 4 << 10
	a, c, src, dst := benchPair(b, 1, block)
	b.Run("transport", func(b *testing.B) {
		for range b.N {
			benchTransfer(b, a, c, src, dst)
		}
	})
	b.Run("raw", func(b *testing.B) {
		raw := newRawCopy(b, a.region, c.region, src, dst)
		ack := make([]byte, 1)
		for range b.N {
			raw.copy(b)
			if _, err := raw.r.Write(ack); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(raw.w, ack); err != nil {
				b.Fatal(err)
			}
		}
	})
}

package residency

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"unsafe"
)

// goldenVectors pin the fingerprint, part of the file format. The SAME
// vectors are in clients/python/tests/test_residency.py.
var goldenVectors = []struct {
	ns    string
	hash  []byte
	group uint32
	want  uint64
}{
	{"", nil, 0, 0xbcc9599953628295},
	{"vllm-test", sha("0"), 0, 0x963e7792a0e0983f},
	{"vllm-test", sha("1"), 1, 0x9c58147535928064},
	{"ns", []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, 7, 0xfdb8d203c77de7b6}, // 13 bytes: padded fold
	{"0123456789abcdef", repeat(0xff, 32), 0xFFFFFFFF, 0x9ffc109b2923daea},
	// The hash cancels the namespace: the mix of 0 is 0, clamped to 4.
	{"vllm-test", le64(0x59a390d5781078e2), 0, 4},
}

var goldenNamespaces = map[string]uint64{
	"":          0x141cfc9842c4b0e3,
	"vllm-test": 0x59a390d5781078e2,
}

func sha(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }

func repeat(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

func le64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

func TestFingerprintGolden(t *testing.T) {
	for ns, want := range goldenNamespaces {
		if got := NamespaceFingerprint(ns); got != want {
			t.Errorf("NamespaceFingerprint(%q) = %#x, want %#x", ns, got, want)
		}
	}
	for _, v := range goldenVectors {
		if got := Fingerprint(v.ns, v.hash, v.group); got != v.want {
			t.Errorf("Fingerprint(%q, %x, %d) = %#x, want %#x", v.ns, v.hash, v.group, got, v.want)
		}
	}
}

func TestBucketsFor(t *testing.T) {
	for c, want := range map[int]uint64{0: 1, 1: 1, 4: 1, 5: 2, 8: 2, 9: 4, 64: 16, 65: 32, 1000: 256} {
		if got, err := bucketsFor(c); err != nil || got != want {
			t.Errorf("bucketsFor(%d) = %d, %v; want %d", c, got, err, want)
		}
	}
	if _, err := bucketsFor(-1); !errors.Is(err, ErrBadCapacity) {
		t.Errorf("bucketsFor(-1): %v, want ErrBadCapacity", err)
	}
}

// testKeys are n distinct fingerprints; the test fails if two collide in
// their 62 key bits (they would alias in the index).
func testKeys(t testing.TB, n int) []uint64 {
	nsfp := NamespaceFingerprint("model")
	seen := make(map[uint64]bool, n)
	fps := make([]uint64, n)
	for i := range fps {
		fps[i] = FingerprintWith(nsfp, le64(uint64(i)), uint32(i%3))
		if seen[fps[i]&^stateMask] {
			t.Fatalf("key %d collides", i)
		}
		seen[fps[i]&^stateMask] = true
	}
	return fps
}

// TestModel runs seeded random operations against a map model. After every
// operation the region's entries must be exactly the model, and the touched
// key must answer its state; every few operations (and at the end) every
// key, held or not, must answer its model state.
func TestModel(t *testing.T) {
	const seed, nkeys, ops, sweepEvery = 7, 2000, 3000, 25
	r, err := NewRegion(300) // 1024 entries for ~1400 live keys: overflows
	if err != nil {
		t.Fatal(err)
	}
	fps := testKeys(t, nkeys)
	model := map[uint64]uint8{}
	rng := rand.New(rand.NewPCG(seed, seed))
	var dropped uint64
	for op := range ops {
		fp := fps[rng.IntN(nkeys)]
		if !applyRandom(r, rng, fp, model) {
			if _, had := model[fp]; had {
				t.Fatalf("op %d (seed %d): overwrite of held key %#x dropped", op, seed, fp)
			}
			dropped++
		}
		checkEntries(t, r, model, op)
		if got := r.Lookup(fp); got != model[fp] {
			t.Fatalf("op %d (seed %d): key %#x state %d, want %d", op, seed, fp, got, model[fp])
		}
		if op%sweepEvery == 0 || op == ops-1 {
			checkLookups(t, r, fps, model, op)
		}
	}
	if r.Overflow() != dropped || dropped == 0 {
		t.Errorf("overflow %d, want %d (> 0, or the test misses the full-bucket path)", r.Overflow(), dropped)
	}
}

// applyRandom does one random operation on fp in both r and model; false
// when a publish was dropped for want of room.
func applyRandom(r *Region, rng *rand.Rand, fp uint64, model map[uint64]uint8) bool {
	switch n := rng.IntN(1000); {
	case n < 2:
		r.Clear()
		clear(model)
	case n < 300:
		r.Withdraw(fp)
		delete(model, fp)
	default:
		s := uint8(1 + rng.IntN(3))
		if !r.Publish(fp, s) {
			return false // model unchanged
		}
		model[fp] = s
	}
	return true
}

// checkEntries: the region's non-empty entries are exactly the model's
// keys, once each, and the published counter agrees.
func checkEntries(t *testing.T, r *Region, model map[uint64]uint8, op int) {
	t.Helper()
	seen := make(map[uint64]uint8, len(model))
	for _, w := range r.words {
		if w != 0 {
			if _, dup := seen[w&^stateMask]; dup {
				t.Fatalf("op %d: entry %#x twice", op, w)
			}
			seen[w&^stateMask] = uint8(w & stateMask)
		}
	}
	for fp, s := range model {
		if seen[fp&^stateMask] != s {
			t.Fatalf("op %d: key %#x has entry state %d, want %d", op, fp, seen[fp&^stateMask], s)
		}
	}
	if len(seen) != len(model) || r.Published() != uint64(len(model)) {
		t.Fatalf("op %d: %d entries, published %d, want %d", op, len(seen), r.Published(), len(model))
	}
}

func checkLookups(t *testing.T, r *Region, fps []uint64, model map[uint64]uint8, op int) {
	t.Helper()
	for i, fp := range fps {
		if got := r.Lookup(fp); got != model[fp] {
			t.Fatalf("op %d: key %d state %d, want %d", op, i, got, model[fp])
		}
	}
}

func TestOverflow(t *testing.T) {
	for _, capacity := range []int{1, 8} { // one bucket; two buckets
		t.Run(fmt.Sprint(capacity), func(t *testing.T) {
			r, err := NewRegion(capacity)
			if err != nil {
				t.Fatal(err)
			}
			fps := testKeys(t, 64)
			var held []uint64
			var drop uint64
			for _, fp := range fps {
				if !r.Publish(fp, StateCPU) {
					drop = fp
					break
				}
				held = append(held, fp)
			}
			if drop == 0 || r.Overflow() != 1 || r.Lookup(drop) != StateNone {
				t.Fatalf("drop %#x overflow %d state %d: want a dropped key answering 0", drop, r.Overflow(), r.Lookup(drop))
			}
			if r.Published() != uint64(len(held)) {
				t.Errorf("published %d, want %d", r.Published(), len(held))
			}
			for _, fp := range held {
				if r.Lookup(fp) != StateCPU {
					t.Errorf("held key %#x lost", fp)
				}
			}
		})
	}
}

func TestPublishRejects(t *testing.T) {
	r, _ := NewRegion(8)
	for _, c := range []struct {
		fp    uint64
		state uint8
	}{{0, 1}, {3, 1}, {4, 0}, {4, 4}} {
		if r.Publish(c.fp, c.state) {
			t.Errorf("Publish(%#x, %d) accepted", c.fp, c.state)
		}
	}
	if r.Published() != 0 || r.Overflow() != 0 || r.Lookup(0) != 0 {
		t.Errorf("rejected publishes changed the region")
	}
}

// TestConcurrentReaders: one writer churns while readers load every entry
// word; each must be empty or exactly one key with a legal state.
func TestConcurrentReaders(t *testing.T) {
	const readers, iterations = 3, 2000
	r, _ := NewRegion(64)
	fps := testKeys(t, 32)
	legal := map[uint64]bool{0: true}
	for _, fp := range fps {
		legal[fp&^stateMask|1], legal[fp&^stateMask|2] = true, true
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for range readers {
		wg.Go(func() { errs <- readWhileChurning(r, fps, legal, done) })
	}
	churn(r, fps, iterations)
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func churn(r *Region, fps []uint64, iterations int) {
	for n := range iterations {
		for i, fp := range fps {
			if (n+i)%3 == 0 {
				r.Withdraw(fp)
			} else {
				r.Publish(fp, uint8(1+(n+i)%2))
			}
		}
	}
}

// readWhileChurning sweeps the region until done closes (at least once).
func readWhileChurning(r *Region, fps []uint64, legal map[uint64]bool, done <-chan struct{}) error {
	for {
		for i := range r.words {
			if v := atomic.LoadUint64(&r.words[i]); !legal[v] {
				return fmt.Errorf("word %d = %#x: not an entry the writer stored", i, v)
			}
		}
		for _, fp := range fps {
			if s := r.Lookup(fp); s > StateSecondary {
				return fmt.Errorf("key %#x state %d", fp, s)
			}
		}
		select {
		case <-done:
			return nil
		default:
		}
	}
}

// image is an in-memory index (8-byte aligned, like a mapping) and its
// regions, for parse tests with no file.
func image(t testing.TB, capacities ...int) ([]byte, []*Region) {
	spans, size, err := plan(capacities)
	if err != nil {
		t.Fatal(err)
	}
	words := make([]uint64, size/8)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), size)
	return mem, format(mem, spans, 0x1234)
}

func TestParseRoundTrip(t *testing.T) {
	mem, regions := image(t, 16, 16)
	fp := Fingerprint("vllm-test", sha("0"), 0)
	regions[1].Publish(fp, StateSecondary)
	rd, err := newReader(mem)
	if err != nil {
		t.Fatal(err)
	}
	if rd.Generation() != 0x1234 || rd.State(fp) != StateSecondary {
		t.Fatalf("generation %#x state %d", rd.Generation(), rd.State(fp))
	}
	regions[0].Publish(fp, StateCPU) // the first region wins
	if rd.State(fp) != StateCPU {
		t.Fatalf("state %d, want the first region's", rd.State(fp))
	}
}

// TestParseRejects corrupts one field of a valid image at a time.
func TestParseRejects(t *testing.T) {
	le := binary.LittleEndian
	for name, corrupt := range map[string]func([]byte) []byte{
		"short":          func(m []byte) []byte { return m[:tableStart-8] },
		"magic":          func(m []byte) []byte { m[0] = 'X'; return m },
		"version":        func(m []byte) []byte { le.PutUint32(m[8:], 2); return m },
		"no regions":     func(m []byte) []byte { le.PutUint32(m[12:], 0); return m },
		"five regions":   func(m []byte) []byte { le.PutUint32(m[12:], 5); return m },
		"unused desc":    func(m []byte) []byte { le.PutUint32(m[12:], 3); return m },
		"offset align":   func(m []byte) []byte { le.PutUint64(m[64:], tableStart+8); return m },
		"offset low":     func(m []byte) []byte { le.PutUint64(m[64:], 128); return m },
		"buckets zero":   func(m []byte) []byte { le.PutUint32(m[72:], 0); return m },
		"buckets pow2":   func(m []byte) []byte { le.PutUint32(m[72:], 3); return m },
		"entries":        func(m []byte) []byte { le.PutUint32(m[76:], 4); return m },
		"past end":       func(m []byte) []byte { return m[:len(m)-64] },
		"huge offset":    func(m []byte) []byte { le.PutUint64(m[96:], 1<<63); return m },
		"overlap":        func(m []byte) []byte { le.PutUint64(m[96:], tableStart); return m },
		"unaligned view": func(m []byte) []byte { return m[1:] },
	} {
		t.Run(name, func(t *testing.T) {
			mem, _ := image(t, 16, 16)
			if _, _, err := parse(corrupt(mem)); !errors.Is(err, ErrBadIndex) {
				t.Fatalf("parse: %v, want ErrBadIndex", err)
			}
		})
	}
}

func TestCreateOpenClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "residency")
	f1 := mustCreate(t, path)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stat %v, mode %v: want 0600", err, fi.Mode())
	}
	fp := Fingerprint("ns", sha("k"), 0)
	f1.Region(1).Publish(fp, StateSecondary)
	rd, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if rd.Generation() != f1.Generation() || rd.State(fp) != StateSecondary {
		t.Fatalf("reader: generation %#x state %d", rd.Generation(), rd.State(fp))
	}

	f2 := mustCreate(t, path) // a restarted daemon
	if inode(t, path) == inodeOf(t, fi) || f2.Generation() == f1.Generation() {
		t.Fatalf("second Create reused the inode or generation")
	}
	if rd.State(fp) != StateSecondary {
		t.Errorf("the old reader lost its (dead) table")
	}
	closeTwice(t, f1)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("closing the old index removed the new one: %v", err)
	}
	closeTwice(t, f2)
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Close left the file: %v", err)
	}
}

func TestCreateMemfd(t *testing.T) {
	f := mustCreate(t, "")
	defer f.Close()
	fp := Fingerprint("ns", sha("k"), 1)
	f.Region(0).Publish(fp, StateCPU)
	rd, err := Open(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if f.Path() != "" || rd.State(fp) != StateCPU || f.Size() != tableStart+2*16*bucketBytes {
		t.Fatalf("memfd index: path %q state %d size %d", f.Path(), rd.State(fp), f.Size())
	}
}

func TestCreateRejects(t *testing.T) {
	for _, caps := range [][]int{nil, {1, 1, 1, 1, 1}, {-1}, {1 << 40}} {
		if _, err := Create("", caps); !errors.Is(err, ErrBadCapacity) {
			t.Errorf("Create(%v): %v, want ErrBadCapacity", caps, err)
		}
	}
}

func TestOpenRejects(t *testing.T) {
	dir := t.TempDir()
	good, _ := image(t, 8)
	for name, data := range map[string][]byte{
		"empty": nil,
		"short": good[:100],
		"magic": append([]byte("KVTRES99"), good[8:]...),
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(path); !errors.Is(err, ErrBadIndex) {
			t.Errorf("%s: Open: %v, want ErrBadIndex", name, err)
		}
	}
}

func mustCreate(t *testing.T, path string) *File {
	t.Helper()
	f, err := Create(path, []int{64, 64})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func closeTwice(t *testing.T, f *File) {
	t.Helper()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return inodeOf(t, fi)
}

func inodeOf(t *testing.T, fi os.FileInfo) uint64 {
	t.Helper()
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Skip("no inode numbers here")
	}
	return st.Ino
}

func BenchmarkLookup(b *testing.B) {
	r, _ := NewRegion(1 << 16)
	fps := testKeys(b, 1<<16)
	for _, fp := range fps[:1<<15] { // half present, half absent
		r.Publish(fp, StateCPU)
	}
	for i := 0; b.Loop(); i++ {
		r.Lookup(fps[i&(1<<16-1)])
	}
}

func BenchmarkPublish(b *testing.B) {
	r, _ := NewRegion(1 << 16)
	fps := testKeys(b, 1<<16)
	for i := 0; b.Loop(); i++ {
		fp := fps[i&(1<<16-1)]
		if i&(1<<16) == 0 {
			r.Publish(fp, StateCPU) // insert a round of keys, then withdraw it
		} else {
			r.Withdraw(fp)
		}
	}
}

func BenchmarkFingerprintWith(b *testing.B) {
	nsfp, h := NamespaceFingerprint("vllm-test"), sha("0")
	for i := 0; b.Loop(); i++ {
		FingerprintWith(nsfp, h, uint32(i))
	}
}

package kvsize

import (
	"strings"
	"testing"

	"github.com/kvtier/kvtier/config"
)

func TestWriteText(t *testing.T) {
	s, err := shipped(t, "llama-3.1-70b").Size(Options{TP: 8, BlockTokens: 32, PoolBytes: 64 << 30})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := s.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	want := `model            llama: gqa, 80 layers, 8 KV heads of 128 (1 per worker)
kv cache dtype   bfloat16 (2 bytes)
tensor parallel  8 workers
block            32 tokens
per token        320 KiB (all workers)
per block        1.2 MiB a worker, 10 MiB a slot (8 workers)
pool             64 GiB: 6553 blocks, 209696 tokens

kvtierd --pool-bytes 64GiB --block-bytes 10MiB
`
	if b.String() != want {
		t.Fatalf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestWriteTextMLA(t *testing.T) {
	s, err := shipped(t, "deepseek-v2-lite").Size(Options{})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := s.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"mla, 27 layers, one latent of 576 (replicated on every worker)", "per token        30.4 KiB",
		"kvtierd --pool-bytes 1GiB --block-bytes 486KiB\n"} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("no %q in:\n%s", line, b.String())
		}
	}
}

// TestExactParsesBack: the suggested flags are what kvtierd parses, to the
// byte.
func TestExactParsesBack(t *testing.T) {
	for _, n := range []int64{1, 1000, 1024, 497664, 1990656, 5 << 20, 64 << 30, 1<<40 + 1, 3 << 40} {
		got, err := config.ParseByteSize(exact(n))
		if err != nil || got != n {
			t.Errorf("exact(%d) = %q parses to %d, %v", n, exact(n), got, err)
		}
	}
	for n, want := range map[int64]string{512: "512 bytes", 1: "1 byte", 31104: "30.4 KiB", 2 << 20: "2 MiB", 1990656: "1.9 MiB"} {
		if got := approx(n); got != want {
			t.Errorf("approx(%d) = %q, want %q", n, got, want)
		}
	}
}

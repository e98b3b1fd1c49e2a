package kvsize

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
)

// WriteText prints s for a person: an aligned block of the model's
// geometry and the sizes, ending with the kvtierd flags that fit.
func (s Size) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	workers := plural(s.TP, "worker")
	shape := fmt.Sprintf("%d KV heads of %d (%d per worker)", s.KVHeads, s.HeadDim, s.KVHeadsPerWorker)
	if s.Attention == MLA {
		shape = fmt.Sprintf("one latent of %d (replicated on every worker)", s.HeadDim)
	}
	for _, row := range [][2]string{
		{"model", fmt.Sprintf("%s: %s, %d layers, %s", s.ModelType, s.Attention, s.Layers, shape)},
		{"kv cache dtype", fmt.Sprintf("%s (%s)", s.KVCacheDtype, plural(s.DtypeBytes, "byte"))},
		{"tensor parallel", workers},
		{"block", plural(s.BlockTokens, "token")},
		{"per token", approx(s.BytesPerToken) + " (all workers)"},
		{"per block", fmt.Sprintf("%s a worker, %s a slot (%s)", approx(s.WorkerBytesPerBlock), approx(s.BlockBytes), workers)},
		{"pool", fmt.Sprintf("%s: %d blocks, %d tokens", approx(s.PoolBytes), s.PoolBlocks, s.PoolTokens)},
	} {
		fmt.Fprintf(tw, "%s\t%s\n", row[0], row[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nkvtierd --pool-bytes %s --block-bytes %s\n", exact(s.PoolBytes), exact(s.BlockBytes))
	return err
}

// units are the IEC units, largest first.
var units = []struct {
	name string
	size int64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}

// exact is n as kvtierd's flags take it (config.ParseByteSize): in the
// largest unit that divides it, else in bytes.
func exact(n int64) string {
	for _, u := range units {
		if n != 0 && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// approx is n for reading: whole in its unit where it divides, else to
// one decimal ("30.4 KiB").
func approx(n int64) string {
	for _, u := range units {
		if n >= u.size {
			if n%u.size == 0 {
				return fmt.Sprintf("%d %s", n/u.size, u.name)
			}
			return fmt.Sprintf("%.1f %s", float64(n)/float64(u.size), u.name)
		}
	}
	return plural(int(n), "byte")
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// FSOptions sizes the fs-tier scenario.
type FSOptions struct {
	Dir        string        // filesystem to measure on (a fresh subdirectory is made and removed)
	Blocks     int           // blocks written and read back
	BlockBytes int           // bytes per block
	Workers    int           // the tier's I/O goroutines
	Window     int           // operations in flight against the tier
	Fsync      bool          // fsync every block (and the raw file once per block)
	ColdCache  bool          // drop the page cache before each read phase (needs root): reads hit the device, not memory
	Layout     string        // the tier's layout: "segments" (default) or "files"
	Rounds     int           // interleaved rounds (raw then tier, tier then raw, …); figures are their medians
	Timeout    time.Duration // whole-run bound
}

// DefaultFSOptions is what `kvtier bench fs` runs with no flags: 1 GiB.
func DefaultFSOptions() FSOptions {
	return FSOptions{Dir: os.TempDir(), Blocks: 4096, BlockBytes: 256 << 10, Workers: 4, Window: 16, Layout: fs.DefaultLayout,
		Rounds: 5, Timeout: 10 * time.Minute}
}

// FSResult is the scenario's report. Raw figures are one file written and
// read sequentially, block by block, on the same filesystem in the same
// run; tier figures are the same bytes through the fs tier's actor and
// workers in its Layout (header, CRC32C check on write and verify on read;
// files: one file per block, temp file + rename; segments: records
// appended to segment files at offsets the actor reserves).
type FSResult struct {
	FSWriteGBps  float64 `json:"fs_write_GBps"`
	FSReadGBps   float64 `json:"fs_read_GBps"`
	RawWriteGBps float64 `json:"raw_write_GBps"`
	RawReadGBps  float64 `json:"raw_read_GBps"`
	// RawFilesWriteGBps is the files layout without the tier: one file per
	// block (create, write, close, rename), Workers writers, no header and no
	// checksum. It separates the filesystem's per-file cost from the tier's.
	RawFilesWriteGBps float64 `json:"raw_files_write_GBps"`
	FilesWriteRatio   float64 `json:"files_write_ratio"` // fs ÷ raw files
	WriteRatio        float64 `json:"write_ratio"`       // median fs ÷ median raw
	ReadRatio         float64 `json:"read_ratio"`        // median fs ÷ median raw
	// WriteRatioSpread and ReadRatioSpread are the half-width of the
	// interquartile range of the per-round ratios: the ± to read beside
	// the ratios.
	WriteRatioSpread float64 `json:"write_ratio_spread"`
	ReadRatioSpread  float64 `json:"read_ratio_spread"`
	// The CPU time (user and system, the whole process: actor, workers,
	// driver) each phase took per GB moved, medians over the rounds. On a
	// box whose cores are shared, a side that needs more CPU per byte loses
	// more of its rate to other load: these show where the cores went.
	FSWriteCPU  float64 `json:"fs_write_cpu_s_per_GB"`
	RawWriteCPU float64 `json:"raw_write_cpu_s_per_GB"`
	FSReadCPU   float64 `json:"fs_read_cpu_s_per_GB"`
	RawReadCPU  float64 `json:"raw_read_cpu_s_per_GB"`
	Rounds      int     `json:"rounds"`
	TierLoad
	Fsync     bool   `json:"fsync"`
	ColdCache bool   `json:"cold_cache"`
	Layout    string `json:"layout"`
	Dir       string `json:"dir"`
}

// TierLoad is what a tier scenario (fs, obj) moved, in its report: Blocks
// of BlockBytes each, through the tier's Workers, Window in flight.
type TierLoad struct {
	Blocks     int `json:"blocks"`
	BlockBytes int `json:"block_bytes"`
	Workers    int `json:"workers"`
	Window     int `json:"window"`
}

// RunFS measures raw sequential file I/O, then the fs tier, on the same
// bytes and filesystem.
func RunFS(ctx context.Context, o FSOptions) (FSResult, error) {
	if o.Blocks <= 0 || o.BlockBytes <= 0 || o.Window <= 0 {
		return FSResult{}, fmt.Errorf("%w: blocks, block bytes and window must be positive", messages.ErrBadConfig)
	}
	if err := fs.ValidLayout(o.Layout); err != nil {
		return FSResult{}, err
	}
	o.Layout = fs.LayoutOf(o.Layout)
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	dir, err := os.MkdirTemp(o.Dir, "kvtier-bench-fs-")
	if err != nil {
		return FSResult{}, err
	}
	defer os.RemoveAll(dir)
	res := FSResult{TierLoad: TierLoad{Blocks: o.Blocks, BlockBytes: o.BlockBytes, Workers: o.Workers, Window: o.Window},
		Fsync: o.Fsync, ColdCache: o.ColdCache, Layout: o.Layout, Dir: o.Dir, Rounds: max(o.Rounds, 1)}
	src, err := randomBlocks(64, o.BlockBytes)
	if err != nil {
		return res, err
	}
	// NB: the raw file and the tier alternate which goes first (raw, tier;
	// tier, raw; …), so the box's drift hits both alike (stats.go).
	var s fsSamples
	for r := range res.Rounds {
		if err := fsRound(ctx, dir, src, o, r%2 == 1, &s); err != nil {
			return res, err
		}
	}
	res.RawWriteGBps, res.RawReadGBps, res.RawFilesWriteGBps = median(s.rawW), median(s.rawR), median(s.files)
	res.FSWriteGBps, res.FSReadGBps = median(s.tierW), median(s.tierR)
	res.WriteRatio, res.ReadRatio = res.FSWriteGBps/res.RawWriteGBps, res.FSReadGBps/res.RawReadGBps
	res.WriteRatioSpread, res.ReadRatioSpread = ratioSpread(s.rawW, s.tierW), ratioSpread(s.rawR, s.tierR)
	res.FilesWriteRatio = res.FSWriteGBps / res.RawFilesWriteGBps
	res.FSWriteCPU, res.RawWriteCPU = median(s.tierWCPU), median(s.rawWCPU)
	res.FSReadCPU, res.RawReadCPU = median(s.tierRCPU), median(s.rawRCPU)
	return res, nil
}

// fsSamples are each round's throughputs, GB/s.
type fsSamples struct {
	rawW, rawR, files, tierW, tierR []float64
	// CPU seconds per GB of each phase
	rawWCPU, rawRCPU, tierWCPU, tierRCPU []float64
}

// fsRound measures the raw file, the per-file baseline and the tier once
// each (the tier first when tierFirst), on fresh files.
func fsRound(ctx context.Context, dir string, src [][]byte, o FSOptions, tierFirst bool, s *fsSamples) error {
	total := float64(o.Blocks) * float64(o.BlockBytes)
	gbps := func(d time.Duration) float64 { return total / d.Seconds() / 1e9 }
	perGB := func(d time.Duration) float64 { return d.Seconds() / (total / 1e9) }
	// NB: each phase starts with no dirty pages of the one before, so the
	// kernel's writeback throttling does not charge one for the other, and
	// with the files of the one before removed, so that none starts with a
	// page cache the others filled (the later phases paid for reclaiming
	// it: the tier, measured last, ran up to 2× slower for it).
	raw := func() error {
		unix.Sync()
		var cpu phaseCPU
		w, r, err := rawIO(filepath.Join(dir, "raw"), src, o, &cpu)
		if err != nil {
			return err
		}
		s.rawW, s.rawR = append(s.rawW, gbps(w)), append(s.rawR, gbps(r))
		s.rawWCPU, s.rawRCPU = append(s.rawWCPU, perGB(cpu.write)), append(s.rawRCPU, perGB(cpu.read))
		if err := os.Remove(filepath.Join(dir, "raw")); err != nil {
			return err
		}
		unix.Sync()
		wf, err := rawFiles(filepath.Join(dir, "files"), src, o)
		if err != nil {
			return err
		}
		s.files = append(s.files, gbps(wf))
		return os.RemoveAll(filepath.Join(dir, "files"))
	}
	tier := func() error {
		unix.Sync()
		var cpu phaseCPU
		w, r, err := tierIO(ctx, filepath.Join(dir, "tier"), src, o, &cpu)
		if err != nil {
			return err
		}
		s.tierW, s.tierR = append(s.tierW, gbps(w)), append(s.tierR, gbps(r))
		s.tierWCPU, s.tierRCPU = append(s.tierWCPU, perGB(cpu.write)), append(s.tierRCPU, perGB(cpu.read))
		return os.RemoveAll(filepath.Join(dir, "tier"))
	}
	first, second := raw, tier
	if tierFirst {
		first, second = tier, raw
	}
	if err := first(); err != nil {
		return err
	}
	return second()
}

// rawIO writes the blocks into one file and reads them back, sequentially.
func rawIO(path string, src [][]byte, o FSOptions, cpu *phaseCPU) (write, read time.Duration, err error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, 0, err
	}
	start, cpu0 := time.Now(), processCPU()
	for i := range o.Blocks {
		if _, err := f.Write(src[i%len(src)]); err != nil {
			f.Close()
			return 0, 0, err
		}
		if o.Fsync {
			if err := f.Sync(); err != nil {
				f.Close()
				return 0, 0, err
			}
		}
	}
	if err := f.Close(); err != nil {
		return 0, 0, err
	}
	write, cpu.write = time.Since(start), processCPU()-cpu0
	if err := o.coldCache(); err != nil {
		return 0, 0, err
	}
	f, err = os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	buf := make([]byte, o.BlockBytes)
	start, cpu0 = time.Now(), processCPU()
	for range o.Blocks {
		if _, err := io.ReadFull(f, buf); err != nil {
			return 0, 0, err
		}
	}
	read, cpu.read = time.Since(start), processCPU()-cpu0
	return write, read, nil
}

// rawFiles writes every block as its own file (temp name, then rename),
// with Workers writers: the fs tier's layout, minus the tier.
func rawFiles(dir string, src [][]byte, o FSOptions) (time.Duration, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	workers := max(o.Workers, 1)
	errs := make(chan error, workers)
	start := time.Now()
	for w := range workers {
		go func() {
			for i := w; i < o.Blocks; i += workers {
				p := filepath.Join(dir, strconv.Itoa(i))
				if err := writeRename(p, src[i%len(src)], o.Fsync); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	var first error
	for range workers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return time.Since(start), first
}

func writeRename(p string, b []byte, fsync bool) error {
	f, err := os.Create(p + ".tmp")
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if fsync {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(p+".tmp", p)
}

var fsBenchNS = messages.Layout{Model: "bench-fs", DType: "fp16", BlockTokens: 16, TPSize: 1}.Namespace()

func fsBenchKey(i int) messages.Key { return numberedKey(fsBenchNS, i) }

// tierIO writes the blocks through the fs tier's actor with Window in
// flight, then reads every one back (verified by the tier).
func tierIO(ctx context.Context, root string, src [][]byte, o FSOptions, cpu *phaseCPU) (write, read time.Duration, err error) {
	tier, err := fs.Open(fs.Config{Root: root, MaxBlockBytes: o.BlockBytes, Fsync: o.Fsync, Workers: o.Workers,
		Queue: 4 * o.Window, Layout: o.Layout, Log: zerolog.Nop()})
	if err != nil {
		return 0, 0, err
	}
	return driveTier(ctx, tierDrive{name: "fs", props: tier.Props(nil), close: tier.Close, blockBytes: o.BlockBytes,
		blocks: o.Blocks, window: o.Window, beforeRead: o.coldCache, cpu: cpu}, src)
}

// pipeline issues Blocks operations keeping Window in flight; every answer
// must be a success. Each operation carries a window slot (its Corr, the
// index of its buffer), reused only once its answer is back.
func pipeline(ctx context.Context, o FSOptions, results <-chan any, issue func(i, slot int)) (time.Duration, error) {
	start := time.Now()
	next, done := 0, 0
	for ; next < min(o.Window, o.Blocks); next++ {
		issue(next, next)
	}
	for done < o.Blocks {
		select {
		case r := <-results:
			var err error
			var slot uint64
			switch m := r.(type) {
			case *tiermsg.WriteResult:
				err, slot = m.Err, m.Corr
			case *tiermsg.ReadResult:
				err, slot = m.Err, m.Corr
			}
			if err != nil {
				return 0, err
			}
			done++
			if next < o.Blocks {
				issue(next, int(slot))
				next++
			}
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return time.Since(start), nil
}

// coldCache, with ColdCache set, writes dirty pages back and drops the page
// cache, so the read phase that follows measures the device. Without it a
// read phase measures memory copies (and, for the tier, CRC32C speed).
func (o FSOptions) coldCache() error {
	if !o.ColdCache {
		return nil
	}
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0); err != nil {
		return fmt.Errorf("drop page cache (needs root; run without --cold-cache): %w", err)
	}
	return nil
}

// randomBlocks is n blocks of size random bytes: the source a scenario
// writes over and over (random, so nothing on the way can compress it).
func randomBlocks(n, size int) ([][]byte, error) {
	src := make([][]byte, n)
	for i := range src {
		src[i] = make([]byte, size)
		if _, err := rand.Read(src[i]); err != nil {
			return nil, err
		}
	}
	return src, nil
}

package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/kvtier/kvtier/tools/bench"
)

// The fs scenario (`kvtier bench fs`): the fs tier vs raw file I/O.
const fsShort = "fs tier block write/read throughput vs raw sequential file I/O of the same bytes, same filesystem, same run"

func printFS(_ bench.FSOptions, r bench.FSResult) {
	fmt.Printf("%d blocks of %d bytes under %s (layout %s, fsync %v, %d workers, %d in flight), medians of %d interleaved rounds\n",
		r.Blocks, r.BlockBytes, r.Dir, r.Layout, r.Fsync, r.Workers, r.Window, r.Rounds)
	fmt.Printf("write: fs tier %.2f GB/s, raw %.2f GB/s → %.2f× ± %.2f\n", r.FSWriteGBps, r.RawWriteGBps, r.WriteRatio, r.WriteRatioSpread)
	fmt.Printf("write: raw one file per block (the files layout, no tier) %.2f GB/s → fs tier %.2f×\n", r.RawFilesWriteGBps, r.FilesWriteRatio)
	fmt.Printf("read:  fs tier %.2f GB/s, raw %.2f GB/s → %.2f× ± %.2f\n", r.FSReadGBps, r.RawReadGBps, r.ReadRatio, r.ReadRatioSpread)
	fmt.Printf("CPU s per GB: write fs tier %.3f, raw %.3f; read fs tier %.3f, raw %.3f\n", r.FSWriteCPU, r.RawWriteCPU, r.FSReadCPU, r.RawReadCPU)
}

func fsFlags(f *pflag.FlagSet, o *bench.FSOptions) {
	f.StringVar(&o.Dir, "dir", o.Dir, "filesystem to measure on (a temporary subdirectory is made and removed)")
	blockIOFlags(f, &o.Blocks, &o.BlockBytes)
	f.IntVar(&o.Workers, "workers", o.Workers, "fs tier I/O goroutines")
	f.IntVar(&o.Window, "window", o.Window, "operations in flight against the tier")
	f.BoolVar(&o.Fsync, "fsync", o.Fsync, "fsync every block (tier) and after every block (raw)")
	f.StringVar(&o.Layout, "layout", o.Layout, "fs tier layout: files (one file per block) or segments (append-only segment files)")
	f.IntVar(&o.Rounds, "rounds", o.Rounds, "interleaved rounds (raw then tier, tier then raw, …); figures are medians, ratios have their spread")
	f.BoolVar(&o.ColdCache, "cold-cache", o.ColdCache, "drop the page cache before each read phase (root only): reads measure the device, not memory and CRC32C")
}

package fs

// Blocks of several sizes in one tier (issue 42: one daemon, many models,
// each namespace its own bytes per block): stored interleaved, read back,
// refused into a destination of another length without harm, counted by
// their actual bytes, and found again by a restart's scan — after a clean
// close (sealed segments) and after a crash (segments walked and sealed).

import (
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// sizedKey is block i's key, in its size's namespace.
func sizedKey(i, size int) messages.Key { return tiertest.InSizeNamespace(benchKey(i), size) }

// sizesConfig is a tier of root in layout bounded by tiertest.SizesBound, whose
// segments seal after about five mixed blocks.
func sizesConfig(root, layout string) Config {
	return Config{Root: root, Layout: layout, MaxBlockBytes: tiertest.SizesBound, SegmentBytes: segOverhead + 40<<10}
}

// withOdd adds a block of a length that is no multiple of a page (3001
// bytes) after every third one of blocks: it packs back to back, and the
// page-sized blocks after it start on a page again.
func withOdd(blocks []tiertest.Block) []tiertest.Block {
	var out []tiertest.Block
	for i, b := range blocks {
		out = append(out, b)
		if i%3 == 2 {
			src := make([]byte, 3001)
			for j := range src {
				src[j] = byte(i + j*13)
			}
			out = append(out, tiertest.Block{Key: sizedKey(1000+i, len(src)), Data: src, Sum: crc32.Checksum(src, blockfmt.Castagnoli)})
		}
	}
	return out
}

func keysOf(blocks []tiertest.Block) []messages.Key {
	ks := make([]messages.Key, len(blocks))
	for i, b := range blocks {
		ks[i] = b.Key
	}
	return ks
}

// The tier contract with blocks of two sizes interleaved (tiertest's
// check), their bytes counted as stored, and a restart's scan serving them
// all again.
func TestFSMixedSizesStoredReadAndRescanned(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout string) {
		root := t.TempDir()
		cfg := sizesConfig(root, layout)
		blocks := tiertest.MixedBlocks(12, sizedKey)
		var used int64
		t.Run("write", func(t *testing.T) {
			h := openTierWith(t, cfg, harnessOpts{drop: true})
			h.CheckMixedSizes(blocks, tiertest.SizesBound)
			s := h.quiesce()
			assert.Equal(t, len(blocks), s.Blocks)
			used = s.Bytes
			if layout == LayoutFiles {
				var want int64
				for _, b := range blocks {
					want += FileSize(len(b.Data), nil)
				}
				assert.Equal(t, want, s.Bytes, "each block counted by its own length")
			} else {
				var blockBytes int64
				for _, b := range blocks {
					blockBytes += int64(len(b.Data))
				}
				assert.GreaterOrEqual(t, s.Bytes, blockBytes, "each block counted by its own length")
				segs, _ := segFiles(t, root)
				assert.Greater(t, len(segs), 1, "blocks of both sizes across several segments")
			}
		})
		h := openTierWith(t, cfg, harnessOpts{drop: true})
		assert.ElementsMatch(t, keysOf(blocks), h.Inventory())
		assert.Zero(t, h.tier.scan.Removed, "no block of either size taken for a bad one")
		s := h.stats()
		assert.Equal(t, len(blocks), s.ScannedBlocks)
		assert.Equal(t, used, s.Bytes, "accounted at start as while written")
		h.CheckReads(blocks)
	})
}

// A crash leaves segments unsealed: the scan walks their entries, blocks of
// three lengths (two page multiples, one not), verifies each whole, and
// serves every one; page-multiple blocks lie on page boundaries.
func TestFSMixedSizesRecoveredAfterCrash(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout string) {
		root := t.TempDir()
		cfg := sizesConfig(root, layout)
		blocks := withOdd(tiertest.MixedBlocks(9, sizedKey))
		t.Run("crash", func(t *testing.T) {
			h := openTierWith(t, cfg, harnessOpts{crash: true, drop: true})
			h.WriteAll(blocks)
			h.quiesce()
		})
		if layout == LayoutSegments {
			for _, b := range blocks {
				sp, ok := findBlock(t, root, b.Key)
				require.True(t, ok, "%v", b.Key)
				require.Equal(t, int64(len(b.Data)), sp.block)
				if len(b.Data)%segPage == 0 {
					assert.Zero(t, sp.data%segPage, "%v: a block of whole pages starts on a page", b.Key)
				}
			}
		}
		h := openTierWith(t, cfg, harnessOpts{drop: true})
		assert.ElementsMatch(t, keysOf(blocks), h.Inventory())
		assert.Zero(t, h.tier.scan.Removed)
		assert.Zero(t, h.tier.scan.Unsealed)
		h.CheckReads(blocks)
		// A wrong-length read of a recovered block harms it no more than
		// of a written one.
		r := h.Read(blocks[1].Key, make([]byte, len(blocks[0].Data)))
		require.ErrorIs(t, r.Err, blockfmt.ErrSize)
		h.CheckReads(blocks[1:2])
		assert.Zero(t, h.stats().Invalid)
	})
}

// A block over the bound (a tier reopened with a smaller one) is removed
// at start, never served; one within it is kept.
func TestFSScanDropsBlocksOverTheBound(t *testing.T) {
	root := t.TempDir()
	cfg := sizesConfig(root, LayoutFiles)
	blocks := tiertest.MixedBlocks(4, sizedKey)
	t.Run("write", func(t *testing.T) {
		openTierWith(t, cfg, harnessOpts{drop: true}).WriteAll(blocks)
	})
	cfg.MaxBlockBytes = 8 << 10
	h := openTierWith(t, cfg, harnessOpts{drop: true})
	assert.ElementsMatch(t, []messages.Key{blocks[0].Key, blocks[2].Key}, h.Inventory(), "the 4 KiB blocks")
	h.CheckReads([]tiertest.Block{blocks[0], blocks[2]})
	for _, b := range []tiertest.Block{blocks[1], blocks[3]} {
		require.ErrorIs(t, h.Read(b.Key, make([]byte, len(b.Data))).Err, messages.ErrNotFound, "the 12 KiB blocks: gone")
	}
}

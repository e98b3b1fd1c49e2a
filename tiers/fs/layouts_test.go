package fs

// The fs tier's behaviour through its actor, against both layouts where it
// applies (restart, corruption, out of space, a block removed and written
// again, reads racing evictions), and the segment layout's own: torn
// tails, whole-segment eviction within the capacity, block files of the
// files layout read through.

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// crashAfterWriting writes blocks 0..n-1 (with provenance) through a tier
// that then stops as a killed process leaves its disk: no seal.
func crashAfterWriting(t *testing.T, cfg Config, n int) {
	writeBlocks(t, "crash", cfg, n, harnessOpts{crash: true})
}

// writeBlocks writes blocks 0..n-1 (with provenance) through a tier opened
// with o, in a subtest named name, at whose end the tier stops.
func writeBlocks(t *testing.T, name string, cfg Config, n int, o harnessOpts) {
	t.Run(name, func(t *testing.T) {
		h := openTierWith(t, cfg, o)
		for i := range n {
			h.write(i, provOf(i))
		}
	})
}

// recCost is what one record takes in a segment: its entry, its block and
// its footer entry.
func recCost(p *messages.Provenance) int64 {
	return entrySize(FileSize(evBlock, p)-evBlock) + evBlock + segEntrySize
}

// tryWrite writes src as block i's.
func (h *fsHarness) tryWrite(i int, src []byte, p *messages.Provenance) error {
	h.T.Helper()
	sum := crcOf(src)
	return h.Ask(&tiermsg.Write{Key: benchKey(i), Src: src, Checksum: sum, Prov: p}).(*tiermsg.WriteResult).Err
}

// readsAs checks block i reads back as want.
func (h *fsHarness) readsAs(i int, want []byte) {
	h.T.Helper()
	r := h.Ask(&tiermsg.Read{Key: benchKey(i), Dest: make([]byte, evBlock)}).(*tiermsg.ReadResult)
	require.NoError(h.T, r.Err, "block %d", i)
	require.Equal(h.T, crcOf(want), r.Checksum, "block %d", i)
}

// readBytes reads block i.
func (h *fsHarness) readBytes(i int) ([]byte, error) {
	h.T.Helper()
	dest := make([]byte, evBlock)
	r := h.Ask(&tiermsg.Read{Key: benchKey(i), Dest: dest}).(*tiermsg.ReadResult)
	return dest, r.Err
}

// removedUntilStored reads events until k is announced stored and returns
// the keys announced removed on the way.
func (h *fsHarness) removedUntilStored(k messages.Key) []messages.Key {
	h.T.Helper()
	var removed []messages.Key
	for {
		e := h.Next()
		switch {
		case e.Kind == messages.BlockRemoved:
			removed = append(removed, e.Keys...)
		case e.Kind == messages.BlockStored && slices.Contains(e.Keys, k):
			return removed
		}
	}
}

func crcOf(b []byte) uint32 { return crc32.Checksum(b, blockfmt.Castagnoli) }

func keysOfRange(from, to int) []messages.Key {
	var out []messages.Key
	for i := from; i < to; i++ {
		out = append(out, benchKey(i))
	}
	return out
}

// A tier reopened serves what it stored, with its provenance, and
// introduces it. Small segments: sealed ones and the one sealed at close.
func TestFSRestartServesWhatItStored(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout string) {
		root := t.TempDir()
		cfg := Config{Root: root, Layout: layout, Fsync: true, SegmentBytes: segOverhead + 3*recCost(provOf(1))}
		t.Run("write", func(t *testing.T) {
			h := openTier(t, cfg)
			for i := range 10 {
				h.write(i, provOf(i))
			}
			h.quiesce()
		})
		if layout == LayoutSegments {
			segs, _ := segFiles(t, root)
			require.Len(t, segs, 4, "three records a segment")
			require.Zero(t, blockFiles(t, root))
		}
		h := openTier(t, cfg)
		assert.ElementsMatch(t, keysOfRange(0, 10), h.Inventory())
		assert.Zero(t, h.tier.scan.Torn)
		assert.Zero(t, h.tier.scan.Unsealed, "every segment was sealed")
		e := h.Next()
		require.Equal(t, messages.BlockWriting, e.Kind)
		assert.ElementsMatch(t, keysOfRange(0, 10), e.Keys)
		e = h.Next()
		require.Equal(t, messages.BlockStored, e.Kind)
		for i, k := range e.Keys {
			assert.Equal(t, provOf(int(k.Hash[3])), e.Prov[i])
		}
		for i := range 10 {
			r := h.read(i)
			require.NoError(t, r.Err)
			src, sum := evSrc(i)
			assert.Equal(t, sum, r.Checksum)
			assert.Equal(t, provOf(i), r.Prov)
			got, err := h.readBytes(i)
			require.NoError(t, err)
			require.Equal(t, src, got)
		}
		assert.Equal(t, 10, h.stats().ScannedBlocks)
	})
}

// Corruption at rest — a header, a provenance section, a block's bytes —
// is caught (at start or on read) and never served.
func TestFSCorruptionAtRestNeverServed(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout string) {
		root := t.TempDir()
		cfg := Config{Root: root, Layout: layout, SegmentBytes: segOverhead + 2*recCost(provOf(1))}
		t.Run("write", func(t *testing.T) {
			h := openTier(t, cfg)
			for i := range 6 {
				h.write(i, provOf(i))
			}
			h.quiesce()
		})
		flipByte(t, root, benchKey(0), 30)           // the header's namespace: its checksum fails
		flipByte(t, root, benchKey(1), HeaderSize+6) // the provenance section
		flipByte(t, root, benchKey(2), -1)           // the block
		h := openTier(t, cfg)
		for _, i := range []int{0, 1, 2} {
			_, err := h.readBytes(i)
			require.Error(t, err, "block %d never served", i)
			assert.True(t, errors.Is(err, messages.ErrInvalidBlock) || errors.Is(err, messages.ErrNotFound), "block %d: %v", i, err)
		}
		for i := 3; i < 6; i++ {
			src, _ := evSrc(i)
			got, err := h.readBytes(i)
			require.NoError(t, err)
			require.Equal(t, src, got)
		}
		assert.ElementsMatch(t, keysOfRange(3, 6), h.Inventory())
		st := h.quiesce()
		assert.GreaterOrEqual(t, st.Invalid+uint64(st.ScanRemoved), uint64(3), "each bad copy counted")
		// The events end announcing the good blocks alone (or the test
		// times out).
		want := map[messages.Key]bool{benchKey(3): true, benchKey(4): true, benchKey(5): true}
		stored := map[messages.Key]bool{}
		for !maps.Equal(stored, want) {
			e := h.Next()
			for _, k := range e.Keys {
				switch e.Kind {
				case messages.BlockStored:
					stored[k] = true
				case messages.BlockRemoved, messages.BlockWriteAborted:
					delete(stored, k)
				}
			}
		}
	})
}

// A full disk fails writes cleanly (ErrTierFull, counted); what was stored
// before and after stays readable, across a restart too.
func TestFSWriteOutOfSpace(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout string) {
		root := t.TempDir()
		faulty := NewFaulty(OS{})
		cfg := Config{Root: root, Layout: layout, FS: faulty}
		t.Run("write", func(t *testing.T) {
			h := openTier(t, cfg)
			for i := range 4 {
				h.write(i, provOf(i))
			}
			remove := faulty.Inject(func(op Op, _ string) error {
				if op == OpWrite {
					return syscall.ENOSPC
				}
				return nil
			})
			for i := 10; i < 12; i++ {
				src, _ := evSrc(i)
				require.ErrorIs(t, h.tryWrite(i, src, nil), messages.ErrTierFull)
			}
			remove()
			for i := 4; i < 6; i++ {
				h.write(i, provOf(i))
			}
			st := h.quiesce()
			assert.Equal(t, uint64(2), st.WritesFull)
			assert.Equal(t, 6, st.Blocks)
			for i := range 6 {
				src, _ := evSrc(i)
				h.readsAs(i, src)
			}
		})
		h := openTier(t, Config{Root: root, Layout: layout})
		assert.ElementsMatch(t, keysOfRange(0, 6), h.Inventory())
		assert.Zero(t, h.tier.scan.Torn)
		for i := range 6 {
			src, _ := evSrc(i)
			h.readsAs(i, src)
		}
		if layout == LayoutFiles {
			assert.Equal(t, 6, blockFiles(t, root), "no temporary file left")
		}
	})
}

// A block removed (a bad copy) and written again is served as written the
// second time, before and after a restart — in the segments layout the
// dead copy is still on disk, in a sealed segment or the one being written.
func TestFSRemovedThenRewritten(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout string) {
		root := t.TempDir()
		cfg := Config{Root: root, Layout: layout, SegmentBytes: segOverhead + 3*recCost(nil)}
		second := func(i int) []byte {
			b, _ := evSrc(i + 1000)
			return b
		}
		t.Run("write", func(t *testing.T) {
			h := openTier(t, cfg)
			for i := range 5 { // 0-2 in a sealed segment, 3-4 in the active one
				src, _ := evSrc(i)
				require.NoError(t, h.tryWrite(i, src, nil))
				h.removedUntilStored(benchKey(i))
			}
			h.quiesce()
			for _, i := range []int{1, 4} {
				h.System.Root.Send(h.PID, &tiermsg.Delete{Key: benchKey(i)})
				e := h.Next()
				require.Equal(t, messages.BlockRemoved, e.Kind)
				require.Equal(t, []messages.Key{benchKey(i)}, e.Keys)
				_, err := h.readBytes(i)
				require.ErrorIs(t, err, messages.ErrNotFound)
			}
			h.quiesce()
			for _, i := range []int{1, 4} {
				require.NoError(t, h.tryWrite(i, second(i), nil))
				h.readsAs(i, second(i))
			}
		})
		h := openTier(t, cfg)
		assert.ElementsMatch(t, keysOfRange(0, 5), h.Inventory())
		for i := range 5 {
			want, _ := evSrc(i)
			if i == 1 || i == 4 {
				want = second(i)
			}
			got, err := h.readBytes(i)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got), "block %d: the copy written last", i)
		}
	})
}

// Reads racing evictions never return wrong bytes: a read of an evicted
// block is ErrNotFound, never garbage, never a checksum failure.
func TestFSConcurrentReadsDuringEviction(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout string) {
		const blocks, readers = 120, 3
		capacity := 8 * blockCost(layout, evBlock, nil)
		seg := int64(0)
		if layout == LayoutSegments {
			seg = segOverhead + 2*recCost(nil) // two records a segment
			capacity = 8 * seg
		}
		h := openTierWith(t, Config{Root: t.TempDir(), Layout: layout, Capacity: capacity, SegmentBytes: seg},
			harnessOpts{drop: true})
		var written sync.WaitGroup
		written.Add(1)
		done := make(chan struct{})
		var mu sync.Mutex
		var wrote []int // written and answered: readable until evicted
		go func() {
			defer written.Done()
			defer close(done)
			for i := range blocks {
				src, sum := evSrc(i)
				r, err := actors.Ask(h.Ctx, h.System, h.PID, &tiermsg.Write{Key: benchKey(i), Src: src, Checksum: sum})
				if err != nil || r.(*tiermsg.WriteResult).Err != nil {
					t.Errorf("write %d: %v %v", i, err, r)
					return
				}
				mu.Lock()
				wrote = append(wrote, i)
				mu.Unlock()
			}
		}()
		type outcome struct {
			i   int
			ok  bool
			err error
		}
		results := make(chan outcome, 1024)
		var wg sync.WaitGroup
		for r := range readers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; ; n++ {
					select {
					case <-done:
						return
					default:
					}
					mu.Lock()
					if len(wrote) == 0 {
						mu.Unlock()
						continue
					}
					i := wrote[(n*7+r)%len(wrote)]
					mu.Unlock()
					dest := make([]byte, evBlock)
					a, err := actors.Ask(h.Ctx, h.System, h.PID, &tiermsg.Read{Key: benchKey(i), Dest: dest})
					if err == nil {
						err = a.(*tiermsg.ReadResult).Err
					}
					want, _ := evSrc(i)
					results <- outcome{i: i, ok: err == nil && bytes.Equal(dest, want), err: err}
				}
			}()
		}
		go func() { wg.Wait(); close(results) }()
		reads, found := 0, 0
		for o := range results {
			reads++
			switch {
			case o.err == nil:
				require.True(t, o.ok, "block %d read with wrong bytes", o.i)
				found++
			case errors.Is(o.err, messages.ErrNotFound), errors.Is(o.err, messages.ErrTierBusy):
			default:
				t.Fatalf("block %d: %v", o.i, o.err)
			}
		}
		written.Wait()
		st := h.quiesce()
		assert.Zero(t, st.Invalid, "nothing found invalid")
		assert.Positive(t, st.Evictions)
		assert.LessOrEqual(t, st.Bytes, capacity)
		t.Logf("%d reads, %d served, %d evictions", reads, found, st.Evictions)
	})
}

// A crash mid-append leaves a torn tail in the segment being written: the
// next start truncates it (counted), serves every block before it, never
// what was torn, and seals the segment.
func TestSegmentsTornTail(t *testing.T) {
	cases := []struct {
		name     string
		tear     func(t *testing.T, path string, last span)
		lastGood bool // block 4 survives
		torn     int
	}{
		{"truncated mid-block", func(t *testing.T, path string, last span) {
			require.NoError(t, os.Truncate(path, last.data+100))
		}, false, 1},
		{"last block corrupt", func(t *testing.T, path string, last span) {
			flipAt(t, path, last.data+last.block-1)
		}, false, 1},
		{"header torn", func(t *testing.T, path string, last span) {
			flipAt(t, path, last.hdr+3)
		}, false, 1},
		{"entry never written", func(t *testing.T, path string, last span) {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.WriteAt(make([]byte, last.hdr+last.hdrLen-last.entry), last.entry)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}, false, 1},
		{"garbage after the last record", func(t *testing.T, path string, last span) {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			require.NoError(t, err)
			_, err = f.Write(bytes.Repeat([]byte{0xab}, 300))
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}, true, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			cfg := Config{Root: root, Layout: LayoutSegments}
			crashAfterWriting(t, cfg, 5)
			segs, _ := segFiles(t, root)
			require.Len(t, segs, 1)
			last, ok := findBlock(t, root, benchKey(4))
			require.True(t, ok)
			_, _, sealed := readFooterOf(t, segs[0])
			require.False(t, sealed, "a crash leaves the segment unsealed")
			c.tear(t, segs[0], last)

			for round := range 2 {
				t.Run(fmt.Sprint("open", round), func(t *testing.T) {
					h := openTier(t, cfg)
					want := keysOfRange(0, 4)
					if c.lastGood {
						want = keysOfRange(0, 5)
					}
					assert.ElementsMatch(t, want, h.Inventory())
					if round == 0 {
						assert.Equal(t, c.torn, h.tier.scan.Torn, "the torn tail counted")
						assert.Positive(t, h.tier.scan.TornBytes)
					} else {
						assert.Zero(t, h.tier.scan.Torn, "truncated and sealed: nothing torn the second time")
					}
					for _, k := range want {
						i := int(k.Hash[3])
						src, _ := evSrc(i)
						got, err := h.readBytes(i)
						require.NoError(t, err)
						require.Equal(t, src, got)
					}
					if !c.lastGood {
						_, err := h.readBytes(4)
						require.ErrorIs(t, err, messages.ErrNotFound, "the torn block is never served")
					}
					_, _, sealed := readFooterOf(t, segs[0])
					require.True(t, sealed, "the scan sealed what it recovered")
				})
			}
		})
	}
}

// A bad record in the middle of a segment being written (a write cut short
// before one that landed) is skipped; the records after it are kept.
func TestSegmentsBadRecordMidSegment(t *testing.T) {
	root := t.TempDir()
	cfg := Config{Root: root, Layout: LayoutSegments}
	t.Run("crash", func(t *testing.T) {
		h := openTierWith(t, cfg, harnessOpts{crash: true})
		for i := range 5 {
			h.write(i, nil)
		}
	})
	flipByte(t, root, benchKey(2), -1)
	h := openTier(t, cfg)
	assert.ElementsMatch(t, []messages.Key{benchKey(0), benchKey(1), benchKey(3), benchKey(4)}, h.Inventory())
	assert.Zero(t, h.tier.scan.Torn)
	assert.Equal(t, 1, h.tier.scan.Removed)
	for _, i := range []int{0, 1, 3, 4} {
		src, _ := evSrc(i)
		h.readsAs(i, src)
	}
}

// Eviction takes whole segments, least recently used first, announces
// every block in one as removed, and keeps the bytes of the segments — in
// the index and on disk — within the capacity.
func TestSegmentsEvictWholeSegmentsWithinCapacity(t *testing.T) {
	root := t.TempDir()
	seg := segOverhead + 4*recCost(nil)
	capacity := 8 * seg
	h := openTierWith(t, Config{Root: root, Layout: LayoutSegments, Capacity: capacity, SegmentBytes: seg}, harnessOpts{})
	const n = 48
	for i := range n {
		src, _ := evSrc(i)
		require.NoError(t, h.tryWrite(i, src, nil))
		st := h.stats()
		require.LessOrEqual(t, st.Bytes, capacity, "after write %d", i)
	}
	var removed [][]messages.Key
	for stored := 0; stored < n; {
		switch e := h.Next(); e.Kind {
		case messages.BlockRemoved:
			removed = append(removed, e.Keys)
		case messages.BlockStored:
			stored++
		}
	}
	require.NotEmpty(t, removed)
	for j, keys := range removed {
		assert.Equal(t, keysOfRange(4*j, 4*j+4), keys, "eviction %d: a whole segment, oldest first", j)
	}
	st := h.quiesce()
	assert.Equal(t, uint64(4*len(removed)), st.Evictions)
	assert.Equal(t, n-4*len(removed), st.Blocks)
	require.NoError(t, h.tier.segs.checkInvariants())
	_, onDisk := segFiles(t, root)
	assert.LessOrEqual(t, onDisk, capacity, "segment files within the capacity")
	for i := range n {
		src, _ := evSrc(i)
		got, err := h.readBytes(i)
		if i < 4*len(removed) {
			require.ErrorIs(t, err, messages.ErrNotFound, "block %d evicted", i)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, src, got)
	}
	// Reading a block makes its segment most recent: the next eviction
	// passes it by.
	oldest := 4 * len(removed)
	_, err := h.readBytes(oldest)
	require.NoError(t, err)
	for i := n; i < n+4; i++ {
		src, _ := evSrc(i)
		require.NoError(t, h.tryWrite(i, src, nil))
	}
	var next []messages.Key
	for i := n; i < n+4; i++ {
		next = append(next, h.removedUntilStored(benchKey(i))...)
	}
	assert.Equal(t, keysOfRange(oldest+4, oldest+8), next)
}

// Block files of the files layout are served after switching to segments:
// introduced with their provenance, read, deleted and evicted one by one,
// while new blocks go to segments.
func TestSegmentsReadThroughBlockFiles(t *testing.T) {
	root := t.TempDir()
	writeBlocks(t, "files", Config{Root: root, Layout: LayoutFiles}, 6, harnessOpts{})
	require.Equal(t, 6, blockFiles(t, root))
	// Room for the six block files and two one-block segments, and then a
	// third segment once two block files are gone: a segment of one block
	// takes more room than a block file (its header and footer, and a
	// filesystem block of rounding for each of its two regions).
	file, seg := FileSize(evBlock, provOf(1)), segOverhead+recCost(provOf(1))
	capacity := 4*file + 3*seg + file/2
	h := openTier(t, Config{Root: root, Layout: LayoutSegments, Capacity: capacity})
	assert.ElementsMatch(t, keysOfRange(0, 6), h.Inventory())
	e := h.Next()
	require.Equal(t, messages.BlockWriting, e.Kind)
	e = h.Next()
	require.Equal(t, messages.BlockStored, e.Kind)
	require.Len(t, e.Keys, 6)
	for i, k := range e.Keys {
		assert.Equal(t, provOf(int(k.Hash[3])), e.Prov[i], "introduced with its header's provenance")
	}
	for i := range 6 {
		r := h.read(i)
		require.NoError(t, r.Err)
		assert.Equal(t, provOf(i), r.Prov)
	}
	// New blocks go to segments; the capacity then evicts the least
	// recently used block files: two go.
	h.write(10, provOf(10))
	h.write(11, provOf(11))
	require.Empty(t, h.removedUntilStored(benchKey(11)))
	assert.Equal(t, 6, blockFiles(t, root), "no block file written")
	h.write(12, provOf(12))
	assert.Equal(t, keysOfRange(0, 2), h.removedUntilStored(benchKey(12)))
	for _, i := range []int{0, 1} {
		_, ok := findBlock(t, root, benchKey(i))
		assert.False(t, ok, "its file removed before the write")
	}
	// A bad copy deleted: its file goes.
	h.System.Root.Send(h.PID, &tiermsg.Delete{Key: benchKey(3)})
	e = h.Next()
	require.Equal(t, messages.BlockRemoved, e.Kind)
	h.quiesce()
	_, ok := findBlock(t, root, benchKey(3))
	assert.False(t, ok)
	assert.Equal(t, 3, blockFiles(t, root))
	for _, i := range []int{2, 4, 5, 10, 11, 12} {
		src, _ := evSrc(i)
		h.readsAs(i, src)
	}
	assert.LessOrEqual(t, h.stats().Bytes, capacity)
}

func TestOpenRejectsAnUnknownLayout(t *testing.T) {
	_, err := Open(Config{Root: t.TempDir(), MaxBlockBytes: evBlock, Layout: "log"})
	require.ErrorIs(t, err, messages.ErrBadConfig)
	require.NoError(t, ValidLayout(""))
	require.NoError(t, ValidLayout(LayoutSegments))
}

// readFooterOf reads a segment file's footer: its offsets, where its
// records (version 2: blocks) end, and whether it has a valid one.
func readFooterOf(t *testing.T, path string) ([]int64, int64, bool) {
	t.Helper()
	info, err := os.Stat(path)
	require.NoError(t, err)
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var b [segHeaderSize]byte
	_, err = f.ReadAt(b[:], 0)
	require.NoError(t, err)
	head, ok := decodeSegHeader(b[:])
	require.True(t, ok)
	offs, _, end, sealed, err := readFooter(f, head, info.Size())
	require.NoError(t, err)
	return offs, end, sealed
}

func flipAt(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	var b [1]byte
	_, err = f.ReadAt(b[:], off)
	require.NoError(t, err)
	b[0] ^= 0x5a
	_, err = f.WriteAt(b[:], off)
	require.NoError(t, err)
}

// A capacity that shrank since the segments were written keeps the newest
// segments that fit and removes the others' files.
func TestSegmentsCapacityShrankKeepsTheNewest(t *testing.T) {
	root := t.TempDir()
	seg := segOverhead + 2*recCost(nil)
	t.Run("write", func(t *testing.T) {
		h := openTier(t, Config{Root: root, Layout: LayoutSegments, SegmentBytes: seg})
		for i := range 12 {
			h.write(i, nil)
		}
	})
	segs, _ := segFiles(t, root)
	require.Len(t, segs, 6)
	h := openTier(t, Config{Root: root, Layout: LayoutSegments, Capacity: 3 * seg})
	assert.ElementsMatch(t, keysOfRange(6, 12), h.Inventory())
	segs, onDisk := segFiles(t, root)
	assert.Len(t, segs, 3)
	assert.LessOrEqual(t, onDisk, 3*seg)
	assert.Equal(t, 3, h.stats().ScanRemoved)
}

// A segment that cannot be opened at start (EIO, out of descriptors) is
// neither served nor removed: the next start serves it.
func TestSegmentsUnreadableAtStartIsKept(t *testing.T) {
	root := t.TempDir()
	writeBlocks(t, "write", Config{Root: root, Layout: LayoutSegments}, 3, harnessOpts{})
	segs, _ := segFiles(t, root)
	require.Len(t, segs, 1)
	faulty := NewFaulty(OS{})
	faulty.Inject(func(op Op, path string) error {
		if op == OpOpen && path == segs[0] {
			return syscall.EIO
		}
		return nil
	})
	t.Run("unreadable", func(t *testing.T) {
		h := openTier(t, Config{Root: root, Layout: LayoutSegments, FS: faulty})
		assert.Empty(t, h.Inventory())
		assert.Equal(t, 1, h.tier.scan.Skipped)
		assert.Zero(t, h.tier.scan.Removed)
	})
	h := openTier(t, Config{Root: root, Layout: LayoutSegments})
	assert.ElementsMatch(t, keysOfRange(0, 3), h.Inventory(), "served once readable again")
}

// A seal that fails is counted (ChoreFailures), and loses nothing: the
// segment is read as it is, and walked and sealed at the next start.
func TestSegmentsFailedSealCountedNothingLost(t *testing.T) {
	root := t.TempDir()
	faulty := NewFaulty(OS{})
	cfg := Config{Root: root, Layout: LayoutSegments, FS: faulty, SegmentBytes: segOverhead + 2*recCost(nil)}
	t.Run("write", func(t *testing.T) {
		h := openTier(t, cfg)
		h.write(0, nil)
		h.write(1, nil) // segment 1 full
		first := segPath(root, 1)
		faulty.Inject(func(op Op, path string) error {
			if op == OpWrite && path == first {
				return syscall.EIO
			}
			return nil
		})
		h.write(2, nil) // rolls: segment 1's seal is due, and fails
		s := h.quiesce()
		assert.Equal(t, uint64(1), s.ChoreFailures)
		_, _, sealed := readFooterOf(t, first)
		assert.False(t, sealed)
		for i := range 3 {
			src, _ := evSrc(i)
			h.readsAs(i, src)
		}
	})
	h := openTier(t, Config{Root: root, Layout: LayoutSegments, SegmentBytes: cfg.SegmentBytes})
	assert.ElementsMatch(t, keysOfRange(0, 3), h.Inventory())
	assert.Zero(t, h.tier.scan.Torn)
	assert.Zero(t, h.stats().ChoreFailures)
}

// An entry that decodes but names no block slot (a bug's, or a bit flip
// its checksum missed) in a segment being written is skipped; the walk
// goes on to the entries after it.
func TestSegmentsEntryOutOfItsSlotsSkipped(t *testing.T) {
	root := t.TempDir()
	cfg := Config{Root: root, Layout: LayoutSegments}
	crashAfterWriting(t, cfg, 4)
	sp, ok := findBlock(t, root, benchKey(2))
	require.True(t, ok)
	f, err := os.OpenFile(sp.path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(encodeEntryHead(sp.data+1), sp.entry) // NB: a valid head, a block between slots
	require.NoError(t, err)
	require.NoError(t, f.Close())

	h := openTier(t, cfg)
	assert.ElementsMatch(t, []messages.Key{benchKey(0), benchKey(1), benchKey(3)}, h.Inventory())
	assert.Equal(t, 1, h.tier.scan.Removed)
	assert.Zero(t, h.tier.scan.Torn)
	src, _ := evSrc(3)
	h.readsAs(3, src)
}

// A segment's first write failing leaves no segment header; the next write
// puts it, so that a crash before the seal does not lose the segment.
func TestSegmentsHeaderWrittenAfterAFailedFirstWrite(t *testing.T) {
	root := t.TempDir()
	faulty := NewFaulty(OS{})
	var failed atomic.Bool
	faulty.Inject(func(op Op, _ string) error {
		if op == OpWrite && failed.CompareAndSwap(false, true) {
			return syscall.EIO
		}
		return nil
	})
	t.Run("crash", func(t *testing.T) {
		h := openTierWith(t, Config{Root: root, Layout: LayoutSegments, FS: faulty}, harnessOpts{crash: true})
		src, _ := evSrc(0)
		require.Error(t, h.tryWrite(0, src, nil), "the segment's first write")
		h.write(1, nil)
		h.write(2, nil)
	})
	h := openTier(t, Config{Root: root, Layout: LayoutSegments})
	assert.ElementsMatch(t, keysOfRange(1, 3), h.Inventory())
}

// A block of another size than the tier's is refused, never stored: the
// scan would drop it, and in a segment it would shift every later slot.
func TestFSRefusesABlockOfAnotherSize(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout string) {
		h := openTier(t, Config{Root: t.TempDir(), Layout: layout})
		require.ErrorIs(t, h.tryWrite(0, make([]byte, evBlock+1), nil), messages.ErrBadRequest)
		h.write(1, nil)
		assert.Equal(t, []messages.Key{benchKey(1)}, h.Inventory())
		assert.Equal(t, uint64(1), h.stats().WriteFailures)
	})
}

// A slot whose bytes do not match its committed checksum is refused and
// never stored: not readable, not announced, not found at the next start
// — also in a segment, where its bytes are written before they are summed
// and only the entry is held back (the first write of a segment
// included: a later one carries the header).
func TestFSSlotNotMatchingItsChecksumNeverStored(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout string) {
		root := t.TempDir()
		cfg := Config{Root: root, Layout: layout}
		t.Run("crash", func(t *testing.T) {
			h := openTierWith(t, cfg, harnessOpts{crash: true})
			src, sum := evSrc(0)
			err := h.Ask(&tiermsg.Write{Key: benchKey(0), Src: src, Checksum: sum + 1}).(*tiermsg.WriteResult).Err
			require.ErrorIs(t, err, messages.ErrChecksum)
			h.write(1, nil)
			_, err = h.readBytes(0)
			require.ErrorIs(t, err, messages.ErrNotFound)
			assert.Equal(t, []messages.Key{benchKey(1)}, h.Inventory())
		})
		h := openTier(t, cfg)
		assert.Equal(t, []messages.Key{benchKey(1)}, h.Inventory(), "found at start")
		h.readsAs(1, first(evSrc(1)))
	})
}

func first[A, B any](a A, _ B) A { return a }

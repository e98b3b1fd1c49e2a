package fs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
)

// stats asks the tier its counters.
func (h *fsHarness) stats() messages.SecondaryStats {
	h.T.Helper()
	return h.Ask(&messages.TierStatsQuery{Corr: 1}).(*messages.TierStatsReply).Stats
}

// quiesce waits until the tier has no I/O queued or running: every chore
// due was submitted at the end of the message before, so none is left.
func (h *fsHarness) quiesce() messages.SecondaryStats {
	h.T.Helper()
	for {
		if s := h.stats(); s.InFlight == 0 {
			return s
		}
		require.NoError(h.T, h.Ctx.Err(), "tier never quiet")
	}
}

// span is where a stored block lies: its file, and the record's offset and
// size in it.
type span struct {
	path      string
	off, size int64
}

// findBlock finds k's stored block under root, by reading the files as the
// start-up scan would: a sealed segment's records at the offsets its footer
// lists, an unsealed one's back to back from its header, else k's block
// file.
func findBlock(t *testing.T, root string, k messages.Key) (span, bool) {
	t.Helper()
	segs, _ := filepath.Glob(filepath.Join(root, segDirName, "*"+segExt))
	var found span
	ok := false
	for _, p := range segs {
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		if offs, _, sealed := readFooterOf(t, p); sealed {
			for _, off := range offs {
				if h, err := blockfmt.Decode(data[off:]); err == nil && h.Key == k {
					found, ok = span{path: p, off: off, size: h.Size()}, true
				}
			}
			continue
		}
		for off := int64(segHeaderSize); off+headerSize <= int64(len(data)); {
			h, err := blockfmt.Decode(data[off:])
			if err != nil {
				break
			}
			if h.Key == k {
				found, ok = span{path: p, off: off, size: h.Size()}, true // NB: the last copy wins
			}
			off += h.Size()
		}
	}
	if ok {
		return found, true
	}
	p := NewStore(OS{}, root, false).Path(k)
	if info, err := os.Stat(p); err == nil {
		return span{path: p, size: info.Size()}, true
	}
	return span{}, false
}

// flipByte flips the byte at (from the record's end, if negative) in k's
// stored block.
func flipByte(t *testing.T, root string, k messages.Key, at int64) {
	t.Helper()
	sp, ok := findBlock(t, root, k)
	require.True(t, ok, "%v stored", k)
	if at < 0 {
		at += sp.size
	}
	f, err := os.OpenFile(sp.path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	var b [1]byte
	_, err = f.ReadAt(b[:], sp.off+at)
	require.NoError(t, err)
	b[0] ^= 1
	_, err = f.WriteAt(b[:], sp.off+at)
	require.NoError(t, err)
}

// segFiles lists the segment files under root and their total size.
func segFiles(t *testing.T, root string) ([]string, int64) {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(root, segDirName, "*"+segExt))
	require.NoError(t, err)
	var total int64
	for _, p := range segs {
		info, err := os.Stat(p)
		require.NoError(t, err)
		total += info.Size()
	}
	return segs, total
}

// blockFiles counts the block files under root.
func blockFiles(t *testing.T, root string) int {
	t.Helper()
	n := 0
	require.NoError(t, filepath.WalkDir(root, func(_ string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() && filepath.Ext(e.Name()) == blockExt {
			n++
		}
		return err
	}))
	return n
}

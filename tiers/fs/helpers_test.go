package fs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// stats asks the tier its counters.
func (h *fsHarness) stats() messages.SecondaryStats {
	h.T.Helper()
	return h.Ask(&tiermsg.StatsQuery{Corr: 1}).(*tiermsg.StatsReply).Stats
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

// span is where a stored block lies: its file; where its entry starts (a
// version 2 segment's; else where its header does); where its header
// starts and its length with the provenance section; where its block
// starts and its length.
type span struct {
	path               string
	entry, hdr, hdrLen int64
	data, block        int64
}

// findBlock finds k's stored block under root, by reading the files as the
// start-up scan would: a sealed segment's entries at the offsets its
// footer lists, an unsealed one's back to back from its header, else k's
// block file.
func findBlock(t *testing.T, root string, k messages.Key) (span, bool) {
	t.Helper()
	segs, _ := filepath.Glob(filepath.Join(root, segDirName, "*"+segExt))
	var found span
	ok := false
	for _, p := range segs {
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		head, valid := decodeSegHeader(data)
		require.True(t, valid, p)
		at := func(off int64) (span, bool) { // the record at off, and whether it is k's
			if head.version == segV1 {
				h, err := blockfmt.Decode(data[off:])
				if err != nil {
					return span{}, false
				}
				return span{path: p, entry: off, hdr: off, hdrLen: h.BlockOffset(), data: off + h.BlockOffset(), block: h.Length}, h.Key == k
			}
			block, valid := decodeEntryHead(data[off:])
			h, err := blockfmt.Decode(data[off+entryHead:])
			if !valid || err != nil {
				return span{}, false
			}
			return span{path: p, entry: off, hdr: off + entryHead, hdrLen: h.BlockOffset(), data: block, block: h.Length}, h.Key == k
		}
		if offs, _, sealed := readFooterOf(t, p); sealed {
			for _, off := range offs {
				if sp, is := at(off); is {
					found, ok = sp, true
				}
			}
			continue
		}
		for off := int64(segHeaderSize); off+entryHead+headerSize <= int64(len(data)); {
			sp, is := at(off)
			if sp.block == 0 {
				break // a header that does not decode: the walk's end
			}
			if is {
				found, ok = sp, true // NB: the last copy wins
			}
			off = sp.hdr + sp.hdrLen
			if head.version == segV1 {
				off += sp.block
			} else {
				off = sp.entry + entrySize(sp.hdrLen)
			}
		}
	}
	if ok {
		return found, true
	}
	p := NewStore(OS{}, root, false).Path(k)
	if info, err := os.Stat(p); err == nil {
		return span{path: p, hdrLen: info.Size() - evBlock, data: info.Size() - evBlock, block: evBlock}, true
	}
	return span{}, false
}

// flipByte flips the byte at (counted from the header's start through the
// provenance section into the block; from the block's end if negative) in
// k's stored block.
func flipByte(t *testing.T, root string, k messages.Key, at int64) {
	t.Helper()
	sp, ok := findBlock(t, root, k)
	require.True(t, ok, "%v stored", k)
	switch {
	case at < 0:
		at += sp.data + sp.block
	case at < sp.hdrLen:
		at += sp.hdr
	default:
		at += sp.data - sp.hdrLen
	}
	flipAt(t, sp.path, at)
}

// segFiles lists the segment files under root and the bytes they take on
// disk (a hole takes none).
func segFiles(t *testing.T, root string) ([]string, int64) {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(root, segDirName, "*"+segExt))
	require.NoError(t, err)
	var total int64
	for _, p := range segs {
		info, err := os.Stat(p)
		require.NoError(t, err)
		total += info.Sys().(*syscall.Stat_t).Blocks * 512
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

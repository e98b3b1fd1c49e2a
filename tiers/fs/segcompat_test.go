package fs

// Version 1 segments (earlier builds: records back to back from the
// header, footer "KVTSEAL1") under a tier of the segments layout: read,
// recovered as version 1 when unsealed, checked on read and evicted whole,
// never written to — new blocks go to new version 2 segments.

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
)

// v1Record is k's record in a version 1 segment: the stored block exactly
// as a block file holds it (header, provenance p, then src).
func v1Record(k messages.Key, src []byte, p *messages.Provenance) []byte {
	prefix, _ := blockfmt.Prefix(k, len(src), crcOf(src), p)
	return append(prefix, src...)
}

// v1Segment is version 1 segment id holding recs back to back from its
// header, and their offsets; sealed adds the footer listing them.
func v1Segment(id uint64, recs [][]byte, sealed bool) ([]byte, []int64) {
	b := encodeSegHeaderV1(id)
	offs := make([]int64, len(recs))
	for i, r := range recs {
		offs[i] = int64(len(b))
		b = append(b, r...)
	}
	if sealed {
		b = append(b, encodeFooter(segV1, id, 0, offs)...)
	}
	return b, offs
}

// writeV1Segment writes, as an earlier build did, version 1 segment id
// under root holding blocks 0..n-1 (evSrc, provOf): its path and the
// records' offsets.
func writeV1Segment(t *testing.T, root string, id uint64, n int, sealed bool) (string, []int64) {
	t.Helper()
	recs := make([][]byte, n)
	for i := range recs {
		src, _ := evSrc(i)
		recs[i] = v1Record(benchKey(i), src, provOf(i))
	}
	data, offs := v1Segment(id, recs, sealed)
	path := segPath(root, id)
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, data, 0o644))
	return path, offs
}

// segHeaderOf decodes the header of the segment file at path.
func segHeaderOf(t *testing.T, path string) segHead {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	head, ok := decodeSegHeader(data)
	require.True(t, ok, "%s: a valid segment header", path)
	return head
}

// readFile reads path whole.
func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// servesV1 checks that each block of is is served byte-exact, with the
// provenance its record holds.
func (h *fsHarness) servesV1(is ...int) {
	h.T.Helper()
	for _, i := range is {
		r := h.read(i)
		require.NoError(h.T, r.Err, "block %d", i)
		src, sum := evSrc(i)
		assert.Equal(h.T, sum, r.Checksum, "block %d", i)
		assert.Equal(h.T, provOf(i), r.Prov, "block %d: its record's provenance", i)
		got, err := h.readBytes(i)
		require.NoError(h.T, err, "block %d", i)
		require.Equal(h.T, src, got, "block %d", i)
	}
}

// A sealed version 1 segment is served as it is: every block byte-exact
// with its provenance. New blocks go to a new version 2 segment with a
// higher id — never appended to the old one, whose bytes stay as written.
func TestSegmentsV1SealedServedNeverWritten(t *testing.T) {
	root := t.TempDir()
	const v1ID = 5
	path, _ := writeV1Segment(t, root, v1ID, 4, true)
	before := readFile(t, path)
	cfg := Config{Root: root, Layout: LayoutSegments}
	t.Run("open", func(t *testing.T) {
		h := openTier(t, cfg)
		assert.ElementsMatch(t, keysOfRange(0, 4), h.Inventory())
		assert.Zero(t, h.tier.scan.Torn)
		assert.Zero(t, h.tier.scan.Removed, "every record's header checks out")
		h.servesV1(0, 1, 2, 3)
		h.write(10, provOf(10))
		h.write(11, provOf(11))
		h.quiesce()
		require.Equal(t, before, readFile(t, path), "the version 1 segment is never written to")
		assertOneNewV2Segment(t, root, path, v1ID)
		h.readsAs(10, srcOf(10))
		h.readsAs(11, srcOf(11))
	})
	// NB: after the close too, which seals the segment being written: a
	// seal of the found segment (as version 2) would show here.
	require.Equal(t, before, readFile(t, path), "the close leaves the version 1 segment alone")
	assertOneNewV2Segment(t, root, path, v1ID)

	h := openTier(t, cfg)
	assert.ElementsMatch(t, append(keysOfRange(0, 4), benchKey(10), benchKey(11)), h.Inventory())
	h.servesV1(0, 1, 2, 3, 10, 11)
}

// assertOneNewV2Segment checks that root holds, beside the version 1
// segment at v1Path, one segment: version 2, with an id above v1ID.
func assertOneNewV2Segment(t *testing.T, root, v1Path string, v1ID uint64) {
	t.Helper()
	segs, _ := segFiles(t, root)
	require.Len(t, segs, 2, "the old segment and one new one")
	newPath := segs[0]
	if newPath == v1Path {
		newPath = segs[1]
	}
	id, ok := parseSegName(filepath.Base(newPath))
	require.True(t, ok, newPath)
	assert.Greater(t, id, v1ID, "ids are never reused: the new segment's is past the old one's")
	head := segHeaderOf(t, newPath)
	assert.Equal(t, segV2, head.version, "writers write version 2")
	assert.Equal(t, id, head.id)
	assert.Equal(t, segV1, segHeaderOf(t, v1Path).version)
}

// srcOf is block i's bytes.
func srcOf(i int) []byte {
	src, _ := evSrc(i)
	return src
}

// An unsealed version 1 segment whose last record was cut short mid-block
// (a crash of an earlier build) is walked as version 1 records: the blocks
// before the torn one are served, the torn one never; the file is truncated
// after the last good record and sealed as version 1, so the next open
// finds nothing torn.
func TestSegmentsV1TornTailRecoveredAsV1(t *testing.T) {
	root := t.TempDir()
	path, offs := writeV1Segment(t, root, 3, 5, false)
	last := v1Record(benchKey(4), srcOf(4), provOf(4))
	cut := offs[4] + int64(len(last)) - evBlock + 100 // 100 bytes into block 4
	require.NoError(t, os.Truncate(path, cut))
	cfg := Config{Root: root, Layout: LayoutSegments}

	var sealed []byte
	for round, name := range []string{"recover", "reopen"} {
		t.Run(name, func(t *testing.T) {
			h := openTier(t, cfg)
			assert.ElementsMatch(t, keysOfRange(0, 4), h.Inventory())
			if round == 0 {
				assert.Equal(t, 1, h.tier.scan.Torn, "the torn tail counted")
				assert.Equal(t, cut-offs[4], h.tier.scan.TornBytes, "the torn record's bytes, no more")
			} else {
				assert.Zero(t, h.tier.scan.Torn, "truncated and sealed: nothing torn the second time")
			}
			assert.Zero(t, h.tier.scan.Unsealed)
			h.servesV1(0, 1, 2, 3)
			_, err := h.readBytes(4)
			require.ErrorIs(t, err, messages.ErrNotFound, "the torn block is never served")
		})
		assertSealedV1(t, path, offs[:4], offs[4])
		if round == 0 {
			sealed = readFile(t, path)
		} else {
			assert.Equal(t, sealed, readFile(t, path), "a sealed version 1 segment is not rewritten")
		}
	}
}

// assertSealedV1 checks that the segment at path is a sealed version 1
// segment listing offs, its records ending at end.
func assertSealedV1(t *testing.T, path string, offs []int64, end int64) {
	t.Helper()
	head := segHeaderOf(t, path)
	require.Equal(t, segV1, head.version, "sealed as the version it was written in")
	gotOffs, gotEnd, sealed := readFooterOf(t, path)
	require.True(t, sealed, "the scan sealed what it recovered")
	assert.Equal(t, offs, gotOffs)
	assert.Equal(t, end, gotEnd, "truncated after the last good record")
	data := readFile(t, path)
	assert.Equal(t, encodeFooter(segV1, head.id, 0, offs), data[end:], "a version 1 footer right after the records")
}

// A corrupt byte in a version 1 block is not seen by the start-up scan of
// a sealed segment (it checks headers), but is caught on read: the read
// fails ErrInvalidBlock, the block is dropped (gone from the inventory,
// ErrNotFound after), and the segment's other blocks are still served.
func TestSegmentsV1CorruptBlockCaughtOnRead(t *testing.T) {
	root := t.TempDir()
	writeV1Segment(t, root, 2, 4, true)
	flipByte(t, root, benchKey(2), -1) // block 2's last byte
	h := openTier(t, Config{Root: root, Layout: LayoutSegments})
	assert.ElementsMatch(t, keysOfRange(0, 4), h.Inventory(), "the scan of a sealed segment reads headers, not blocks")

	r := h.read(2)
	require.ErrorIs(t, r.Err, messages.ErrInvalidBlock)
	require.ErrorIs(t, r.Err, messages.ErrChecksum, "the block's checksum, not its header, failed")
	assert.ElementsMatch(t, []messages.Key{benchKey(0), benchKey(1), benchKey(3)}, h.Inventory())
	_, err := h.readBytes(2)
	require.ErrorIs(t, err, messages.ErrNotFound, "a bad copy is read once")
	assert.Equal(t, uint64(1), h.stats().Invalid)
	h.servesV1(0, 1, 3)
}

// A version 1 segment is evicted whole, as a version 2 one is: least
// recently used first, every block in it announced removed, its file
// removed.
func TestSegmentsV1EvictedWhole(t *testing.T) {
	root := t.TempDir()
	path, _ := writeV1Segment(t, root, 1, 4, true)
	info, err := os.Stat(path)
	require.NoError(t, err)
	// Room for the old segment and two new one-record segments, and for a
	// third new one once the old segment (smaller than a new one) is gone:
	// the third evicts the least recently used, the old segment (found
	// first, never read), and nothing else.
	seg := segOverhead + recCost(provOf(10))
	require.Less(t, info.Size(), seg)
	capacity := 3*seg + info.Size()/2
	h := openTier(t, Config{Root: root, Layout: LayoutSegments, Capacity: capacity})
	assert.ElementsMatch(t, keysOfRange(0, 4), h.Inventory())
	h.write(10, provOf(10))
	h.write(11, provOf(11))
	require.Empty(t, h.removedUntilStored(benchKey(11)))
	h.write(12, provOf(12))
	assert.Equal(t, keysOfRange(0, 4), h.removedUntilStored(benchKey(12)), "the whole segment, in record order")
	_, err = os.Stat(path)
	require.ErrorIs(t, err, os.ErrNotExist, "its file removed before the write")
	for i := range 4 {
		_, err := h.readBytes(i)
		require.ErrorIs(t, err, messages.ErrNotFound, "block %d evicted", i)
	}
	for _, i := range []int{10, 11, 12} {
		h.readsAs(i, srcOf(i))
	}
	st := h.quiesce()
	assert.Equal(t, uint64(4), st.Evictions)
	assert.LessOrEqual(t, st.Bytes, capacity)
	require.NoError(t, h.tier.segs.checkInvariants())
}

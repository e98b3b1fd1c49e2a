package fs

// The start-up scan of a segment file holding any bytes: it never panics,
// never returns a record it could not serve (a key that is not blockfmt.Storable,
// bytes outside the file or its regions), never grows the file by more
// than a footer, and leaves a segment that a second scan finds whole —
// the same records, nothing torn, nothing removed, nothing written.

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
)

// fuzzBlock is the tier's block size in the fuzz test: small, so the
// mutator's inputs stay a few KiB (a version 2 segment's data region
// starts at 4 KiB at the least).
const fuzzBlock = 64

// fuzzSrc is block i's bytes in the seeds.
func fuzzSrc(i int) []byte {
	b := make([]byte, fuzzBlock)
	for j := range b {
		b[j] = byte(i*31 + j)
	}
	return b
}

// fuzzProv is block i's provenance in the seeds: none for block 0, so a
// record without a provenance section is seeded too.
func fuzzProv(i int) *messages.Provenance {
	if i == 0 {
		return nil
	}
	return provOf(i)
}

// v2Seed is segment 1 holding n blocks, written through the tier's write
// path: each record reserved as segLog reserves it (entries back to back
// from the header, blocks slot by slot from the data region's start, the
// entry region sized by entriesFor — for a target of n blocks, so the data
// region starts at 4 KiB), written by Store.writeRecord, and with seal
// sealed by Store.sealSegment as the seal chore does. It returns the
// segment, its data region's start and its entries' offsets.
func v2Seed(f *testing.F, n int, seal bool) ([]byte, int64, []int64) {
	f.Helper()
	root := f.TempDir()
	s := NewStore(OS{}, root, false)
	defer s.segs.closeAll()
	require.NoError(f, os.MkdirAll(filepath.Join(root, segDirName), 0o755))
	entry := func(i int) int64 { return entrySize(FileSize(fuzzBlock, fuzzProv(i)) - fuzzBlock) }
	base := entriesFor(int64(n*fuzzBlock), fuzzBlock, entry(0))
	off, offs := int64(segHeaderSize), make([]int64, n)
	for i := range n {
		w := recordWrite{id: 1, header: i == 0, dataBase: base, off: off, size: entry(i), data: base + int64(i)*fuzzBlock}
		src := fuzzSrc(i)
		require.NoError(f, s.writeRecord(w, benchKey(i), src, crcOf(src), fuzzProv(i)))
		offs[i], off = off, off+w.size
	}
	if seal {
		h := segHead{id: 1, version: segV2, dataBase: base}
		require.NoError(f, s.sealSegment(h, off, base+int64(n)*fuzzBlock, offs))
	}
	b, err := os.ReadFile(segPath(root, 1))
	require.NoError(f, err)
	return b, base, offs
}

// v1Seed is version 1 segment 1 holding n blocks, built by hand as an
// earlier build wrote it, and its records' offsets; cut drops that many
// bytes from the last record (the footer still lists it).
func v1Seed(n int, seal bool, cut int) ([]byte, []int64) {
	recs := make([][]byte, n)
	for i := range recs {
		recs[i] = v1Record(benchKey(i), fuzzSrc(i), fuzzProv(i))
	}
	recs[n-1] = recs[n-1][:len(recs[n-1])-cut]
	return v1Segment(1, recs, seal)
}

// flipped is b with the byte at i (from the end if negative) flipped.
func flipped(b []byte, i int) []byte {
	c := append([]byte(nil), b...)
	if i < 0 {
		i += len(c)
	}
	c[i] ^= 0x5a
	return c
}

// patched is b with p written at off. The seeds that patch in a header,
// entry head or footer encoded whole (checksum and all) are well-formed
// but wrong: past every checksum, which the mutator cannot forge.
func patched(b []byte, off int64, p []byte) []byte {
	c := append([]byte(nil), b...)
	copy(c[off:], p)
	return c
}

// scanSeeds are valid segments of both versions, sealed and not, and the
// ways they go bad: torn tails, torn footers, flipped bytes in headers,
// entries, blocks and footers; and well-formed lies: entries naming blocks
// out of their slots or past the end, a footer listing a record cut
// short, a data region off its page.
func scanSeeds(f *testing.F) [][]byte {
	sealed2, base, offs2 := v2Seed(f, 3, true)
	open2, _, _ := v2Seed(f, 3, false)
	sealed1, offs1 := v1Seed(3, true, 0)
	open1, _ := v1Seed(3, false, 0)
	cut1, _ := v1Seed(3, true, fuzzBlock) // record 2's block missing
	dataEnd := base + 3*fuzzBlock
	entriesEnd := 2*offs2[2] - offs2[1] // entries 1 and 2 are the same size
	return [][]byte{
		sealed2, open2, sealed1, open1,
		sealed2[:len(sealed2)-10],                    // footer torn: recovered
		open2[:len(open2)-fuzzBlock/2],               // last block torn
		open1[:len(open1)-fuzzBlock/2],               // last record torn
		flipped(sealed2, int(base)+fuzzBlock),        // block 1: caught on read, not by the scan
		flipped(open2, int(base)+fuzzBlock),          // block 1: a bad record mid-segment
		flipped(sealed2, segHeaderSize+entryHead+30), // entry 0's header
		flipped(open2, segHeaderSize+3),              // entry 0's head
		flipped(sealed2, -20),                        // the footer's checksum
		flipped(sealed1, -20),
		flipped(sealed1, int(offs1[1])+3), // record 1's header
		flipped(open1, -1),                // the last block
		flipped(sealed2, 17),              // the header's data region start
		sealed2[:segHeaderSize], sealed1[:segHeaderSize],
		{},
		patched(sealed2, offs2[1], encodeEntryHead(base+fuzzBlock/2)), // a block off its slot
		patched(sealed2, offs2[2], encodeEntryHead(dataEnd)),          // a block past the data region
		patched(open2, offs2[2], encodeEntryHead(dataEnd+fuzzBlock)),  // a block past the file
		patched(open2, offs2[1], encodeEntryHead(base-fuzzBlock)),     // a block in the entry region
		patched(sealed2, 0, encodeSegHeader(1, base+fuzzBlock)),       // a data region off its page
		patched(sealed2, 0, encodeSegHeader(2, base)),                 // another segment's header
		patched(sealed2, 0, encodeSegHeaderV1(1)),                     // version 1's header on version 2
		refooted(sealed2, dataEnd, entriesEnd, offs2[0], offs2[2]),    // a dead record left out
		refooted(sealed2, dataEnd, base+1, offs2...),                  // entries past the data region
		patched(sealed2, offs2[1], encodeEntryHead(base-fuzzBlock)),   // in the entry region, listed
		entryInDataRegion(sealed2, offs2, dataEnd),
		cut1, // a listed record past the records' end
	}
}

// refooted is sealed (a sealed segment whose blocks end at dataEnd) with
// its footer replaced by one listing offs, the entries ending at
// entriesEnd.
func refooted(sealed []byte, dataEnd, entriesEnd int64, offs ...int64) []byte {
	return append(sealed[:dataEnd:dataEnd], encodeFooter(segV2, 1, entriesEnd, offs)...)
}

// entryInDataRegion is sealed (a sealed segment whose entries are at offs
// and whose blocks end at dataEnd) with a copy of its first entry after its
// blocks, listed by a footer whose entries end past the data region's
// start.
func entryInDataRegion(sealed []byte, offs []int64, dataEnd int64) []byte {
	entry := sealed[offs[0]:offs[1]]
	b := append(sealed[:dataEnd:dataEnd], entry...)
	listed := append(slices.Clone(offs), dataEnd)
	return append(b, encodeFooter(segV2, 1, dataEnd+int64(len(entry)), listed)...)
}

// FuzzScanSegment writes its input as segment 1 and runs the start-up
// scan over it, twice.
func FuzzScanSegment(f *testing.F) {
	for _, seed := range scanSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		root := t.TempDir()
		path := segPath(root, 1)
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, data, 0o644))

		found, res := scanSegmentsOf(t, root)
		assert.Zero(t, res.Unsealed, "a bad segment is never taken for an I/O error")
		after, kept := fileOf(t, path)
		require.Equal(t, len(found) == 1, kept, "a segment is kept exactly when the scan returns it")
		if !kept {
			return
		}
		seg := found[0]
		head, ok := decodeSegHeader(after)
		require.True(t, ok, "a kept segment has a valid header")
		require.Equal(t, uint64(1), head.id)
		assert.LessOrEqual(t, len(after), len(data)+len(seg.recs)*segEntrySize+segFooterFixed(head.version),
			"the scan grows a segment by its footer at most")
		checkRecs(t, head, seg, int64(len(after)))
		// NB: a sealed segment's records with a bad header are left out
		// (Removed) at every scan; a recovered one's footer lists good
		// records only.
		removed := 0
		if bytes.Equal(after, data) {
			removed = res.Removed
		}
		checkRescan(t, root, path, seg, after, removed)
	})
}

// scanSegmentsOf runs the start-up scan of the segments under root, with
// blocks of fuzzBlock bytes.
func scanSegmentsOf(t *testing.T, root string) ([]segFound, ScanResult) {
	t.Helper()
	var res ScanResult
	s := NewStore(OS{}, root, false)
	defer s.segs.closeAll() // NB: a seal keeps the segment open
	found, maxID, err := s.ScanSegments(fuzzBlock, &res)
	require.NoError(t, err)
	require.Equal(t, uint64(1), maxID)
	require.LessOrEqual(t, len(found), 1)
	return found, res
}

// fileOf is path's bytes, and whether it is there.
func fileOf(t *testing.T, path string) ([]byte, bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, false
	}
	require.NoError(t, err)
	return b, true
}

// checkRecs checks that every record the scan returned can be served from
// the segment (of size bytes, header head): a blockfmt.Storable key, its entry in
// the entry region and its block (of 1..fuzzBlock bytes: blocks of any size
// within the bound) in the data region, before the blocks' end (version 2),
// or its record before the records' end (version 1) — both within the
// file, before any footer.
func checkRecs(t *testing.T, head segHead, seg segFound, size int64) {
	t.Helper()
	require.LessOrEqual(t, seg.end, size)
	for _, r := range seg.recs {
		require.NoError(t, blockfmt.Storable(r.key))
		require.GreaterOrEqual(t, r.off, int64(segHeaderSize), "%+v", r)
		if head.version == segV1 {
			require.Zero(t, r.data, "a version 1 record's block is behind its header")
			require.True(t, r.length >= 1 && r.length <= fuzzBlock, "%+v: a length within the bound", r)
			require.GreaterOrEqual(t, r.size, headerSize+r.length, "%+v", r)
			require.LessOrEqual(t, r.off+r.size, seg.end, "%+v: before the records' end", r)
			continue
		}
		require.GreaterOrEqual(t, r.data, head.dataBase, "%+v", r)
		require.Zero(t, head.dataBase%segPage, "a data region on a page of its own")
		require.True(t, r.length >= 1 && r.length <= fuzzBlock, "%+v: a length within the bound", r)
		require.LessOrEqual(t, r.data+r.length, seg.end, "%+v: before the blocks' end", r)
		require.LessOrEqual(t, r.off+r.size, head.dataBase, "%+v: in the entry region", r)
	}
}

// checkRescan scans root again: what the first scan kept (and sealed if
// it was not) is found as it was, with nothing torn or written, and
// removed records as many as the footer lists bad ones.
func checkRescan(t *testing.T, root, path string, seg segFound, after []byte, removed int) {
	t.Helper()
	again, res := scanSegmentsOf(t, root)
	require.Len(t, again, 1, "a kept segment is kept again")
	assert.Equal(t, seg.recs, again[0].recs)
	assert.Equal(t, seg.end, again[0].end)
	assert.Equal(t, seg.size, again[0].size, "accounted the same")
	assert.Zero(t, res.Torn, "sealed by the first scan: nothing torn")
	assert.Equal(t, removed, res.Removed, "only the footer's records with a bad header")
	assert.Zero(t, res.Unsealed)
	now, _ := fileOf(t, path)
	assert.Equal(t, after, now, "a sealed segment is read, never written")
}

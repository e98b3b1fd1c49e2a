package fs

// The fs tier's KV events and provenance through its actor: provenance
// stored in the header comes back on read; stored, removed (evicted,
// deleted, invalid) and write notes reach the registered hub; a reopened
// tier introduces the blocks it found, parents noted before children, with
// the provenance of their headers, and answers its inventory once that is
// done; a version 1 file is still served.

import (
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
	"github.com/kvtier/kvtier/tiers/tiermsg"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const evBlock = 1024

func provOf(i int) *messages.Provenance {
	p := &messages.Provenance{BlockSize: 4, TokenIDs: []int32{int32(i), 1, 2, 3}, LoRAName: "l", ExtraKeys: []string{"salt"}}
	if i > 0 {
		p.ParentHash = []byte(benchKey(i - 1).Hash)
	}
	return p
}

// fsHarness runs an fs tier named "disk" whose hub waits for the test to
// read its events.
type fsHarness struct {
	*tiertest.Harness
	tier *Tier
}

// openTier opens cfg (named "disk", blocks of evBlock, no log) and runs it
// until the test ends.
func openTier(t *testing.T, cfg Config) *fsHarness {
	t.Helper()
	return openTierWith(t, cfg, harnessOpts{})
}

// harnessOpts vary openTierWith.
type harnessOpts struct {
	crash bool // at the end only stop the workers, as a killed process leaves the disk (no seal)
	drop  bool // the hub drops events nobody reads
}

func openTierWith(t *testing.T, cfg Config, o harnessOpts) *fsHarness {
	t.Helper()
	cfg.Name, cfg.Log = "disk", zerolog.Nop()
	if cfg.MaxBlockBytes == 0 {
		cfg.MaxBlockBytes = evBlock
	}
	tier, err := Open(cfg)
	require.NoError(t, err)
	closeTier := tier.Close
	if o.crash {
		closeTier = tier.workers.Close
	}
	h := tiertest.Start(t, tier.Props, tiertest.Options{Timeout: 30 * time.Second, Events: 1024, Drop: o.drop,
		Medium: messages.MediumStorage, Ownership: "disk", Locality: "LOCAL", Close: closeTier})
	return &fsHarness{Harness: h, tier: tier}
}

// layouts are the layouts behaviour tests run against.
var layouts = []string{LayoutFiles, LayoutSegments}

// forLayouts runs f as a subtest per layout.
func forLayouts(t *testing.T, f func(t *testing.T, layout string)) {
	for _, l := range layouts {
		t.Run(l, func(t *testing.T) { f(t, l) })
	}
}

// blockCost is the capacity one block of n bytes with provenance p takes
// in layout, stored alone (segments: a segment of one record, what a
// capacity under eight records makes).
func blockCost(layout string, n int, p *messages.Provenance) int64 {
	if layout == LayoutSegments {
		return entrySize(FileSize(n, p)-int64(n)) + int64(n) + segEntrySize + segOverhead
	}
	return FileSize(n, p)
}

func evSrc(i int) ([]byte, uint32) {
	b := make([]byte, evBlock)
	for j := range b {
		b[j] = byte(i*31 + j)
	}
	return b, crc32.Checksum(b, blockfmt.Castagnoli)
}

func (h *fsHarness) write(i int, p *messages.Provenance) {
	h.T.Helper()
	src, sum := evSrc(i)
	r := h.Ask(&tiermsg.Write{Key: benchKey(i), Src: src, Checksum: sum, Prov: p}).(*tiermsg.WriteResult)
	require.NoError(h.T, r.Err)
}

func (h *fsHarness) read(i int) *tiermsg.ReadResult {
	h.T.Helper()
	r := h.Ask(&tiermsg.Read{Key: benchKey(i), Dest: make([]byte, evBlock)}).(*tiermsg.ReadResult)
	return r
}

func TestFSAnnouncesWithProvenanceAndReadsItBack(t *testing.T) {
	forLayouts(t, testFSAnnouncesWithProvenanceAndReadsItBack)
}

func testFSAnnouncesWithProvenanceAndReadsItBack(t *testing.T, layout string) {
	root := t.TempDir()
	h := openTier(t, Config{Root: root, Capacity: 2 * blockCost(layout, evBlock, provOf(1)), Layout: layout})
	h.write(0, provOf(0))
	e := h.Next()
	assert.Equal(t, messages.BlockWriting, e.Kind)
	e = h.Next()
	assert.Equal(t, messages.BlockStored, e.Kind)
	assert.Equal(t, []messages.Key{benchKey(0)}, e.Keys)
	assert.Equal(t, []*messages.Provenance{provOf(0)}, e.Prov)

	r := h.read(0)
	require.NoError(t, r.Err)
	assert.Equal(t, provOf(0), r.Prov, "the header's provenance comes back on read")

	h.write(1, provOf(1))
	assert.Equal(t, messages.BlockWriting, h.Next().Kind)
	assert.Equal(t, messages.BlockStored, h.Next().Kind)
	// A third block evicts the least recent: 0 (read before 1 was written).
	h.write(2, provOf(2))
	e = h.Next()
	assert.Equal(t, messages.BlockRemoved, e.Kind, "eviction announced when the block becomes unreadable")
	assert.Equal(t, []messages.Key{benchKey(0)}, e.Keys)
	assert.Equal(t, messages.BlockWriting, h.Next().Kind)
	assert.Equal(t, messages.BlockStored, h.Next().Kind)
	assert.ElementsMatch(t, []messages.Key{benchKey(1), benchKey(2)}, h.Inventory())

	h.System.Root.Send(h.PID, &tiermsg.Delete{Key: benchKey(1)})
	e = h.Next()
	assert.Equal(t, messages.BlockRemoved, e.Kind)
	assert.Equal(t, []messages.Key{benchKey(1)}, e.Keys)

	// Corrupt block 2's bytes: the read fails, the block is removed and announced.
	flipByte(t, root, benchKey(2), -1)
	require.ErrorIs(t, h.read(2).Err, messages.ErrInvalidBlock)
	e = h.Next()
	assert.Equal(t, messages.BlockRemoved, e.Kind)
	assert.Equal(t, []messages.Key{benchKey(2)}, e.Keys)
	assert.Empty(t, h.Inventory())
}

// writeV1 writes k's block as the version 1 format did: no provenance.
func writeV1(t *testing.T, s *Store, k messages.Key, src []byte, sum uint32) {
	hdr := make([]byte, HeaderSize)
	copy(hdr, "KVTB")
	binary.LittleEndian.PutUint16(hdr[4:], 1)
	hdr[6], hdr[7] = byte(len(k.Namespace)), byte(len(k.Hash))
	binary.LittleEndian.PutUint32(hdr[8:], k.Group)
	binary.LittleEndian.PutUint64(hdr[12:], uint64(len(src)))
	binary.LittleEndian.PutUint32(hdr[20:], sum)
	copy(hdr[24:88], k.Namespace)
	copy(hdr[88:152], k.Hash)
	binary.LittleEndian.PutUint32(hdr[152:], crc32.Checksum(hdr[:152], blockfmt.Castagnoli))
	require.NoError(t, os.MkdirAll(filepath.Dir(s.Path(k)), 0o755))
	require.NoError(t, os.WriteFile(s.Path(k), append(hdr, src...), 0o644))
}

// Block files written by the files layout are introduced and served by
// either layout: the segments layout reads them through.
func TestReopenedFSIntroducesWhatItHolds(t *testing.T) {
	forLayouts(t, testReopenedFSIntroducesWhatItHolds)
}

func testReopenedFSIntroducesWhatItHolds(t *testing.T, layout string) {
	root := t.TempDir()
	s := NewStore(OS{}, root, false)
	const n = introBatch + 20 // more than one batch
	for i := range n {
		src, sum := evSrc(i)
		_, err := s.Write(benchKey(i), src, sum, provOf(i))
		require.NoError(t, err)
	}
	srcV1, sumV1 := evSrc(n)
	writeV1(t, s, benchKey(n), srcV1, sumV1)
	// A block whose provenance section is corrupt is removed at start.
	bad := benchKey(n + 1)
	src, sum := evSrc(n + 1)
	_, err := s.Write(bad, src, sum, provOf(n+1))
	require.NoError(t, err)
	data, err := os.ReadFile(s.Path(bad))
	require.NoError(t, err)
	data[HeaderSize+6] ^= 0xff
	require.NoError(t, os.WriteFile(s.Path(bad), data, 0o644))

	h := openTier(t, Config{Root: root, Layout: layout})
	inv := h.Inventory() // answered once every block found is introduced
	assert.Len(t, inv, n+1, "the corrupt block is gone")
	assert.NotContains(t, inv, bad)

	e := h.Next()
	require.Equal(t, messages.BlockWriting, e.Kind, "first, every block found is noted as being written")
	assert.Len(t, e.Keys, n+2)
	stored := map[messages.Key]*messages.Provenance{}
	aborted := 0
	for len(stored) < n+1 || aborted == 0 {
		e := h.Next()
		switch e.Kind {
		case messages.BlockStored:
			for i, k := range e.Keys {
				stored[k] = e.Prov[i]
			}
		case messages.BlockWriteAborted:
			assert.Equal(t, []messages.Key{bad}, e.Keys)
			aborted++
		default:
			t.Fatalf("unexpected %v", e.Kind)
		}
	}
	for i := range n {
		assert.Equal(t, provOf(i), stored[benchKey(i)], "block %d introduced with its header's provenance", i)
	}
	assert.Contains(t, stored, benchKey(n))
	assert.Nil(t, stored[benchKey(n)], "a version 1 block has no provenance")
	h.quiesce()
	_, err = os.Stat(s.Path(bad))
	assert.ErrorIs(t, err, os.ErrNotExist)

	r := h.read(n)
	require.NoError(t, r.Err, "version 1 blocks are still served")
	assert.Nil(t, r.Prov)
	assert.Equal(t, sumV1, r.Checksum)
}

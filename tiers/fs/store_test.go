package fs

import (
	"bytes"
	"hash/crc32"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
)

func block(seed byte, n int) ([]byte, uint32) {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b, crc32.Checksum(b, blockfmt.Castagnoli)
}

func TestStoreRoundTripAndValidation(t *testing.T) {
	root := t.TempDir()
	s := NewStore(OS{}, root, true)
	k := benchKey(1)
	src, sum := block(3, 1000)
	size, err := s.Write(k, src, sum, nil)
	require.NoError(t, err)
	require.Equal(t, int64(HeaderSize+1000), size)
	dst := make([]byte, 1000)
	got, prov, err := s.Read(k, dst)
	require.NoError(t, err)
	require.Equal(t, sum, got)
	require.Equal(t, src, dst)
	require.Nil(t, prov, "stored without provenance, read without")

	_, err = s.Write(benchKey(2), src, sum+1, nil)
	require.ErrorIs(t, err, messages.ErrChecksum, "a slot that does not match its committed checksum is never written")
	_, _, err = s.Read(benchKey(2), dst)
	require.ErrorIs(t, err, messages.ErrNotFound)
	short := bytes.Repeat([]byte{0xee}, 999)
	_, _, err = s.Read(k, short)
	require.ErrorIs(t, err, blockfmt.ErrSize, "a destination of another length")
	require.NotErrorIs(t, err, messages.ErrInvalidBlock, "the copy is sound")
	require.Equal(t, bytes.Repeat([]byte{0xee}, 999), short, "nothing read into it")
	_, _, err = s.Read(k, dst)
	require.NoError(t, err, "the copy is still there")

	// A file copied under another key's name is refused: the header names the key.
	data, err := os.ReadFile(s.Path(k))
	require.NoError(t, err)
	k3 := benchKey(3)
	require.NoError(t, os.MkdirAll(filepath.Dir(s.Path(k3)), 0o755))
	require.NoError(t, os.WriteFile(s.Path(k3), data, 0o644))
	_, _, err = s.Read(k3, dst)
	require.ErrorIs(t, err, messages.ErrInvalidBlock)

	for _, corrupt := range []int{0, 30, 159, HeaderSize + 500} {
		bad := append([]byte(nil), data...)
		bad[corrupt] ^= 1
		require.NoError(t, os.WriteFile(s.Path(k), bad, 0o644))
		_, _, err = s.Read(k, dst)
		require.ErrorIs(t, err, messages.ErrInvalidBlock, "byte %d flipped", corrupt)
	}
	require.NoError(t, os.WriteFile(s.Path(k), data[:HeaderSize+10], 0o644))
	_, _, err = s.Read(k, dst)
	require.ErrorIs(t, err, messages.ErrInvalidBlock, "truncated")
}

func TestStorePathsComeFromHashesOnly(t *testing.T) {
	s := NewStore(OS{}, "/r", false)
	k := messages.Key{Namespace: "../../etc", Hash: "/../x", Group: 7}
	p := s.Path(k)
	require.Equal(t, "/r/x2e2e2f2e2e2f657463/2f/2f2e2e2f78-7.blk", p)
}

func TestScanRebuildsAndRemovesLeftovers(t *testing.T) {
	root := t.TempDir()
	s := NewStore(OS{}, root, false)
	src, sum := block(1, 512)
	for i := range 5 {
		_, err := s.Write(benchKey(i), src, sum, nil)
		require.NoError(t, err)
	}
	dir := filepath.Dir(s.Path(benchKey(0)))
	require.NoError(t, os.WriteFile(s.Path(benchKey(0))+".tmp.9", []byte("half"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "zz-1.blk"), []byte("bad name"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "README"), []byte("not ours"), 0o644))
	short := s.Path(benchKey(4))
	require.NoError(t, os.Truncate(short, 100))

	res, err := s.Scan(512)
	require.NoError(t, err)
	require.Len(t, res.blocks, 4)
	require.Equal(t, 3, res.Removed, "temp file, misnamed file, wrong-size file")
	require.Equal(t, 1, res.Skipped)
	_, err = os.Stat(filepath.Join(root, "README"))
	require.NoError(t, err, "files that are not ours are left alone")

	// Open with a smaller capacity keeps the newest blocks and removes the rest.
	tier, err := Open(Config{Root: root, MaxBlockBytes: 512, Capacity: 2 * (HeaderSize + 512), Layout: LayoutFiles})
	require.NoError(t, err)
	require.Equal(t, 2, tier.index.Blocks())
	require.NoError(t, tier.index.CheckInvariants())
	require.NoError(t, tier.Close(t.Context()))
}

func TestWriteOutOfSpaceIsTierFullAndLeavesNothing(t *testing.T) {
	root := t.TempDir()
	f := NewFaulty(OS{})
	f.Inject(func(op Op, _ string) error {
		if op == OpWrite {
			return syscall.ENOSPC
		}
		return nil
	})
	s := NewStore(f, root, false)
	src, sum := block(1, 512)
	_, err := s.Write(benchKey(1), src, sum, nil)
	require.ErrorIs(t, err, messages.ErrTierFull)
	res, err := s.Scan(512)
	require.NoError(t, err)
	require.Empty(t, res.blocks)
	require.Zero(t, res.Removed, "the temporary file was removed at once")
}

func TestIndexEvictsLRUWithinCapacity(t *testing.T) {
	x := NewIndex(300)
	for i := range 3 {
		ev, err := x.BeginWrite(benchKey(i), 100)
		require.NoError(t, err)
		require.Empty(t, ev)
		x.EndWrite(benchKey(i), true)
	}
	x.Touch(benchKey(0))
	ev, err := x.BeginWrite(benchKey(3), 100)
	require.NoError(t, err)
	require.Equal(t, []messages.Key{benchKey(1)}, ev, "least recently used goes first")
	require.False(t, x.Has(benchKey(1)))
	_, err = x.BeginWrite(benchKey(1), 100)
	require.ErrorIs(t, err, errBusy, "no rewrite while its delete is in flight")
	x.EndDelete(benchKey(1))
	require.NoError(t, x.CheckInvariants())
	_, err = x.BeginWrite(benchKey(9), 400)
	require.ErrorIs(t, err, messages.ErrTierFull)
	_, err = x.BeginWrite(benchKey(0), 100)
	require.ErrorIs(t, err, errExists)
	// Everything else writing: nothing evictable.
	x.EndWrite(benchKey(3), false)
	require.NoError(t, x.CheckInvariants())
	require.Equal(t, int64(200), x.Used())
}

package chaos

import (
	"crypto/rand"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/blockfmt"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tiers/tiermsg"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// The fs tier's segments layout under the harness: fullFS's calls of that
// layout (OpenWrite, WriteAt), how the tier counts what it refuses, the
// scan of segment files, and a run.

// A full disk refuses to create a segment file but opens one that exists;
// a write at an offset lands half its bytes and fails; once there is room,
// a block's bytes count as taken and its header as published; a segment's
// hole takes no room.
func TestFullFSRefusesSegmentWrites(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "segments"), 0o755))
	path := filepath.Join(root, "segments", fmt.Sprintf("%016x%s", 1, segExt))
	d := &disk{}
	full := newFullFS(d, 4096)

	d.fill()
	_, err := full.OpenWrite(path)
	require.ErrorIs(t, err, syscall.ENOSPC, "a new segment takes room")
	assert.Equal(t, uint64(1), full.refused.Load())
	assert.NoFileExists(t, path)

	d.free()
	f, err := full.OpenWrite(path)
	require.NoError(t, err)
	defer f.Close()
	src := make([]byte, 4096)
	_, _ = rand.Read(src)
	sum := crc32.Checksum(src, blockfmt.Castagnoli)
	k := messages.Key{Namespace: "ns", Hash: fmt.Sprintf("%032x", 1)}
	prefix, _ := blockfmt.Prefix(k, len(src), sum, nil)
	_, err = f.WriteAt(src, 16384)
	require.NoError(t, err)
	assert.Equal(t, [2]int{1, 0}, sinceRoom(full), "a block's bytes: taken")
	_, err = f.WriteAt(make([]byte, 16), 0)
	require.NoError(t, err)
	assert.Equal(t, [2]int{1, 0}, sinceRoom(full), "neither a block nor its header")
	_, err = f.WriteAt(prefix, 32)
	require.NoError(t, err)
	assert.Equal(t, [2]int{1, 1}, sinceRoom(full), "its header: published")

	d.fill()
	g, err := full.OpenWrite(path)
	require.NoError(t, err, "opening a segment that exists takes no room")
	require.NoError(t, g.Close())
	n, err := f.WriteAt(src, 32768)
	require.ErrorIs(t, err, syscall.ENOSPC)
	assert.Equal(t, len(src)/2, n, "a torn write")
	require.ErrorIs(t, f.Sync(), syscall.ENOSPC)
	assert.Equal(t, uint64(3), full.refused.Load())
	d.free()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, src[:len(src)/2], data[32768:], "half of it landed")

	disk, err := scanRoot(root)
	require.NoError(t, err)
	assert.Equal(t, 1, disk.segments)
	assert.Empty(t, disk.torn)
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Less(t, disk.segRoom, info.Size(), "the holes take no room")
	assert.GreaterOrEqual(t, disk.segRoom, int64(len(src)+len(src)/2+len(prefix)))
}

func sinceRoom(f *fullFS) [2]int {
	created, stored := f.sinceRoom()
	return [2]int{created, stored}
}

// The fs tier's own segment writes over a full disk, through a real tier:
// a record refused at its block (an open segment) or at its segment's
// creation is counted full by the tier, a seal refused as a failed chore,
// so that the tier counts every refusal. Once there is room, the tier
// stores again and its root holds what it accounts.
func TestFullFSRefusalsCountedByTheTier(t *testing.T) {
	const block = 4096
	root := t.TempDir()
	d := &disk{}
	full := newFullFS(d, block)
	// NB: two records a segment (each 4 KiB block, a 176-byte entry and an
	// 8-byte footer entry, over a segment's 8,256 bytes of overhead), so
	// the third write rolls the first segment: its seal is due.
	tier, err := fs.Open(fs.Config{Name: "disk", Root: root, MaxBlockBytes: block, FS: full, Layout: fs.LayoutSegments,
		SegmentBytes: 20000, Workers: 2})
	require.NoError(t, err)
	h := tiertest.Start(t, tier.Props, tiertest.Options{Timeout: 30 * time.Second, Events: 64, Drop: true, Close: tier.Close})
	src := make([]byte, block)
	_, _ = rand.Read(src)
	sum := crc32.Checksum(src, blockfmt.Castagnoli)
	key := func(i int) messages.Key { return messages.Key{Namespace: "ns", Hash: fmt.Sprintf("%032x", i)} }
	write := func(i int) error {
		r := h.Ask(&tiermsg.Write{Corr: uint64(i), Key: key(i), Src: src, Checksum: sum}).(*tiermsg.WriteResult)
		return r.Err
	}
	quiet := func() messages.SecondaryStats {
		for { // NB: the tier offers no "idle" notification; every ask runs its due chores
			st := h.Ask(&tiermsg.StatsQuery{Corr: 1}).(*tiermsg.StatsReply).Stats
			if st.InFlight == 0 {
				return st
			}
			require.NoError(t, h.Ctx.Err(), "tier never quiet")
		}
	}

	require.NoError(t, write(0), "segment 1, created")
	d.fill()
	require.ErrorIs(t, write(1), messages.ErrTierFull, "segment 1: refused at its block")
	require.ErrorIs(t, write(2), messages.ErrTierFull, "segment 2: refused at its creation; segment 1 rolled")
	st := quiet()
	assert.Equal(t, uint64(3), full.refused.Load(), "two blocks and segment 1's seal refused")
	assert.Equal(t, uint64(2), st.WritesFull, "the blocks: full writes")
	assert.Equal(t, uint64(1), st.ChoreFailures, "the seal: a failed chore")
	assert.Equal(t, uint64(1), st.ChoresFull, "for lack of room")

	d.free()
	require.NoError(t, write(3), "room again")
	st = quiet()
	assert.Equal(t, [2]int{1, 1}, sinceRoom(full), "a block taken and published since")
	assert.Equal(t, 2, st.Blocks)
	disk, err := scanRoot(root)
	require.NoError(t, err)
	assert.Equal(t, 2, disk.segments)
	assert.Empty(t, accounts(true, disk, st, block), "the root holds what the tier accounts: %+v, %+v", disk, st)
	for _, i := range []int{0, 3} {
		r := h.Ask(&tiermsg.Read{Corr: 9, Key: key(i), Dest: make([]byte, block)}).(*tiermsg.ReadResult)
		require.NoError(t, r.Err, "block %d", i)
	}
}

// accounts tells a segment root that holds more than its tier accounts,
// or less than its blocks.
func TestAccountsSegments(t *testing.T) {
	st := messages.SecondaryStats{Blocks: 2, Bytes: 40000, Capacity: 1 << 20}
	assert.Empty(t, accounts(true, onDisk{segments: 1, segRoom: 3 * 4096}, st, 4096))
	assert.Contains(t, accounts(true, onDisk{segments: 3, segRoom: 45056}, st, 4096), "its root takes 45056")
	assert.Contains(t, accounts(true, onDisk{segments: 1, segRoom: 4096}, st, 4096), "indexes 2 blocks")
	st.Capacity = 32768
	assert.Contains(t, accounts(true, onDisk{segments: 1, segRoom: 3 * 4096}, st, 4096), "over its capacity")
	assert.Contains(t, accounts(false, onDisk{blocks: 2, bytes: 3 * 4096}, st, 4096), "its root holds 2 of 12288")
}

// TestDiskFullSegmentsIsAbsorbed is TestDiskFullMidCascadeIsAbsorbed with
// the fs tier in segments, and fs-error, fs-slow and fs-corrupt from a
// seeded plan beside the scripted window: the refused record writes are
// counted, no segment leaks, the tier stores again, every invariant holds.
func TestDiskFullSegmentsIsAbsorbed(t *testing.T) {
	seeded := &supervision.Seeded{Seed: 2, Rates: map[Kind]float64{supervision.FaultFSError: 0.01,
		supervision.FaultFSSlow: 0.005, supervision.FaultFSCorrupt: 0.1}, MinDelay: DefaultMaxDelay / 10, MaxDelay: DefaultMaxDelay}
	plan := scriptedOver{Script: supervision.Script{{Site: "disk full", N: 0}: {Kind: supervision.FaultDiskFull, Arg: 0}}, Plan: seeded}
	rep := run(t, Options{Seed: 2, Duration: raceScale * 4 * time.Second, FSLayout: fs.LayoutSegments,
		Kinds: []Kind{supervision.FaultDiskFull, supervision.FaultFSError, supervision.FaultFSSlow, supervision.FaultFSCorrupt},
		Plan:  plan})
	requireAbsorbed(t, rep)
	assert.Equal(t, fs.LayoutSegments, rep.FSLayout)
	assert.Contains(t, rep.Reproduce, "--fs-layout segments")
	assert.Positive(t, rep.FaultsByKind[string(supervision.FaultFSError)], "fs calls failed")
}

// scriptedOver decides a point by its script when it lists the point, else
// by the plan under it.
type scriptedOver struct {
	supervision.Script
	supervision.Plan
}

func (s scriptedOver) Decide(p supervision.Point, allowed []supervision.FaultKind) supervision.Decision {
	if _, ok := s.Script[p]; ok {
		return s.Script.Decide(p, allowed)
	}
	return s.Plan.Decide(p, allowed)
}

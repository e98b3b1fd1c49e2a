package cpu

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

const testBlock = 4096

// shmPath is a unique pool path under /dev/shm (skipping where there is
// none), removed at the end of the test if the pool did not remove it.
func shmPath(t *testing.T) string {
	t.Helper()
	if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
		t.Skip("no /dev/shm")
	}
	p := fmt.Sprintf("/dev/shm/kvtier-test-%d-%s", os.Getpid(), filepath.Base(t.TempDir()))
	t.Cleanup(func() { os.Remove(p) })
	return p
}

// checkSlots writes a distinct pattern to every slot and reads all back:
// slots are writable, of the block size, adjacent and non-overlapping.
func checkSlots(t *testing.T, p *Pool) {
	t.Helper()
	for i := range p.Slots() {
		b := p.Slot(i)
		require.Len(t, b, p.BlockBytes())
		require.Equal(t, p.BlockBytes(), cap(b), "a slot must not reach into the next")
		if i > 0 {
			prev := p.Slot(i - 1)
			require.Equal(t, uintptr(unsafe.Pointer(&prev[0]))+uintptr(p.BlockBytes()),
				uintptr(unsafe.Pointer(&b[0])), "slot %d right after slot %d", i, i-1)
		}
		for j := range b {
			b[j] = byte(i*31 + j%7 + 1)
		}
	}
	for i := range p.Slots() {
		b := p.Slot(i)
		for j := range b {
			if b[j] != byte(i*31+j%7+1) {
				t.Fatalf("slot %d byte %d = %d: overwritten", i, j, b[j])
			}
		}
	}
}

func TestOpenPoolFile(t *testing.T) {
	for _, where := range []string{"tmpdir", "shm"} {
		t.Run(where, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "sub", "pool")
			if where == "shm" {
				path = shmPath(t)
			}
			p, err := OpenPool(path, 8, testBlock)
			require.NoError(t, err)
			assert.Equal(t, path, p.Path())
			assert.Equal(t, 8, p.Slots())
			assert.Equal(t, testBlock, p.BlockBytes())
			checkSlots(t, p)

			// MAP_SHARED: another process mapping the file sees the bytes.
			onDisk, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Len(t, onDisk, 8*testBlock)
			assert.True(t, bytes.Equal(onDisk[3*testBlock:4*testBlock], p.Slot(3)))

			require.NoError(t, p.Close())
			_, err = os.Stat(path)
			assert.ErrorIs(t, err, os.ErrNotExist, "Close removes the pool file")
			assert.NoError(t, p.Close(), "a second Close is harmless")
		})
	}
}

func TestOpenPoolInUse(t *testing.T) {
	path := shmPath(t)
	p, err := OpenPool(path, 4, testBlock)
	require.NoError(t, err)
	copy(p.Slot(0), "live data")

	_, err = OpenPool(path, 4, testBlock)
	require.ErrorIs(t, err, ErrPoolInUse)
	// The failed open neither removed nor truncated the live pool.
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, int64(4*testBlock), st.Size())
	assert.Equal(t, "live data", string(p.Slot(0)[:9]))

	require.NoError(t, p.Close())
	p2, err := OpenPool(path, 2, testBlock) // free again once closed
	require.NoError(t, err)
	assert.Equal(t, make([]byte, testBlock), p2.Slot(0), "a reopened pool starts zeroed")
	require.NoError(t, p2.Close())
}

// A stale file left by a dead owner (no lock held) is taken over.
func TestOpenPoolStaleFile(t *testing.T) {
	path := shmPath(t)
	require.NoError(t, os.WriteFile(path, bytes.Repeat([]byte{0xff}, 3*testBlock), 0o600))
	p, err := OpenPool(path, 2, testBlock)
	require.NoError(t, err)
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, int64(2*testBlock), st.Size())
	assert.Equal(t, make([]byte, testBlock), p.Slot(1), "old bytes are gone")
	require.NoError(t, p.Close())
}

// A pool left by a killed daemon (same size, still mapped by a worker) is
// replaced by a fresh inode, not truncated and reused: the worker's mapping
// keeps its bytes, and the new pool is a different file it can tell apart
// (issue 26, item 1).
func TestOpenPoolAfterACrashIsAFreshInode(t *testing.T) {
	path := shmPath(t)
	require.NoError(t, os.WriteFile(path, bytes.Repeat([]byte{0xab}, 2*testBlock), 0o600))
	worker, err := os.Open(path) // a worker's view of the dead daemon's pool
	require.NoError(t, err)
	defer worker.Close()
	var before syscall.Stat_t
	require.NoError(t, syscall.Fstat(int(worker.Fd()), &before))

	p, err := OpenPool(path, 2, testBlock)
	require.NoError(t, err)
	defer p.Close()
	var after syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &after))
	assert.NotEqual(t, before.Ino, after.Ino, "the path names a new file")
	old := make([]byte, testBlock)
	_, err = worker.ReadAt(old, testBlock)
	require.NoError(t, err, "the old file was not truncated under its reader")
	assert.Equal(t, bytes.Repeat([]byte{0xab}, testBlock), old)
	tmps, err := filepath.Glob(path + ".new-*")
	require.NoError(t, err)
	assert.Empty(t, tmps, "no temporary file left behind")
}

func TestOpenPoolMemfd(t *testing.T) {
	p, err := OpenPool("", 8, testBlock)
	require.NoError(t, err)
	assert.Equal(t, "", p.Path())
	checkSlots(t, p)
	require.NoError(t, p.Close())
	assert.NoError(t, p.Close())
}

func TestOpenPoolTooLarge(t *testing.T) {
	path := shmPath(t)
	var st syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &st); err != nil || st.Blocks == 0 {
		t.Skipf("statfs /dev/shm: %v, %d blocks", err, st.Blocks)
	}
	avail := int64(st.Bavail) * int64(st.Bsize)
	const block = 1 << 20
	slots := int(avail/block) + 1 // one block more than there is room for
	_, err := OpenPool(path, slots, block)
	require.ErrorIs(t, err, ErrPoolTooLarge, "%d slots of %d bytes, %d bytes free", slots, block, avail)
	_, err = os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist, "a failed open leaves no file behind")
}

func TestOpenPoolBadGeometry(t *testing.T) {
	for _, g := range [][2]int{{0, testBlock}, {-1, testBlock}, {8, 0}, {8, -4096}, {0, 0}} {
		_, err := OpenPool("", g[0], g[1])
		assert.ErrorIs(t, err, messages.ErrBadConfig, "%d slots of %d bytes", g[0], g[1])
	}
	// Nothing was created for a bad path either.
	path := filepath.Join(t.TempDir(), "pool")
	_, err := OpenPool(path, 0, testBlock)
	assert.ErrorIs(t, err, messages.ErrBadConfig)
	_, err = os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// slots × blockBytes must not overflow: (2^52+1) × 4096 wraps to 4096 bytes,
// and a pool that claims 2^52+1 slots over one page would hand out slices
// past its mapping.
func TestOpenPoolSizeOverflow(t *testing.T) {
	slots := 1<<52 + 1
	p, err := OpenPool("", slots, testBlock)
	if err == nil {
		defer p.Close()
		t.Fatalf("OpenPool(%d slots of %d bytes) succeeded with a %d-byte region", slots, testBlock, len(p.mem))
	}
	assert.True(t, errorsIsAny(err, messages.ErrBadConfig, ErrPoolTooLarge), "err = %v", err)
}

func errorsIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

func TestSlotOfAClosedPoolPanicsWithErrPoolClosed(t *testing.T) {
	p, err := OpenPool("", 4, 4096)
	require.NoError(t, err)
	p.Slot(3)[0] = 1
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "closing twice is harmless")
	defer func() {
		err, _ := recover().(error)
		require.ErrorIs(t, err, ErrPoolClosed, "a clear error, not a bounds panic")
	}()
	p.Slot(3)
	t.Fatal("Slot of a closed pool returned")
}

// A geometry after the first is a view of the same pool: its slot i is
// bytes [i × its size, (i+1) × its size) of the one region, numbered after
// the first geometry's slots; the pool's file is unchanged.
func TestPoolGeometryRegions(t *testing.T) {
	path := shmPath(t)
	p, err := OpenPool(path, 8, testBlock)
	require.NoError(t, err)
	defer p.Close()
	r, err := p.Geometry(2 * testBlock)
	require.NoError(t, err)
	require.Equal(t, Region{Index: 1, BlockBytes: 2 * testBlock, Base: 8, Slots: 4, Path: path}, r)
	again, err := p.Geometry(2 * testBlock)
	require.NoError(t, err)
	require.Equal(t, r, again, "one region per size")
	_, err = p.Geometry(16 * testBlock)
	require.ErrorIs(t, err, messages.ErrBadConfig, "a slot larger than the pool")
	odd, err := p.Geometry(3 * testBlock)
	require.NoError(t, err)
	require.Equal(t, Region{Index: 2, BlockBytes: 3 * testBlock, Base: 12, Slots: 2, Path: path}, odd,
		"as many slots as fit the pool")

	s := p.Slot(9) // the second slot of 8 KiB: the first geometry's slots 2 and 3
	require.Len(t, s, 2*testBlock)
	copy(s, bytes.Repeat([]byte{7}, len(s)))
	require.Equal(t, bytes.Repeat([]byte{7}, testBlock), p.Slot(2))
	require.Equal(t, bytes.Repeat([]byte{7}, testBlock), p.Slot(3))
	require.Equal(t, make([]byte, testBlock), p.Slot(4))
	last := p.Slot(13) // 12 KiB at 12 KiB
	require.Len(t, last, 3*testBlock)
	require.Equal(t, 3*testBlock, cap(last), "a slot must not reach into the next")
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, int64(8*testBlock), st.Size(), "one file for every size")
}

// The data plane finds every size's slots by id (Locate): each id of a
// region is placed where Slot puts it, inside the pool's memory; ids of
// the first size, past the last region and negative ones are no slot of
// Locate's; every id is below SlotIDLimit; LargestSlot follows the sizes.
func TestPoolLocatesEverySizesSlots(t *testing.T) {
	p, err := OpenPool(shmPath(t), 8, testBlock)
	require.NoError(t, err)
	defer p.Close()
	require.Equal(t, testBlock, p.LargestSlot())
	for _, size := range []int{2 * testBlock, 3 * testBlock} {
		_, err := p.Geometry(size)
		require.NoError(t, err)
	}
	require.Equal(t, 3*testBlock, p.LargestSlot())
	mem := p.Memory()
	for _, r := range p.Regions()[1:] {
		for id := r.Base; id < r.Base+r.Slots; id++ {
			off, size := p.Locate(id)
			require.Equal(t, r.BlockBytes, size, "id %d", id)
			require.LessOrEqual(t, off+size, len(mem), "id %d lies in the pool", id)
			require.Same(t, &p.Slot(id)[0], &mem[off], "id %d: where Slot puts it", id)
			require.Less(t, id, p.SlotIDLimit())
		}
	}
	last := p.Regions()[len(p.Regions())-1]
	for _, id := range []int{-1, 0, 7, last.Base + last.Slots, p.SlotIDLimit()} {
		_, size := p.Locate(id)
		require.Zero(t, size, "id %d is no slot of another size", id)
	}
}

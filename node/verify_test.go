package node

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/cpu"
)

func TestVerifyBlockDetectsAndDropsCorruption(t *testing.T) {
	h := open(t, 4)
	h.store(&messages.ReqContext{RequestID: "w"}, 1, 2)
	require.NoError(t, h.node.VerifyBlock(h.ctx, key(1)))
	require.ErrorIs(t, h.node.VerifyBlock(h.ctx, key(9)), messages.ErrUnknownKey)

	// Flip one bit of block 2 in place, as a stray writer would.
	probe := &messages.ReqContext{RequestID: "p"}
	job, err := h.m.PrepareLoad(h.ctx, probe, keys(2))
	require.NoError(t, err)
	h.m.Pool().Slot(job.Slots[0])[100] ^= 0x04
	require.NoError(t, h.m.JobDone(h.ctx, job.ID, 0, true))

	require.ErrorIs(t, h.node.VerifyBlock(h.ctx, key(2)), messages.ErrChecksum)
	st := h.lookup(probe, keys(1, 2), false)
	require.Equal(t, []messages.LookupStatus{messages.Hit, messages.Miss}, st, "the corrupt block is never served again")
	s := h.stats()
	require.Equal(t, uint64(1), s.ChecksumFailures)
	require.NoError(t, h.m.RequestFinished(h.ctx, probe))
	h.quiet()
}

func TestOpenRejectsAPoolLargerThanShm(t *testing.T) {
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err != nil || st.Blocks == 0 {
		t.Skip("no /dev/shm to size against")
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	path := fmt.Sprintf("/dev/shm/kvtier-test-%d.pool", os.Getpid())
	_, err := Open(context.Background(), config.Config{PoolPath: path, PoolBytes: free + 1<<30, BlockBytes: 1 << 20})
	require.ErrorIs(t, err, cpu.ErrPoolTooLarge)
	_, statErr := os.Stat(path)
	require.True(t, os.IsNotExist(statErr), "a failed Open leaves no pool file")
}

package obj_test

// Blocks of several sizes in one bucket (issue 42: one daemon, many
// models, each namespace its own bytes per block), against a real
// versitygw: stored interleaved and read back, refused into a destination
// of another length without harm (no delete, no retry, the tier healthy),
// and found by HEAD from a fresh tier whatever their size.

import (
	"net/http"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
	"github.com/kvtier/kvtier/tiers/obj"
	"github.com/kvtier/kvtier/tiers/obj/objtest"
	"github.com/kvtier/kvtier/tiers/tiermsg"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// sizedKey is block i's key, in its size's namespace.
func sizedKey(i, size int) messages.Key { return tiertest.InSizeNamespace(key(i), size) }

func TestMixedSizesStoredReadAndFoundByHead(t *testing.T) {
	s := objtest.Start(t, bucket)
	bounded := func(c *obj.Config) { c.MaxBlockBytes = tiertest.SizesBound }
	h := openTier(t, s, bounded)
	blocks := tiertest.MixedBlocks(10, sizedKey)
	h.CheckMixedSizes(blocks, tiertest.SizesBound)
	st := h.stats()
	require.Zero(t, st.Invalid, "a wrong-length read deletes nothing")
	require.Zero(t, st.RetriedIOCalls, "nor is it retried")
	require.True(t, st.Healthy)

	raw, err := s.Client(bucket)
	require.NoError(t, err)
	defer raw.Close()
	for _, b := range blocks[:2] {
		info, err := raw.Raw().StatObject(h.Ctx, bucket, "node-a/"+blockfmt.RelPath(b.Key), minio.StatObjectOptions{})
		require.NoError(t, err, "the copy a wrong-length read named is still there")
		require.Equal(t, int64(blockfmt.HeaderSize+len(b.Data)), info.Size, "an object as long as its own block")
	}
	k := sizedKey(99, 4096)
	_, err = raw.Raw().StatObject(h.Ctx, bucket, "node-a/"+blockfmt.RelPath(k), minio.StatObjectOptions{})
	require.Equal(t, http.StatusNotFound, minio.ToErrorResponse(err).StatusCode)

	// A fresh tier over the bucket knows nothing: its HEADs find blocks of
	// both sizes, and it reads them.
	fresh := openTier(t, s, bounded)
	keys := make([]messages.Key, 0, len(blocks)+1)
	want := make([]bool, 0, len(blocks)+1)
	for _, b := range blocks {
		keys, want = append(keys, b.Key), append(want, true)
	}
	keys, want = append(keys, k), append(want, false)
	r := fresh.Ask(&tiermsg.Lookup{Corr: 3, Keys: keys}).(*tiermsg.LookupResult)
	require.NoError(t, r.Err)
	require.Equal(t, want, r.Found)
	fresh.CheckReads(blocks)

}

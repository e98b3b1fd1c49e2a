package obj_test

// The obj tier's KV events and provenance against a real versitygw: the
// provenance goes into the object's header and comes back on read; what the
// tier writes or reads verified it announces stored (STORAGE, REMOTE, its
// name), what it finds invalid or deletes, or forgets to stay within its
// bound, removed; its inventory is exactly what it announced.

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
	"github.com/kvtier/kvtier/tiers/obj"
	"github.com/kvtier/kvtier/tiers/obj/objtest"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

func provOf(i int) *messages.Provenance {
	return &messages.Provenance{ParentHash: []byte(key(i + 1000).Hash), TokenIDs: []int32{int32(i), 2, 3, 4},
		BlockSize: 4, LoRAID: 7, ExtraKeys: []string{"mm"}}
}

func (h *tierHarness) writeProv(i int) {
	h.T.Helper()
	src, sum := block(i)
	r := h.Ask(&tiermsg.Write{Corr: 1, Key: key(i), Src: src, Checksum: sum, Prov: provOf(i)}).(*tiermsg.WriteResult)
	require.NoError(h.T, r.Err)
}

// next is the next event, which names one block.
func (h *tierHarness) next() *messages.Event {
	h.T.Helper()
	e := h.Next()
	require.Len(h.T, e.Keys, 1)
	return e
}

func TestObjAnnouncesWithProvenance(t *testing.T) {
	s := objtest.Start(t, bucket)
	h := openTier(t, s, func(c *obj.Config) { c.KnownKeys = 2; c.Workers = 1 })
	h.writeProv(1)
	assert.Equal(t, messages.BlockWriting, h.next().Kind)
	e := h.next()
	assert.Equal(t, messages.BlockStored, e.Kind)
	assert.Equal(t, []*messages.Provenance{provOf(1)}, e.Prov)

	dst := make([]byte, blockBytes)
	r := h.Ask(&tiermsg.Read{Corr: 2, Key: key(1), Dest: dst}).(*tiermsg.ReadResult)
	require.NoError(t, r.Err)
	assert.Equal(t, provOf(1), r.Prov, "the header's provenance comes back on read")
	want, _ := block(1)
	assert.Equal(t, want, dst)

	h.writeProv(2)
	assert.Equal(t, messages.BlockWriting, h.next().Kind)
	assert.Equal(t, messages.BlockStored, h.next().Kind)
	assert.ElementsMatch(t, []messages.Key{key(1), key(2)}, h.Inventory())
	// Past its bound the tier stops vouching for the least recent block.
	h.writeProv(3)
	assert.Equal(t, messages.BlockWriting, h.next().Kind)
	assert.Equal(t, messages.BlockStored, h.next().Kind)
	e = h.next()
	assert.Equal(t, messages.BlockRemoved, e.Kind)
	assert.Equal(t, []messages.Key{key(1)}, e.Keys)
	assert.ElementsMatch(t, []messages.Key{key(2), key(3)}, h.Inventory())

	// Read back, block 1 is vouched for again, with its stored provenance.
	r = h.Ask(&tiermsg.Read{Corr: 2, Key: key(1), Dest: dst}).(*tiermsg.ReadResult)
	require.NoError(t, r.Err)
	e = h.next()
	assert.Equal(t, messages.BlockStored, e.Kind)
	assert.Equal(t, []*messages.Provenance{provOf(1)}, e.Prov)
	assert.Equal(t, []messages.Key{key(2)}, h.next().Keys, "and 2 is forgotten")

	// A corrupt copy is removed.
	raw, err := s.Client(bucket)
	require.NoError(t, err)
	defer raw.Close()
	name := "node-a/" + blockfmt.RelPath(key(3))
	objtest.Corrupt(t, h.Ctx, raw, bucket, name, func(data []byte) {
		data[blockfmt.HeaderSize+5] ^= 0xff // inside the provenance section
	})
	r = h.Ask(&tiermsg.Read{Corr: 2, Key: key(3), Dest: dst}).(*tiermsg.ReadResult)
	require.ErrorIs(t, r.Err, messages.ErrInvalidBlock)
	e = h.next()
	assert.Equal(t, messages.BlockRemoved, e.Kind)
	assert.Equal(t, []messages.Key{key(3)}, e.Keys)
	assert.Equal(t, []messages.Key{key(1)}, h.Inventory())

	h.System.Root.Send(h.PID, &tiermsg.Delete{Key: key(1)})
	e = h.next()
	assert.Equal(t, messages.BlockRemoved, e.Kind)
	assert.Empty(t, h.Inventory())
}

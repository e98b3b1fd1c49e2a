package fs

// The fs tier's KV events and provenance through its actor: provenance
// stored in the header comes back on read; stored, removed (evicted,
// deleted, invalid) and write notes reach the registered hub; a reopened
// tier introduces the blocks it found, parents noted before children, with
// the provenance of their headers, and answers its inventory once that is
// done; a version 1 file is still served.

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
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

// hubProbe is a stand-in hub: every event it gets goes to a channel.
type hubProbe chan *messages.Event

func (h hubProbe) Receive(c actor.Context) {
	if e, ok := c.Message().(*messages.Event); ok {
		h <- e
	}
}

type fsHarness struct {
	t      *testing.T
	ctx    context.Context
	system *actor.ActorSystem
	pid    *actor.PID
	tier   *Tier
	events hubProbe
}

func openFS(t *testing.T, root string, capacity int64) *fsHarness {
	t.Helper()
	tier, err := Open(Config{Name: "disk", Root: root, BlockBytes: evBlock, Capacity: capacity, Log: zerolog.Nop()})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	system := actors.NewSystem(zerolog.Nop())
	h := &fsHarness{t: t, ctx: ctx, system: system, tier: tier, events: make(hubProbe, 1024)}
	hub := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return h.events }))
	h.pid = system.Root.Spawn(tier.Props(hub))
	t.Cleanup(func() {
		require.NoError(t, actors.StopAndWait(ctx, system, h.pid))
		require.NoError(t, actors.StopAndWait(ctx, system, hub))
		require.NoError(t, tier.Close(ctx))
		system.Shutdown()
		cancel()
	})
	return h
}

func (h *fsHarness) ask(msg any) any {
	h.t.Helper()
	r, err := actors.Ask(h.ctx, h.system, h.pid, msg)
	require.NoError(h.t, err)
	return r
}

func evSrc(i int) ([]byte, uint32) {
	b := make([]byte, evBlock)
	for j := range b {
		b[j] = byte(i*31 + j)
	}
	return b, crc32.Checksum(b, castagnoli)
}

func (h *fsHarness) write(i int, p *messages.Provenance) {
	h.t.Helper()
	src, sum := evSrc(i)
	r := h.ask(&messages.TierWrite{Key: benchKey(i), Src: src, Checksum: sum, Prov: p}).(*messages.TierWriteResult)
	require.NoError(h.t, r.Err)
}

func (h *fsHarness) read(i int) *messages.TierReadResult {
	h.t.Helper()
	r := h.ask(&messages.TierRead{Key: benchKey(i), Dest: make([]byte, evBlock)}).(*messages.TierReadResult)
	return r
}

// next is the next event the hub got (all of them are sent before the
// answer that preceded this call).
func (h *fsHarness) next() *messages.Event {
	h.t.Helper()
	select {
	case e := <-h.events:
		require.Equal(h.t, messages.MediumStorage, e.Medium)
		require.Equal(h.t, "disk", e.Ownership)
		require.Equal(h.t, "LOCAL", e.Locality)
		return e
	case <-h.ctx.Done():
		h.t.Fatal("no event")
		return nil
	}
}

func (h *fsHarness) inventory() []messages.Key {
	h.t.Helper()
	r := h.ask(&messages.TierInventory{Corr: 5}).(*messages.InventoryResult)
	require.Equal(h.t, messages.MediumStorage, r.Medium)
	require.Equal(h.t, "disk", r.Ownership)
	return r.Keys
}

func TestFSAnnouncesWithProvenanceAndReadsItBack(t *testing.T) {
	root := t.TempDir()
	size := FileSize(evBlock, provOf(1))
	h := openFS(t, root, 2*size)
	h.write(0, provOf(0))
	e := h.next()
	assert.Equal(t, messages.BlockWriting, e.Kind)
	e = h.next()
	assert.Equal(t, messages.BlockStored, e.Kind)
	assert.Equal(t, []messages.Key{benchKey(0)}, e.Keys)
	assert.Equal(t, []*messages.Provenance{provOf(0)}, e.Prov)

	r := h.read(0)
	require.NoError(t, r.Err)
	assert.Equal(t, provOf(0), r.Prov, "the header's provenance comes back on read")

	h.write(1, provOf(1))
	assert.Equal(t, messages.BlockWriting, h.next().Kind)
	assert.Equal(t, messages.BlockStored, h.next().Kind)
	// A third block evicts the least recent: 0 (read before 1 was written).
	h.write(2, provOf(2))
	e = h.next()
	assert.Equal(t, messages.BlockRemoved, e.Kind, "eviction announced when the block becomes unreadable")
	assert.Equal(t, []messages.Key{benchKey(0)}, e.Keys)
	assert.Equal(t, messages.BlockWriting, h.next().Kind)
	assert.Equal(t, messages.BlockStored, h.next().Kind)
	assert.ElementsMatch(t, []messages.Key{benchKey(1), benchKey(2)}, h.inventory())

	h.system.Root.Send(h.pid, &messages.TierDelete{Key: benchKey(1)})
	e = h.next()
	assert.Equal(t, messages.BlockRemoved, e.Kind)
	assert.Equal(t, []messages.Key{benchKey(1)}, e.Keys)

	// Corrupt block 2's bytes: the read fails, the block is removed and announced.
	path := h.tier.store.Path(benchKey(2))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	data[len(data)-1] ^= 1
	require.NoError(t, os.WriteFile(path, data, 0o644))
	require.ErrorIs(t, h.read(2).Err, messages.ErrInvalidBlock)
	e = h.next()
	assert.Equal(t, messages.BlockRemoved, e.Kind)
	assert.Equal(t, []messages.Key{benchKey(2)}, e.Keys)
	assert.Empty(t, h.inventory())
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

func TestReopenedFSIntroducesWhatItHolds(t *testing.T) {
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

	h := openFS(t, root, 0)
	inv := h.inventory() // answered once every block found is introduced
	assert.Len(t, inv, n+1, "the corrupt block is gone")
	assert.NotContains(t, inv, bad)

	e := h.next()
	require.Equal(t, messages.BlockWriting, e.Kind, "first, every block found is noted as being written")
	assert.Len(t, e.Keys, n+2)
	stored := map[messages.Key]*messages.Provenance{}
	aborted := 0
	for len(stored) < n+1 || aborted == 0 {
		e := h.next()
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
	_, err = os.Stat(s.Path(bad))
	assert.ErrorIs(t, err, os.ErrNotExist)

	r := h.read(n)
	require.NoError(t, r.Err, "version 1 blocks are still served")
	assert.Nil(t, r.Prov)
	assert.Equal(t, sumV1, r.Checksum)
}

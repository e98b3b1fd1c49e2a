package tiertest

import (
	"bytes"
	"fmt"
	"hash/crc32"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// Sizes are the block lengths the mixed-size checks interleave: one page
// and three (two namespaces' geometries, as one daemon serving two models
// stores them side by side).
var Sizes = []int{4096, 12288}

// SizesBound is a tier's bound in the mixed-size tests: above every one
// of Sizes, far below the default.
const SizesBound = 16 << 10

// InSizeNamespace is k in a namespace of its own for blocks of size bytes,
// as two models' layouts are: the key MixedBlocks' callers give block i.
func InSizeNamespace(k messages.Key, size int) messages.Key {
	k.Namespace = messages.Namespace(fmt.Sprintf("%016x", size))
	return k
}

// Block is one block a test stores: its key, bytes and CRC32C.
type Block struct {
	Key  messages.Key
	Data []byte
	Sum  uint32
}

// MixedBlocks is n blocks whose lengths take turns through Sizes: block i
// is Sizes[i%len(Sizes)] bytes of a pattern of i, under key(i, its length)
// (a test gives each length its own namespace).
func MixedBlocks(n int, key func(i, size int) messages.Key) []Block {
	out := make([]Block, n)
	for i := range out {
		size := Sizes[i%len(Sizes)]
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(i*131 + j*7 + j>>9)
		}
		out[i] = Block{Key: key(i, size), Data: b, Sum: crc32.Checksum(b, blockfmt.Castagnoli)}
	}
	return out
}

// Write stores b; the tier's answer's error.
func (h *Harness) Write(b Block) error {
	h.T.Helper()
	return h.Ask(&tiermsg.Write{Corr: 1, Key: b.Key, Src: b.Data, Checksum: b.Sum}).(*tiermsg.WriteResult).Err
}

// Read reads k into dest; the tier's answer.
func (h *Harness) Read(k messages.Key, dest []byte) *tiermsg.ReadResult {
	h.T.Helper()
	return h.Ask(&tiermsg.Read{Corr: 2, Key: k, Dest: dest}).(*tiermsg.ReadResult)
}

// WriteAll stores every block, each write answered with no error.
func (h *Harness) WriteAll(blocks []Block) {
	h.T.Helper()
	for _, b := range blocks {
		require.NoError(h.T, h.Write(b), "write %v (%d bytes)", b.Key, len(b.Data))
	}
}

// CheckReads reads every block back into a destination of its own
// length: every byte and the checksum as written.
func (h *Harness) CheckReads(blocks []Block) {
	h.T.Helper()
	for _, b := range blocks {
		dst := make([]byte, len(b.Data))
		r := h.Read(b.Key, dst)
		require.NoError(h.T, r.Err, "read %v (%d bytes)", b.Key, len(b.Data))
		require.Equal(h.T, b.Sum, r.Checksum, "%v", b.Key)
		require.True(h.T, bytes.Equal(b.Data, dst), "%v: the bytes as written", b.Key)
	}
}

// CheckMixedSizes is what every secondary tier does with blocks of several
// sizes (bounded by maxBlock, which must be at least the largest of
// blocks): it stores them interleaved and reads each back whole; a read
// into a destination of another length fails with blockfmt.ErrSize,
// writes nothing into it and leaves the copy readable; a write of no
// bytes or of more than maxBlock fails with ErrSize and stores nothing.
// blocks must hold at least one block of each of two lengths.
func (h *Harness) CheckMixedSizes(blocks []Block, maxBlock int) {
	h.T.Helper()
	h.WriteAll(blocks)
	h.CheckReads(blocks)
	for _, b := range blocks[:2] {
		for _, n := range []int{len(b.Data) - 1, len(b.Data) + 1, len(blocks[0].Data) + len(blocks[1].Data) - len(b.Data)} {
			dst := bytes.Repeat([]byte{0xa5}, n)
			r := h.Read(b.Key, dst)
			require.ErrorIs(h.T, r.Err, blockfmt.ErrSize, "%v (%d bytes) into %d", b.Key, len(b.Data), n)
			require.ErrorIs(h.T, r.Err, messages.ErrBadRequest)
			require.NotErrorIs(h.T, r.Err, messages.ErrInvalidBlock, "the copy is sound: never removed")
			require.Equal(h.T, bytes.Repeat([]byte{0xa5}, n), dst, "nothing read into a destination of another length")
		}
	}
	h.CheckReads(blocks[:2]) // the copies a wrong read named are intact

	k := blocks[0].Key
	k.Group += 1 << 20 // a key no block of the set has
	for _, n := range []int{0, maxBlock + 1} {
		src := make([]byte, n)
		err := h.Write(Block{Key: k, Data: src, Sum: crc32.Checksum(src, blockfmt.Castagnoli)})
		require.ErrorIs(h.T, err, blockfmt.ErrSize, "a write of %d bytes (bound %d)", n, maxBlock)
		r := h.Read(k, make([]byte, max(n, 1)))
		require.ErrorIs(h.T, r.Err, messages.ErrNotFound, "nothing stored for a refused write")
	}
}

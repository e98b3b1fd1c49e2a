package peer

import (
	"sync/atomic"

	"github.com/kvtier/kvtier/rdma"
)

// A fetch moves in chunks of about ChunkBytes, each its own data-plane
// transfer under a token derived from the Fetch's: the consumer verifies a
// chunk's checksums while the next chunks are still on the wire, so a fetch
// costs the transfer plus the verification of its last chunk, not plus the
// verification of everything. Both sides derive the chunks from the Fetch
// alone (docs/PROTOCOL.md, "Chunks"): chunk i covers the Fetch's keys
// [i·n, (i+1)·n) with n = max(1, ChunkBytes / block bytes), under the
// Fetch token with its last two bytes XORed with i (big-endian).
const ChunkBytes = 8 << 20

// chunkBlocks is the number of blocks per chunk for a block size.
func chunkBlocks(blockBytes int) int { return max(1, ChunkBytes/max(blockBytes, 1)) }

// chunkCount is the number of chunks of a fetch of n blocks.
func chunkCount(n, blockBytes int) int {
	per := chunkBlocks(blockBytes)
	return (n + per - 1) / per
}

// chunkToken derives chunk i's token from the fetch's.
func chunkToken(tok rdma.Token, i int) rdma.Token {
	tok[14] ^= byte(i >> 8)
	tok[15] ^= byte(i)
	return tok
}

// chunkRange is chunk i's key range [lo, hi) in a fetch of n blocks.
func chunkRange(i, n, blockBytes int) (lo, hi int) {
	per := chunkBlocks(blockBytes)
	return i * per, min((i+1)*per, n)
}

// lastOf counts down the completions of a fetch's chunks, so that exactly
// one of them (the last) can tell the session, whichever incarnation of it
// is running by then.
type lastOf struct {
	left atomic.Int32
	err  atomic.Pointer[error]
}

func newLastOf(n int) *lastOf {
	l := &lastOf{}
	l.left.Store(int32(n))
	return l
}

// done records one completion; it reports whether it was the last, and the
// first error of all of them.
func (l *lastOf) done(err error) (last bool, first error) { return l.skip(1, err) }

// skip records k completions at once (chunks never started, with err).
func (l *lastOf) skip(k int, err error) (last bool, first error) {
	if err != nil {
		l.err.CompareAndSwap(nil, &err)
	}
	if l.left.Add(-int32(k)) != 0 {
		return false, nil
	}
	if p := l.err.Load(); p != nil {
		return true, *p
	}
	return true, nil
}

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
// alone (docs/PROTOCOL.md, "Chunks"): blocks are taken in order, a chunk
// takes the next block while its bytes stay within ChunkBytes and always
// takes at least one, from the Fetch's sizes (each block's length: blocks
// of one fetch may differ in size); chunk i goes under the Fetch token with
// its last two bytes XORed with i (big-endian).
const ChunkBytes = 8 << 20

// chunkPlan is where a fetch's chunks start: chunk i covers the blocks
// [bounds[i], bounds[i+1]). Computed identically on both sides.
type chunkPlan []int

// planChunks cuts blocks of sizes into chunks of at most ChunkBytes, at
// least one block each. With equal sizes b that is max(1, ChunkBytes/b)
// blocks per chunk, as before blocks could differ.
func planChunks(sizes []int) chunkPlan {
	bounds := chunkPlan{0}
	sum := 0
	for i, n := range sizes {
		if i > bounds[len(bounds)-1] && sum+n > ChunkBytes {
			bounds = append(bounds, i)
			sum = 0
		}
		sum += n
	}
	return append(bounds, len(sizes))
}

// count is the number of chunks.
func (p chunkPlan) count() int { return len(p) - 1 }

// span is chunk i's block range [lo, hi).
func (p chunkPlan) span(i int) (lo, hi int) { return p[i], p[i+1] }

// chunkToken derives chunk i's token from the fetch's.
func chunkToken(tok rdma.Token, i int) rdma.Token {
	tok[14] ^= byte(i >> 8)
	tok[15] ^= byte(i)
	return tok
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

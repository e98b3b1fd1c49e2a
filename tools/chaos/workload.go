package chaos

import (
	"sync"

	"github.com/kvtier/kvtier/tools/sim"
)

// workload is the run's request stream, shared by its engines: the
// simulator's synthetic multi-turn chats, generated in chunks from the
// seed. Chunk c reuses the block ids of chunk c-2 (the generator numbers
// from 0 in every chunk, offset by c mod 2), so prefixes come back after a
// chunk — by then mostly evicted from the CPU pool to the secondary
// tiers. A block's bytes are a function of its key, so a reused id is the
// same block wherever it appears.
type workload struct {
	mu    sync.Mutex
	seed  uint64
	chunk uint64
	reqs  []sim.Request
	next  int
	taken int
}

const (
	chunkRequests = 128
	chunkSpread   = 2
	chunkIDSpace  = 1 << 32
)

func newWorkload(seed uint64) *workload { return &workload{seed: seed} }

// take returns the next request and its sequence number.
func (w *workload) take() (sim.Request, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.next == len(w.reqs) {
		cfg := sim.SyntheticConfig{Seed: w.seed*1_000_003 + w.chunk, Requests: chunkRequests,
			SystemPrompts: 8, Concurrent: 24}
		w.reqs, w.next = sim.Synthetic(cfg), 0
		off := (w.chunk % chunkSpread) * chunkIDSpace
		for i := range w.reqs {
			for j := range w.reqs[i].Blocks {
				w.reqs[i].Blocks[j] += off
			}
		}
		w.chunk++
	}
	r := w.reqs[w.next]
	w.next++
	w.taken++
	return r, w.taken - 1
}

package sim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refCache is the test's own model of a recency-ranked block cache, written
// apart from the simulator's LRU and the CPU tier's policy: every use gives
// a block the next rank, and eviction takes the lowest rank (a heap of
// ranks, stale entries skipped), as vLLM's CPU LRU policy is written.
type refCache struct {
	cap   int
	next  uint64
	rank  map[uint64]uint64
	ranks minHeap[rankEntry]
}

type rankEntry struct{ rank, id uint64 }

func newRefCache(capacity int) *refCache {
	byRank := func(a, b rankEntry) bool { return a.rank < b.rank }
	return &refCache{cap: capacity, rank: map[uint64]uint64{}, ranks: minHeap[rankEntry]{less: byRank}}
}

func (c *refCache) has(id uint64) bool { _, ok := c.rank[id]; return ok }

// use ranks id most recent; false when it is not held.
func (c *refCache) use(id uint64) bool {
	if !c.has(id) {
		return false
	}
	c.next++
	c.rank[id] = c.next
	c.ranks.push(rankEntry{c.next, id})
	return true
}

// insert adds id (absent) most recent; the caller made room.
func (c *refCache) insert(id uint64) {
	c.rank[id] = 0
	c.use(id)
}

// evictExcept removes the least recent block not in keep.
func (c *refCache) evictExcept(keep map[uint64]bool) {
	var skipped []rankEntry
	for c.ranks.len() > 0 {
		e := c.ranks.pop()
		if r, ok := c.rank[e.id]; !ok || r != e.rank {
			continue // stale
		}
		if keep[e.id] {
			skipped = append(skipped, e)
			continue
		}
		delete(c.rank, e.id)
		break
	}
	for _, e := range skipped {
		c.ranks.push(e)
	}
}

// refEngine replays requests one at a time the way vLLM's scheduler and its
// CPU offloading tier treat them:
//   - the GPU prefix cache's hits are the prompt's leading blocks it holds;
//     after prefill it holds the whole prompt, its head ranked most recent;
//   - the CPU tier's hits are the leading blocks after those that it holds;
//   - the store offers the blocks after the load — or, when nothing was
//     loaded, the whole prompt — and copies the ones the tier lacks, making
//     room by evicting the least recent blocks outside the offer, or storing
//     nothing when that is not enough room;
//   - when the request finishes, every key it loaded or offered is ranked
//     again, its head most recent.
type refEngine struct {
	gpu, cpu                    *refCache
	gpuHits, cpuHits, evictions int
	stored, full                int
}

func (e *refEngine) request(blocks []uint64) {
	g := 0
	for g < len(blocks) && e.gpu.has(blocks[g]) {
		g++
	}
	h := 0
	for g+h < len(blocks) && e.cpu.has(blocks[g+h]) {
		h++
	}
	e.gpuHits += g
	e.cpuHits += h
	for i := len(blocks) - 1; i >= 0; i-- {
		if !e.gpu.use(blocks[i]) {
			if len(e.gpu.rank) >= e.gpu.cap {
				e.gpu.evictExcept(nil)
			}
			e.gpu.insert(blocks[i])
		}
	}
	offer, used := blocks, blocks
	if h > 0 {
		offer, used = blocks[g+h:], blocks[g:]
	}
	e.store(offer)
	for i := len(used) - 1; i >= 0; i-- {
		e.cpu.use(used[i])
	}
}

// store offers blocks to the CPU tier.
func (e *refEngine) store(offer []uint64) {
	if len(offer) == 0 {
		return
	}
	keep := map[uint64]bool{}
	var missing []uint64
	for _, id := range offer {
		if !e.cpu.has(id) && !keep[id] {
			missing = append(missing, id)
		}
		keep[id] = true
	}
	free := e.cpu.cap - len(e.cpu.rank)
	evictable := 0
	for id := range e.cpu.rank {
		if !keep[id] {
			evictable++
		}
	}
	need := len(missing) - free
	if need > evictable {
		e.full++
		return
	}
	for range max(need, 0) {
		e.cpu.evictExcept(keep)
		e.evictions++
	}
	for _, id := range missing {
		e.cpu.insert(id)
	}
	e.stored += len(missing)
}

func refRun(reqs []Request, gpuBlocks, cpuBlocks int) *refEngine {
	e := &refEngine{gpu: newRefCache(gpuBlocks), cpu: newRefCache(cpuBlocks)}
	for _, r := range reqs {
		e.request(r.Blocks)
	}
	return e
}

// TestSimulatorMatchesReferenceModel checks the simulator's engine against
// the reference model above, to the block: same GPU hits, same blocks
// loaded from the CPU tier, same blocks stored and evicted. One request
// runs at a time (MaxRunning 1): the model is the caches' rule, not the
// interleaving of a batch. A simulator that touched too little (only its
// GPU hits, as it once did), ranked the chain's tail most recent or
// offered only the blocks after its GPU hits, or a CPU tier that evicted an
// offered block, fails it.
func TestSimulatorMatchesReferenceModel(t *testing.T) {
	trace, err := ReadTraceFile(tracePath(t), 0)
	require.NoError(t, err)
	for _, tc := range []struct {
		name     string
		reqs     []Request
		gpu, cpu int
	}{
		{"synthetic", Synthetic(DefaultSynthetic(1, 3000)), 1000, 4096},
		{"synthetic small pool", Synthetic(DefaultSynthetic(2, 1500)), 200, 600},
		// The pool barely outholds the GPU: GPU hits it lost are stored again.
		{"synthetic pool near the GPU's size", Synthetic(DefaultSynthetic(4, 1500)), 250, 300},
		{"conversation trace", trace, 1000, 20000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.GPUBlocks, cfg.MaxRunning, cfg.ReachEvery = tc.gpu, 1, 0
			s := runNode(t, tc.reqs, tc.cpu, cfg)
			requireClean(t, s)
			ref := refRun(tc.reqs, tc.gpu, tc.cpu)
			assert.Equal(t, ref.gpuHits, s.GPUHitBlocks, "GPU hits")
			assert.Equal(t, ref.cpuHits, s.BlocksLoaded, "blocks loaded from the CPU tier")
			assert.Equal(t, ref.stored, s.BlocksStored, "blocks stored")
			assert.Equal(t, ref.full, s.StoreFull, "stores refused for room")
			assert.Equal(t, uint64(ref.evictions), s.Evictions, "evictions")
			assert.Positive(t, ref.evictions, "the pool is small enough to evict")
			t.Logf("%s: hit %.4f (gpu %d, cpu %d of %d blocks), %d evictions",
				tc.name, s.HitRate, s.GPUHitBlocks, s.BlocksLoaded, s.PromptBlocks, s.Evictions)
		})
	}
}

package sim

import (
	"errors"
	"fmt"
	"time"

	"context"

	"github.com/kvtier/kvtier/messages"
)

// lookup asks kvtier for the prompt blocks after the GPU's prefix. Leading
// HITs are leased to the request and accumulate across attempts; when the
// scan stops at RETRY or HIT_PENDING the request waits a step (at most
// MaxWait steps, then recomputes the rest) and asks again for the blocks
// after the ones already leased.
func (e *engine) lookup(ctx context.Context, r *running) error {
	if r.waits == 0 && r.hits == 0 {
		r.gpuHits = e.gpuPrefix(r.req.Blocks)
	}
	rest := r.keys[r.gpuHits+r.hits:]
	if len(rest) == 0 {
		return e.load(ctx, r)
	}
	t0 := time.Now()
	st, err := e.mgr.Lookup(ctx, r.ctx, rest, true)
	e.lookups = append(e.lookups, time.Since(t0))
	e.sum.Lookups++
	if err != nil {
		return fmt.Errorf("lookup %s: %w", r.ctx.RequestID, err)
	}
	if len(st) != len(rest) {
		return fmt.Errorf("lookup %s: %d answers for %d keys", r.ctx.RequestID, len(st), len(rest))
	}
	n := 0
	for n < len(st) && st[n] == messages.Hit {
		n++
	}
	r.hits += n
	if r.afterRetry {
		r.secondary += n
	}
	r.afterRetry = n < len(st) && st[n] == messages.Retry
	e.tierWork = e.tierWork || r.afterRetry
	if n < len(st) && (st[n] == messages.Retry || st[n] == messages.HitPending) {
		if r.waits < e.cfg.MaxWait {
			r.waits++
			e.sum.LookupWaits++
			return nil
		}
		e.sum.PendingGiveUp++
	}
	return e.load(ctx, r)
}

// gpuPrefix counts the leading blocks of chain in the GPU cache (without
// touching them: the prefill that uses them re-inserts the whole prompt).
func (e *engine) gpuPrefix(chain []uint64) int {
	n := 0
	for n < len(chain) && e.gpu.Contains(chain[n]) {
		n++
	}
	return n
}

// load turns the request's leased HITs into a load job; with none it goes
// straight to compute. A failed PrepareLoad makes the request recompute.
func (e *engine) load(ctx context.Context, r *running) error {
	r.phase = phaseCompute
	if r.hits == 0 {
		return nil
	}
	keys := r.keys[r.gpuHits : r.gpuHits+r.hits]
	lj, err := e.mgr.PrepareLoad(ctx, r.ctx, keys)
	if err != nil {
		if fatal(err) {
			return fmt.Errorf("prepare load %s: %w", r.ctx.RequestID, err)
		}
		e.sum.LoadErrors++
		r.hits, r.secondary = 0, 0
		return nil
	}
	if err := e.checkSlots(lj.Slots, len(keys)); err != nil {
		return fmt.Errorf("prepare load %s: %w", r.ctx.RequestID, err)
	}
	e.sum.LoadJobs++
	e.enqueue(&job{id: lj.ID, kind: messages.JobLoad, workers: lj.Workers, keys: keys, slots: lj.Slots, owner: r})
	r.phase = phaseLoading
	return nil
}

// checkSlots verifies a job's slot list against its keys and the pool.
func (e *engine) checkSlots(slots []int, keys int) error {
	if len(slots) != keys {
		return fmt.Errorf("%d slots for %d keys", len(slots), keys)
	}
	for _, s := range slots {
		if s < 0 || s >= e.pool.Slots() {
			return fmt.Errorf("slot %d outside the pool of %d", s, e.pool.Slots())
		}
	}
	return nil
}

// compute is the request's prefill: the GPU now holds its whole prompt, the
// blocks neither hit nor loaded are computed and stored to kvtier
// (write-through), and the request finishes.
func (e *engine) compute(ctx context.Context, r *running) error {
	for i := len(r.req.Blocks) - 1; i >= 0; i-- {
		e.gpu.Add(r.req.Blocks[i]) // the chain's head goes in last: evicted last
	}
	first := r.gpuHits + r.hits
	e.sum.GPUHitBlocks += r.gpuHits
	e.sum.BlocksLoaded += r.hits
	e.sum.SecondaryHitBlocks += r.secondary
	e.sum.BlocksRecomputed += len(r.keys) - first
	if e.cfg.TouchGPUHits && r.gpuHits > 0 {
		if err := e.mgr.Touch(ctx, r.ctx, r.keys[:r.gpuHits]); err != nil {
			return fmt.Errorf("touch %s: %w", r.ctx.RequestID, err)
		}
	}
	if first < len(r.keys) {
		if err := e.store(ctx, r, first); err != nil {
			return err
		}
	}
	r.phase = phaseDone
	if err := e.mgr.RequestFinished(ctx, r.ctx); err != nil {
		return fmt.Errorf("request finished %s: %w", r.ctx.RequestID, err)
	}
	return nil
}

// store issues the store job of the request's blocks from first on. Full is
// not an error: the blocks are simply not offloaded.
func (e *engine) store(ctx context.Context, r *running, first int) error {
	keys := r.keys[first:]
	plan, err := e.mgr.PrepareStore(ctx, storeContext(r, first), keys)
	if errors.Is(err, messages.ErrFull) {
		e.sum.StoreFull++
		e.sum.StoreSkipped += len(keys)
		return nil
	}
	if err != nil {
		return fmt.Errorf("prepare store %s: %w", r.ctx.RequestID, err)
	}
	if len(plan.ToStore) == 0 {
		return nil
	}
	if err := e.checkSlots(plan.Slots, len(plan.ToStore)); err != nil {
		return fmt.Errorf("prepare store %s: %w", r.ctx.RequestID, err)
	}
	e.sum.StoreJobs++
	e.enqueue(&job{id: plan.Job, kind: messages.JobStore, workers: plan.Workers, keys: plan.ToStore, slots: plan.Slots})
	return nil
}

// storeContext is the request's context narrowed to the stored blocks: the
// parent is the block before the first stored one and the tokens are those
// of the stored blocks, so the node's stored events carry exact provenance.
// It is a new value (same request id): the request's own context may still
// be read by the node for calls already made.
func storeContext(r *running, first int) *messages.ReqContext {
	c := *r.ctx
	c.ParentBlockHash = nil
	if first > 0 {
		c.ParentBlockHash = []byte(r.keys[first-1].Hash)
	}
	c.TokenIDs = tokenIDs(r.req.Blocks[first:])
	return &c
}

// tokenIDs makes up the token ids of blocks: TokensPerBlock per block, a
// cheap function of the block id (a Weyl sequence below a 65,536 vocabulary).
func tokenIDs(blocks []uint64) []int32 {
	t := make([]int32, len(blocks)*TokensPerBlock)
	for b, id := range blocks {
		x := uint32((id * 0x9e3779b97f4a7c15) >> 32)
		for i := range t[b*TokensPerBlock : (b+1)*TokensPerBlock] {
			x += 0x9e3779b9
			t[b*TokensPerBlock+i] = int32(x >> 16)
		}
	}
	return t
}

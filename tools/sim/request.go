package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvtier/kvtier/messages"
)

// NewReqContext is the context of a request of the simulated model, its
// jobs reported by workers (0: the node's default).
func NewReqContext(id string, workers int) *messages.ReqContext {
	return &messages.ReqContext{RequestID: id, Workers: workers, BlockSize: TokensPerBlock}
}

// Answer is a lookup's statuses as an engine reads them: the leading HITs
// are leased to the request; a scan that stops at RETRY or HIT_PENDING
// makes it wait a step and ask again for the blocks after those.
type Answer struct {
	Hits    int  // leading HITs
	Retry   bool // the scan stopped at RETRY (a secondary tier or peer promotes the next block)
	Pending bool // the scan stopped at HIT_PENDING (a write of the next block is in flight)
}

// Wait reports whether an engine waits a step before loading what it has.
func (a Answer) Wait() bool { return a.Retry || a.Pending }

// ReadLookup reads a lookup's statuses.
func ReadLookup(st []messages.LookupStatus) Answer {
	n := 0
	for n < len(st) && st[n] == messages.Hit {
		n++
	}
	a := Answer{Hits: n}
	if n < len(st) {
		a.Retry, a.Pending = st[n] == messages.Retry, st[n] == messages.HitPending
	}
	return a
}

// StoreContext is ctx for the store of keys[first:] (the prompt's blocks
// not found anywhere): a new value, same request id, whose parent is the
// block before the first stored one, so the node's stored events carry the
// chain. The request's own context may still be read by the node for calls
// already made.
func StoreContext(ctx *messages.ReqContext, keys []messages.Key, first int) *messages.ReqContext {
	c := *ctx
	c.ParentBlockHash = nil
	if first > 0 {
		c.ParentBlockHash = []byte(keys[first-1].Hash)
	}
	return &c
}

// lookup asks kvtier for the prompt blocks after the GPU's prefix. Leading
// HITs are leased to the request and accumulate across attempts; when the
// scan stops at RETRY or HIT_PENDING the request waits a step (at most
// MaxWait steps, then recomputes the rest) and asks again for the blocks
// after the ones already leased.
func (e *engine) lookup(ctx context.Context, r *running) error {
	if r.waits == 0 && r.hits == 0 {
		r.gpuHits = e.gpu.Prefix(r.req.Blocks)
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
	a := ReadLookup(st)
	r.hits += a.Hits
	if r.afterRetry {
		r.secondary += a.Hits
	}
	r.afterRetry = a.Retry
	e.tierWork = e.tierWork || r.afterRetry
	if a.Wait() {
		if r.waits < e.cfg.MaxWait {
			r.waits++
			e.sum.LookupWaits++
			return nil
		}
		e.sum.PendingGiveUp++
	}
	return e.load(ctx, r)
}

// load turns the request's leased HITs into a load job; with none it goes
// straight to compute. A failed PrepareLoad makes the request recompute.
func (e *engine) load(ctx context.Context, r *running) error {
	r.phase = PhaseCompute
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
	r.phase = PhaseLoading
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

// storeFrom is the first block the request offers to PrepareStore, as
// vLLM's offloading scheduler chooses it: after its load when it loaded
// from kvtier, else from the prompt's head — so blocks found in the GPU
// that kvtier no longer holds are stored again, and those it holds are
// offered (and so re-ranked at the finish) but not copied.
func (r *running) storeFrom() int {
	if r.hits > 0 {
		return r.gpuHits + r.hits
	}
	return 0
}

// used is every key the request loaded or offered to PrepareStore, head
// first: what vLLM re-ranks when the request finishes.
func (r *running) used() []messages.Key {
	if r.hits > 0 {
		return r.keys[r.gpuHits:]
	}
	return r.keys
}

// compute is the request's prefill: the GPU now holds its whole prompt, the
// blocks neither hit nor loaded are computed, the request's blocks from
// storeFrom are offered to kvtier (write-through), and the request
// finishes — its keys touched, then RequestFinished, in vLLM's order.
func (e *engine) compute(ctx context.Context, r *running) error {
	e.gpu.AddChain(r.req.Blocks)
	first := r.gpuHits + r.hits
	e.sum.GPUHitBlocks += r.gpuHits
	e.sum.BlocksLoaded += r.hits
	e.sum.SecondaryHitBlocks += r.secondary
	e.sum.BlocksRecomputed += len(r.keys) - first
	if from := r.storeFrom(); from < len(r.keys) {
		if err := e.store(ctx, r, from); err != nil {
			return err
		}
	}
	r.phase = PhaseDone
	if err := e.touchFinished(ctx, r); err != nil {
		return err
	}
	if err := e.mgr.RequestFinished(ctx, r.ctx); err != nil {
		return fmt.Errorf("request finished %s: %w", r.ctx.RequestID, err)
	}
	return nil
}

// touchFinished re-ranks every key the finished request used (loaded or
// offered to PrepareStore; not its GPU hits after which it loaded), as vLLM's
// scheduler does when a request finishes: Touch's last key is the most
// recent, so the keys go tail first and the prompt's head ends most recent
// (evicted last: a prefix lookup reaches a chain from its head).
func (e *engine) touchFinished(ctx context.Context, r *running) error {
	used := r.used()
	if !e.cfg.TouchFinished || len(used) == 0 {
		return nil
	}
	order := slices.Clone(used)
	slices.Reverse(order)
	if err := e.mgr.Touch(ctx, r.ctx, order); err != nil {
		return fmt.Errorf("touch %s: %w", r.ctx.RequestID, err)
	}
	return nil
}

// store offers the request's blocks from first on and issues the store job
// of those kvtier does not hold. Full is not an error: the blocks are
// simply not offloaded.
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

// storeContext is the request's StoreContext with the tokens of the stored
// blocks too, so the node's stored events carry exact provenance.
func storeContext(r *running, first int) *messages.ReqContext {
	c := StoreContext(r.ctx, r.keys, first)
	c.TokenIDs = tokenIDs(r.req.Blocks[first:])
	return c
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

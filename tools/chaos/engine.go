package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tools/sim"
)

// The simulated engine of a chaos run. Unlike tools/sim's (a virtual
// clock, every failure fatal) it runs on the wall clock against a node
// whose messages are being perturbed, so it must behave as a robust engine
// connector does: every call has a deadline; a call that fails or times out
// costs a recompute, never the run; a load's bytes count only if every
// worker report of its job was accepted (a reaped or restarted job's slots
// may have been reused while it copied). It checks what only the engine
// can see: a leased HIT that PrepareLoad refused, a loaded block with
// wrong bytes, a call not answered within its deadline. What the two
// engines share is tools/sim's: the GPU cache (LRU), keys, request and
// store contexts, how a lookup's answer is read, request phases and each
// worker's shard of a block's bytes.

// EngineConfig shapes the simulated engines.
type EngineConfig struct {
	Engines     int           // engine scheduler threads driving the node(s)
	MaxRunning  int           // requests scheduled at once per engine
	GPUBlocks   int           // blocks each engine's GPU cache holds
	Workers     int           // worker reports per job (tensor-parallel workers)
	StepTime    time.Duration // wall time of one engine step
	CopySteps   int           // steps a job's copy takes before its workers report
	MaxWait     time.Duration // how long a lookup waits on RETRY / HIT_PENDING
	CallTimeout time.Duration // deadline of every manager call
	// LargeBlocks, when > 0, is the bytes per block of every odd-numbered
	// engine: a second model, its keys in a namespace of their own,
	// served from the same pool budget in slots of that size.
	LargeBlocks int
}

// largeNS ends the namespace of the engines of large blocks
// (EngineConfig.LargeBlocks).
const largeNS = "-large"

// largeSalt makes the large-block model's block ids (and so its hashes)
// its own.
const largeSalt = 1 << 62

// DefaultEngineConfig is what `kvtier chaos` runs with.
func DefaultEngineConfig() EngineConfig {
	return EngineConfig{Engines: 4, MaxRunning: 4, GPUBlocks: 32, Workers: 2, StepTime: 2 * time.Millisecond,
		CopySteps: 2, MaxWait: 100 * time.Millisecond, CallTimeout: time.Second}
}

// Manager call names, as counted.
const (
	callLookup          = "lookup"
	callPrepareLoad     = "prepare_load"
	callTouch           = "touch"
	callCompleteLoad    = "complete_load"
	callPrepareStore    = "prepare_store"
	callCompleteStore   = "complete_store"
	callJobDone         = "job_done"
	callRequestFinished = "request_finished"
	callTakeEvents      = "take_events"
)

// request is a scheduled request's state.
type request struct {
	ctx     *messages.ReqContext
	blocks  []uint64
	keys    []messages.Key
	phase   sim.Phase
	gpuHits int
	hits    int // blocks after gpuHits leased as HIT
	waiting time.Time
	// The oldest lease: when the lookup that took it was sent, and the
	// bridge's restart count before it was sent.
	leaseSent  time.Time
	leaseEpoch uint64
	faulted    bool // a fault cost this request blocks it had found
}

// job is a transfer job the engine's workers are copying.
type job struct {
	id      messages.JobID
	kind    messages.JobKind
	keys    []messages.Key
	slots   []int
	workers int
	stalled int // the worker that never reports, or -1
	due     int64
	sent    time.Time // when the call that opened it was sent
	owner   *request  // the loading request; nil for stores
}

// engine is one engine scheduler thread.
type engine struct {
	id    int
	cfg   EngineConfig
	run   *runState
	node  *nodeUnderTest
	mgr   kvtier.Manager
	pool  kvtier.SlotMemory
	gpu   *sim.LRU
	reqs  []*request
	jobs  []*job
	step  int64
	drain bool   // this engine drains the node's TakeEvents stream
	gen   uint64 // the node incarnation mgr and pool belong to
}

// loop runs steps until stop closes and every request and job is done.
func (e *engine) loop(ctx context.Context, stop <-chan struct{}) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		e.node.life.RLock()
		if e.node.down.Load() {
			// A peer-kill could not reopen the node: what it had in flight
			// died with it, and its pool must not be touched.
			e.node.life.RUnlock()
			return
		}
		e.follow()
		stopping := closed(stop)
		if stopping && len(e.reqs) == 0 && len(e.jobs) == 0 {
			if e.drain {
				e.takeEvents(ctx)
			}
			e.node.life.RUnlock()
			return
		}
		start := time.Now()
		e.stepOnce(ctx, stopping)
		e.node.life.RUnlock()
		if ctx.Err() != nil {
			return
		}
		// NB: the pace of an engine step (its model's forward pass), not a
		// synchronisation: the node is never waited on by sleeping.
		t.Reset(max(e.cfg.StepTime-time.Since(start), 0))
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// follow moves the engine to the node's current incarnation after a
// peer-kill restarted it: what it had in flight there died with the node
// (its requests are recomputed, its loads voided, its stores lost), as an
// engine whose kvtier process died would (REQUIRES: e.node.life held).
func (e *engine) follow() {
	gen := e.node.gen.Load()
	if gen == e.gen {
		return
	}
	for _, j := range e.jobs {
		if j.kind == messages.JobLoad {
			e.run.stats.voidedLoads.Add(1)
		}
	}
	for _, r := range e.reqs {
		if r.hits > 0 {
			e.run.stats.faultRecomputed.Add(int64(r.hits))
			e.run.stats.faultedRequests.Add(1)
		}
		e.run.stats.killedRequests.Add(1)
	}
	clear(e.reqs)
	clear(e.jobs)
	e.reqs, e.jobs = e.reqs[:0], e.jobs[:0]
	e.mgr, e.pool, e.gen = e.node.mgr, e.node.mgr.Pool(), gen
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (e *engine) stepOnce(ctx context.Context, stopping bool) {
	e.deliver(ctx)
	if !stopping {
		for len(e.reqs) < e.cfg.MaxRunning {
			e.reqs = append(e.reqs, e.newRequest())
		}
	}
	for _, r := range e.reqs {
		if r.phase == sim.PhaseLookup {
			e.lookup(ctx, r)
		}
	}
	for _, r := range e.reqs {
		if r.phase == sim.PhaseCompute {
			e.compute(ctx, r)
		}
	}
	kept := e.reqs[:0]
	for _, r := range e.reqs {
		if r.phase != sim.PhaseDone {
			kept = append(kept, r)
		}
	}
	clear(e.reqs[len(kept):])
	e.reqs = kept
	if e.drain {
		e.takeEvents(ctx)
	}
	e.step++
}

func (e *engine) newRequest() *request {
	req, seq := e.run.work.take()
	ns, blocks, blockBytes := e.run.ns, req.Blocks, 0
	if e.cfg.LargeBlocks > 0 && e.id%2 == 1 {
		// NB: other hashes too, not only another namespace: the node's
		// event stream names a block by its hash alone (one model per
		// stream, docs/DESIGN.md §9), and the run checks that stream.
		ns, blockBytes = e.run.ns+largeNS, e.cfg.LargeBlocks
		blocks = make([]uint64, len(req.Blocks))
		for i, b := range req.Blocks {
			blocks[i] = b ^ largeSalt
		}
	}
	keys := sim.Keys(ns, blocks)
	e.run.stats.requests.Add(1)
	e.run.stats.promptBlocks.Add(int64(len(keys)))
	ctx := sim.NewReqContext(fmt.Sprintf("%s-e%d-r%d", e.node.name, e.id, seq), e.cfg.Workers)
	ctx.BlockBytes = blockBytes // NB: as the endpoint sets it for a session of that geometry
	return &request{ctx: ctx, blocks: blocks, keys: keys}
}

// call makes one manager call with its deadline and counts its outcome;
// req names the request it is for (for a violation's detail).
func (e *engine) call(ctx context.Context, name, req string, f func(context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, e.cfg.CallTimeout)
	defer cancel()
	start := time.Now()
	err := f(cctx)
	c := e.run.stats.call(name)
	c.ops.Add(1)
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		c.timeouts.Add(1)
		e.run.timedOut(name, req, start)
		if late := time.Since(start) - e.cfg.CallTimeout; late > e.cfg.CallTimeout {
			// NB: the manager returns at its deadline; a call that came back
			// much later means the caller's deadline was not honoured.
			e.run.violate(e.node, invDeadline, "%s returned %v after its %v deadline", name, late, e.cfg.CallTimeout)
		}
	case errors.Is(err, scheduler.ErrRestarted):
		c.restarted.Add(1)
	default:
		c.errors.Add(1)
	}
	return err
}

// lookup asks for the blocks after the GPU prefix and the HITs leased so
// far; it waits a step on RETRY / HIT_PENDING (up to MaxWait), then loads.
func (e *engine) lookup(ctx context.Context, r *request) {
	if r.hits == 0 && r.waiting.IsZero() {
		r.gpuHits = e.gpu.Prefix(r.blocks)
	}
	rest := r.keys[r.gpuHits+r.hits:]
	if len(rest) == 0 {
		e.load(ctx, r)
		return
	}
	epoch, sent := e.node.epoch.Load(), time.Now()
	var st []messages.LookupStatus
	err := e.call(ctx, callLookup, r.ctx.RequestID, func(c context.Context) error {
		var err error
		st, err = e.mgr.Lookup(c, r.ctx, rest, true)
		return err
	})
	if err != nil {
		r.faulted = r.faulted || r.hits > 0
		e.load(ctx, r) // kvtier cannot tell now: load what is leased, compute the rest
		return
	}
	if len(st) != len(rest) {
		e.run.violate(e.node, invAnswers, "lookup of %d keys answered %d statuses", len(rest), len(st))
		e.load(ctx, r)
		return
	}
	a := sim.ReadLookup(st)
	if a.Hits > 0 && r.hits == 0 {
		r.leaseSent, r.leaseEpoch = sent, epoch
	}
	r.hits += a.Hits
	e.run.stats.hitBlocks.Add(int64(a.Hits))
	if a.Wait() {
		if r.waiting.IsZero() {
			r.waiting = time.Now()
		}
		if time.Since(r.waiting) < e.cfg.MaxWait {
			return
		}
	}
	e.load(ctx, r)
}

// load turns the request's leased HITs into a load job. A PrepareLoad
// refused for leases that cannot have expired, with no bridge restart
// since they were taken, breaks the manager's promise.
func (e *engine) load(ctx context.Context, r *request) {
	r.phase = sim.PhaseCompute
	if r.hits == 0 {
		return
	}
	keys := r.keys[r.gpuHits : r.gpuHits+r.hits]
	var lj messages.LoadJob
	sent := time.Now()
	err := e.call(ctx, callPrepareLoad, r.ctx.RequestID, func(c context.Context) error {
		var err error
		lj, err = e.mgr.PrepareLoad(c, r.ctx, keys)
		return err
	})
	if err != nil {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, scheduler.ErrRestarted) {
			restarted := e.node.epoch.Load() != r.leaseEpoch
			expired := time.Since(r.leaseSent) >= e.run.nodeCfg.LeaseTTL
			if !restarted && !expired {
				e.run.violate(e.node, invHitLoadable, "PrepareLoad of %d leased HITs of %s failed %v after the lease: %v",
					len(keys), r.ctx.RequestID, time.Since(r.leaseSent).Round(time.Millisecond), err)
			}
		}
		e.recompute(r)
		return
	}
	if len(lj.Slots) != len(keys) {
		e.run.violate(e.node, invAnswers, "PrepareLoad of %d keys answered %d slots", len(keys), len(lj.Slots))
		e.recompute(r)
		return
	}
	j := &job{id: lj.ID, kind: messages.JobLoad, keys: keys, slots: lj.Slots, workers: max(lj.Workers, 1),
		sent: sent, owner: r}
	e.open(j, "engine load")
	r.phase = sim.PhaseLoading
}

// recompute gives up on the blocks the request had found in kvtier.
func (e *engine) recompute(r *request) {
	if r.hits > 0 {
		r.faulted = true
		e.run.stats.faultRecomputed.Add(int64(r.hits))
	}
	r.hits = 0
	r.phase = sim.PhaseCompute
}

// open schedules a job's reports, deciding whether one worker stalls.
func (e *engine) open(j *job, site string) {
	j.stalled = -1
	if d := e.run.gate.decide(site, supervision.FaultStall); !d.None() {
		j.stalled = int(d.Arg % uint64(j.workers))
	}
	j.due = e.step + int64(max(e.cfg.CopySteps, 1))
	e.jobs = append(e.jobs, j)
}

// deliver runs the jobs due this step: each worker copies its shard of
// every block and reports.
func (e *engine) deliver(ctx context.Context) {
	kept := e.jobs[:0]
	var due []*job
	for _, j := range e.jobs {
		if j.due <= e.step {
			due = append(due, j)
		} else {
			kept = append(kept, j)
		}
	}
	clear(e.jobs[len(kept):])
	e.jobs = kept
	for _, j := range due {
		e.work(ctx, j)
	}
}

func (e *engine) work(ctx context.Context, j *job) {
	bad := make([]bool, len(j.keys))
	ok := j.stalled < 0
	for w := 0; w < j.workers; w++ {
		if w == j.stalled {
			continue // a hung worker: never copies, never reports
		}
		// NB: a store whose deadline has (nearly) passed is not written:
		// the engine's contract is to finish within the job deadline, after
		// which the node may give the slots to another writer. Checked per
		// worker: an earlier worker's report may have taken a call timeout.
		if j.kind == messages.JobStore && time.Since(j.sent) > e.run.nodeCfg.StoreJobTimeout*3/4 {
			e.run.stats.lateStores.Add(1)
			ok = false
			break
		}
		for i, k := range j.keys {
			slot := e.pool.Slot(j.slots[i])
			if j.kind == messages.JobStore {
				e.node.wrote(j.slots[i], k, j.id, w)
				if e.run.hooks.BadStore != nil && e.run.hooks.BadStore(k) {
					k = sim.KeyFor(e.run.ns, ^uint64(0)) // another block's bytes
				}
				sim.WriteShard(slot, k, j.workers, w)
			} else if !sim.VerifyShard(slot, k, j.workers, w) {
				bad[i] = true
			}
		}
		if err := e.call(ctx, callJobDone, fmt.Sprintf("job %d worker %d", j.id, w), func(c context.Context) error { return e.mgr.JobDone(c, j.id, w, true) }); err != nil {
			ok = false // unknown (reaped, restarted), or unanswered: the job did not complete
		}
	}
	if j.stalled >= 0 {
		e.run.stats.stalledJobs.Add(1)
	}
	if j.kind == messages.JobStore {
		if ok {
			e.run.stats.storedBlocks.Add(int64(len(j.keys)))
		}
		return
	}
	r := j.owner
	if !ok {
		for _, b := range bad {
			if b {
				e.run.stats.voidedCorrupt.Add(1)
			}
		}
		e.run.stats.voidedLoads.Add(1)
		e.recompute(r)
		return
	}
	for i, b := range bad {
		if b {
			e.run.violate(e.node, invWrongBytes, "block %x loaded by job %d (%s) from slot %d has wrong bytes (slot last written by the engines: %s; %d bridge restarts before the lease, %d now)",
				j.keys[i].Hash, j.id, r.ctx.RequestID, j.slots[i], e.node.lastWrite(j.slots[i]), r.leaseEpoch, e.node.epoch.Load())
		} else {
			e.run.stats.verifiedBlocks.Add(1)
		}
	}
	r.phase = sim.PhaseCompute
}

// compute is the request's prefill: the GPU holds its prompt, the blocks
// not loaded are computed and stored, and the request finishes.
func (e *engine) compute(ctx context.Context, r *request) {
	e.gpu.AddChain(r.blocks)
	first := r.gpuHits + r.hits
	e.run.stats.gpuHitBlocks.Add(int64(r.gpuHits))
	e.run.stats.loadedBlocks.Add(int64(r.hits))
	e.run.stats.recomputed.Add(int64(len(r.keys) - first))
	if r.faulted {
		e.run.stats.faultedRequests.Add(1)
	}
	if r.gpuHits > 0 {
		_ = e.call(ctx, callTouch, r.ctx.RequestID, func(c context.Context) error { return e.mgr.Touch(c, r.ctx, r.keys[:r.gpuHits]) })
	}
	if first < len(r.keys) {
		e.store(ctx, r, first)
	}
	_ = e.call(ctx, callRequestFinished, r.ctx.RequestID, func(c context.Context) error { return e.mgr.RequestFinished(c, r.ctx) })
	r.phase = sim.PhaseDone
}

func (e *engine) store(ctx context.Context, r *request, first int) {
	keys := r.keys[first:]
	sc := sim.StoreContext(r.ctx, r.keys, first)
	var plan messages.StorePlan
	sent := time.Now()
	err := e.call(ctx, callPrepareStore, r.ctx.RequestID, func(c context.Context) error {
		var err error
		plan, err = e.mgr.PrepareStore(c, sc, keys)
		return err
	})
	if err != nil || len(plan.ToStore) == 0 {
		return // full, unanswered or restarted: the blocks are not offloaded
	}
	if len(plan.Slots) != len(plan.ToStore) {
		e.run.violate(e.node, invAnswers, "PrepareStore planned %d keys in %d slots", len(plan.ToStore), len(plan.Slots))
		return
	}
	e.open(&job{id: plan.Job, kind: messages.JobStore, keys: plan.ToStore, slots: plan.Slots,
		workers: max(plan.Workers, 1), sent: sent}, "engine store")
}

// takeEvents drains the node's TakeEvents stream into its model.
func (e *engine) takeEvents(ctx context.Context) {
	var evs []messages.Event
	// NB: a TakeEvents a bridge restart failed (ErrRestarted) loses
	// nothing: what the CPU tier drained for it comes with the next one
	// (the bridge's carry), so events-consistent is checked after restarts.
	_ = e.call(ctx, callTakeEvents, "", func(c context.Context) error {
		var err error
		evs, err = e.mgr.TakeEvents(c)
		return err
	})
	for i := range evs {
		e.node.take.apply(&evs[i])
	}
}

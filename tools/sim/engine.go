package sim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/messages"
)

// Config is how the simulated engine behaves.
type Config struct {
	GPUBlocks  int           // blocks the GPU cache holds
	Workers    int           // worker reports per job (tensor-parallel workers); 0 = node default
	StepTime   time.Duration // virtual duration of one model step
	CopyTime   time.Duration // virtual copy time per block of a job
	MaxRunning int           // requests scheduled at once
	MaxWait    int           // steps a lookup waits on RETRY / HIT_PENDING before recomputing
	// TimeScale > 0 replays arrivals at Arrival/TimeScale on the virtual
	// clock; 0 admits requests as fast as the node allows.
	TimeScale float64
	// Realtime paces steps so the virtual clock tracks the wall clock.
	Realtime bool
	// TouchFinished re-ranks a finished request's blocks as vLLM's
	// offloading scheduler does (on_request_finished): one Touch of every
	// key the request used — found in the GPU, loaded, or newly stored —
	// its head most recent. Off, nothing is ever touched: blocks keep the
	// rank their store gave them (a worse cache than vLLM gets).
	TouchFinished bool
	Namespace     messages.Namespace
	// Progress, if set, is called after every step with requests finished
	// and the total.
	Progress func(done, total int)
	// Settle polls Stats after each store job's reports until the node has
	// committed it. The node answers a job's last report only once its
	// blocks are committed, so this is off by default; it remains for
	// managers that do not (a check, not a requirement).
	Settle bool
	// DrainTimeout bounds the wait, after the last report, for the node to
	// become quiet (no pending work, no pins, leases or pending writes).
	DrainTimeout time.Duration
	// ReachEvery samples, every so many steps, the share of the node's
	// held blocks that no prefix lookup can reach (their parent is held
	// nowhere): Summary.UnreachableCapacity. 0 = never; needs a manager that
	// lists its node's inventory (InventoryManager).
	ReachEvery int
}

// DefaultConfig is the engine `kvtier sim` runs with no flags.
func DefaultConfig() Config {
	return Config{GPUBlocks: 1000, Workers: 2, StepTime: 20 * time.Millisecond,
		CopyTime: 50 * time.Microsecond, MaxRunning: 8, MaxWait: 4, TouchFinished: true, Settle: false,
		Namespace: DefaultLayout.Namespace(), DrainTimeout: 5 * time.Second, ReachEvery: 50}
}

// Phase is where a scheduled request of a simulated engine is.
type Phase uint8

const (
	PhaseLookup  Phase = iota // asking kvtier for the blocks the GPU lacks
	PhaseLoading              // its load job is in flight
	PhaseCompute              // prefill this step
	PhaseDone                 // finished: the scheduler drops it
)

// running is a scheduled request's state.
type running struct {
	req     Request
	ctx     *messages.ReqContext
	keys    []messages.Key
	phase   Phase
	gpuHits int // leading blocks found in the GPU cache
	hits    int // blocks after those leased as HIT in kvtier
	waits   int // steps spent waiting on RETRY / HIT_PENDING
	// secondary counts the hits that followed a RETRY (promoted from a
	// secondary tier); afterRetry is whether the last lookup stopped there.
	secondary  int
	afterRetry bool
}

// engine is the simulated engine scheduler: one thread, a virtual clock.
type engine struct {
	cfg      Config
	mgr      kvtier.Manager
	pool     kvtier.SlotMemory
	gpu      *LRU
	reqs     []Request
	next     int // index of the next request to admit
	done     int
	now      time.Duration
	run      []*running
	jobs     jobQueue
	seq      uint64
	storing  int // keys of store jobs issued and not yet reported
	sum      Summary
	lookups  []time.Duration
	wall     time.Time
	tiered   TieredManager    // nil when the manager has no secondary tiers to settle
	tierWork bool             // a lookup of this step answered RETRY: secondary work to settle
	inv      InventoryManager // nil when the manager cannot list its node's blocks
	reach    *reach
}

// Run replays reqs against mgr and returns the summary. mode names the
// workload in the summary. It returns an error only when the node fails a
// call it must not fail (closed, timed out, malformed answers); data
// corruption and leaks are reported in the summary.
func Run(ctx context.Context, mgr kvtier.Manager, reqs []Request, cfg Config) (Summary, error) {
	e := &engine{cfg: cfg, mgr: mgr, pool: mgr.Pool(), gpu: NewLRU(cfg.GPUBlocks), jobs: newJobQueue(), reqs: reqs, wall: time.Now()}
	e.tiered, _ = mgr.(TieredManager)
	if e.inv, _ = mgr.(InventoryManager); e.inv != nil && cfg.ReachEvery > 0 {
		e.reach = newReach()
	}
	e.cfg.MaxRunning = max(e.cfg.MaxRunning, 1)
	e.sum.Requests = len(reqs)
	for e.done < len(reqs) || e.jobs.len() > 0 {
		if err := e.step(ctx); err != nil {
			return e.sum, err
		}
	}
	if err := e.tierSummary(ctx); err != nil {
		return e.sum, err
	}
	if err := e.quiesce(ctx); err != nil {
		return e.sum, err
	}
	if e.reach != nil {
		f := e.reach.fraction()
		e.sum.UnreachableCapacity = &f
	}
	e.sum.VirtualSeconds = e.now.Seconds()
	e.sum.WallSeconds = time.Since(e.wall).Seconds()
	e.sum.finish(e.lookups)
	return e.sum, nil
}

// step runs one engine step: worker reports due now, admissions, lookups,
// prefills; then the clock moves on.
func (e *engine) step(ctx context.Context) error {
	e.pace()
	if err := e.deliver(ctx); err != nil {
		return err
	}
	e.admit()
	for _, r := range e.run {
		if r.phase == PhaseLookup {
			if err := e.lookup(ctx, r); err != nil {
				return err
			}
		}
	}
	for _, r := range e.run {
		if r.phase == PhaseCompute {
			if err := e.compute(ctx, r); err != nil {
				return err
			}
		}
	}
	e.reap()
	if err := e.settleTiers(ctx); err != nil {
		return err
	}
	e.sum.Steps++
	if e.reach != nil && e.sum.Steps%e.cfg.ReachEvery == 0 {
		inv, err := e.inv.Inventory(ctx)
		if err != nil {
			return err
		}
		e.reach.sample(inv)
	}
	if e.cfg.Progress != nil {
		e.cfg.Progress(e.done, len(e.reqs))
	}
	e.advance()
	return nil
}

// arrival is request i's arrival on the virtual clock.
func (e *engine) arrival(i int) time.Duration {
	if e.cfg.TimeScale <= 0 {
		return 0
	}
	return time.Duration(float64(e.reqs[i].Arrival) / e.cfg.TimeScale)
}

// admit schedules arrived requests while there is room.
func (e *engine) admit() {
	for e.next < len(e.reqs) && len(e.run) < e.cfg.MaxRunning && e.arrival(e.next) <= e.now {
		e.run = append(e.run, e.newRunning(e.next))
		e.next++
	}
}

// newRunning builds request i's state and context.
func (e *engine) newRunning(i int) *running {
	req := e.reqs[i]
	keys := Keys(e.cfg.Namespace, req.Blocks)
	e.sum.PromptBlocks += len(keys)
	if e.reach != nil {
		e.reach.note(keys)
	}
	return &running{req: req, ctx: NewReqContext(fmt.Sprintf("sim-%d", i), e.cfg.Workers), keys: keys}
}

// reap drops finished requests, keeping admission order.
func (e *engine) reap() {
	kept := e.run[:0]
	for _, r := range e.run {
		if r.phase == PhaseDone {
			e.done++
			continue
		}
		kept = append(kept, r)
	}
	clear(e.run[len(kept):])
	e.run = kept
}

// advance moves the virtual clock one step, or straight to the step of the
// next event when nothing is running.
func (e *engine) advance() {
	e.now += e.cfg.StepTime
	if len(e.run) > 0 {
		return
	}
	target, ok := e.jobs.nextDue()
	if e.next < len(e.reqs) {
		if a := e.arrival(e.next); !ok || a < target {
			target, ok = a, true
		}
	}
	if ok && target > e.now && e.cfg.StepTime > 0 {
		steps := (target - e.now + e.cfg.StepTime - 1) / e.cfg.StepTime
		e.now += steps * e.cfg.StepTime
	}
}

// pace sleeps until the wall clock reaches the virtual clock (realtime only).
func (e *engine) pace() {
	if e.cfg.Realtime {
		time.Sleep(time.Until(e.wall.Add(e.now)))
	}
}

// copyTime is the virtual time to copy n blocks.
func (e *engine) copyTime(n int) time.Duration { return time.Duration(n) * e.cfg.CopyTime }

// enqueue registers a job whose reports arrive after its copy time.
func (e *engine) enqueue(j *job) {
	e.seq++
	j.seq, j.due = e.seq, e.now+e.copyTime(len(j.keys))
	if j.kind == messages.JobStore {
		e.storing += len(j.keys)
	}
	e.jobs.push(j)
}

// fatal reports whether err means the node cannot go on serving the run.
func fatal(err error) bool {
	return errors.Is(err, messages.ErrClosed) || errors.Is(err, context.Canceled) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, messages.ErrBadKey)
}

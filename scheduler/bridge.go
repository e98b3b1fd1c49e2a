package scheduler

import (
	"fmt"
	"hash/crc32"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier/tiers/tiering/tieringmsg"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/internal/cede"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
)

// Bridge is the engine-facing actor: it serves the manager API, owns the
// request and job registry, arms one deadline timer per job and reaps jobs
// whose deadline passes.
//
// Invariants:
//   - state is touched only inside Receive; CPU-tier answers come back as
//     messages matched by correlation id, never awaited.
//   - every engine call is answered exactly once (its Reply is buffered).
//   - every job leaves the registry exactly once — completed, claimed key by
//     key, or reaped — and releases what it holds at the CPU tier exactly once.
//   - reaping costs O(that job): a timer per job, no sweep.
//   - a restart loses request and job state: the new incarnation tells the
//     CPU tier to drop every engine lease, pin and write (stores fail, loads
//     unpin), and every report for an old job is late.
type Bridge struct {
	cfg      Config
	reg      registry
	pending  map[uint64]pendingCall
	corr     uint64
	paused   bool
	closed   bool
	waiters  []drainWaiter
	restart  bool
	resetGen uint64
	commits  int // CommitSlots sent or being checksummed, not yet acknowledged
	// Checksummed commits go to the CPU tier in the order they began
	// (their checksums finish in any order): a commit lands after the ones
	// completed before it, so blocks are ranked in completion order.
	commitIssued, commitNext uint64
	parked                   map[uint64]*checksummed
	// order holds engine calls that would overtake a commit still being
	// checksummed, or a held call of their request (order.go).
	order callOrder
	// carry holds events drained from the CPU tier for a TakeEvents that a
	// restart failed; the next TakeEvents returns them first. It outlives
	// restarts (every incarnation gets the same one).
	carry *[]messages.Event
}

// Config is what a Bridge needs from the node. The pointers survive actor
// restarts: job ids are never reused, counters never go back.
type Config struct {
	CPU          *actor.PID        // the CPU tier
	Slot         func(int) []byte  // slot bytes, for checksums (read off the mailbox)
	Offload      *actors.Offload   // where those reads run, tracked for the pool's unmapping (nil: untracked)
	Clock        supervision.Clock // deadlines and leases
	LeaseTTL     time.Duration     // engine lease length
	Workers      int               // default worker reports per job
	LoadTimeout  time.Duration     // load job deadline
	StoreTimeout time.Duration     // store job deadline
	JobSeq       *atomic.Uint64    // job id source
	Counters     *Counters         // bridge counters
	Restarts     *atomic.Uint64    // supervised restarts, for Stats
	Tiering      *actor.PID        // the tiering actor; nil without secondary tiers (bridge_tiering.go)
	Log          zerolog.Logger    // structured logs
}

// Counters are the bridge's monotonic counters. Only the bridge actor
// writes them, inside Receive.
type Counters struct {
	JobsCompleted, ReapedLoad, ReapedStore, LateReports uint64
}

type pendingCall struct {
	onReply func(any)   // continue with the CPU tier's answer
	fail    func(error) // answer the engine call with an error
}

type drainWaiter struct {
	upTo messages.JobID // wait for jobs with id ≤ upTo
	gen  uint64         // reset generation that may reap them (0 = none)
	done func()
	fail func(error) // answer the waiting call when the bridge restarts
}

// Messages the bridge sends itself.
type (
	jobDeadline struct{ id messages.JobID }
	reapAt      struct{ gen uint64 }
	checksummed struct {
		by   *Bridge // the incarnation that counted the commit in flight
		job  messages.JobRef
		req  *messages.ReqContext
		keys []messages.Key
		pos  []messages.Placement // per key: its place in the job's call
		sums []uint32
		then func(error)
		seq  uint64 // the commit's place in begin order
	}
)

// ErrRestarted answers calls in flight when the bridge restarted.
var ErrRestarted = fmt.Errorf("%w: bridge restarted", messages.ErrClosed)

// Props builds the bridge's props. incarnation counts how often the
// producer ran, so a restarted bridge knows it is one.
func Props(cfg Config) *actor.Props {
	var incarnation atomic.Uint64
	carry := new([]messages.Event)
	return actor.PropsFromProducer(func() actor.Actor {
		n := incarnation.Add(1)
		// NB: each incarnation numbers its CPU-tier calls in a range of its
		// own, so an answer to a call of the one before (still in the
		// mailbox) never resumes a new call of another kind.
		return &Bridge{cfg: cfg, reg: newRegistry(), pending: map[uint64]pendingCall{},
			restart: n > 1, corr: (n - 1) << 40, carry: carry}
	}, actor.WithReceiverMiddleware(supervision.Faults))
}

// Receive handles one message.
func (b *Bridge) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		b.started(ctx)
	case *actor.Restarting:
		b.failInFlight()
	case *messages.Lookup, *messages.PrepareLoad, *messages.Touch, *messages.CompleteLoad,
		*messages.PrepareStore, *messages.CompleteStore, *messages.JobDone, *messages.RequestFinished,
		*messages.TakeEvents, *messages.HasPendingWork, *messages.Pause, *messages.Resume,
		*messages.ResetCache, *messages.ReleaseSession, *messages.Grant, *messages.StoreCredited:
		if b.order.admit(m) {
			b.serve(ctx, m)
		}
	case *messages.GetStats:
		b.stats(ctx, m)
	case *messages.Shutdown:
		b.shutdown(ctx, m)
	case *cpumsg.CreditGranted:
		b.resume(m.Corr, m)
	case *cpumsg.CreditBound:
		b.resume(m.Corr, m)
	case *jobDeadline:
		b.deadline(ctx, m)
	case *reapAt:
		b.reapUpTo(ctx, m.gen)
	case *checksummed:
		b.commitChecksummed(ctx, m)
	case *cpumsg.LookupResult:
		b.resume(m.Corr, m)
	case *cpumsg.PinResult:
		b.resume(m.Corr, m)
	case *cpumsg.ReserveResult:
		b.resume(m.Corr, m)
	case *messages.Ack:
		b.resumeAck(m)
	case *cpumsg.TierEvents:
		if _, asked := b.pending[m.Corr]; !asked {
			// Drained for a TakeEvents the last restart failed: kept for the
			// next one, never lost.
			*b.carry = append(*b.carry, m.Events...)
			return
		}
		b.resume(m.Corr, m)
	case *cpumsg.TierStatsResult:
		b.resume(m.Corr, m)
	case *tieringmsg.AsyncLookupResult:
		b.resume(m.Corr, m)
	case *actor.Stopping:
		b.failHeld(messages.ErrClosed)
	case *actor.Stopped, *actor.Restart:
	default:
		b.cfg.Log.Warn().Str("type", fmt.Sprintf("%T", m)).Msg("bridge: unknown message dropped")
	}
}

// serve handles an engine call admitted in its order (order.go).
func (b *Bridge) serve(ctx actor.Context, m any) {
	switch m := m.(type) {
	case *messages.Lookup:
		b.lookup(ctx, m)
	case *messages.PrepareLoad:
		b.prepareLoad(ctx, m)
	case *messages.Touch:
		b.touch(ctx, m)
	case *messages.CompleteLoad:
		b.completeLoad(ctx, m)
	case *messages.PrepareStore:
		b.prepareStore(ctx, m)
	case *messages.CompleteStore:
		b.completeStore(ctx, m)
	case *messages.JobDone:
		b.jobDone(ctx, m)
	case *messages.RequestFinished:
		ctx.Send(b.cfg.CPU, &cpumsg.ReleaseHolder{Holder: m.Req.Holder()})
		m.Reply.Answer(struct{}{}, nil)
	case *messages.TakeEvents:
		b.takeEvents(ctx, m)
	case *messages.HasPendingWork:
		// Only engine jobs need an engine step; peers, promotions, cascades
		// and commits progress on their own (the contract: manager.go).
		m.Reply.Answer(len(b.reg.jobs) > 0, nil)
	case *messages.Pause:
		b.pause(ctx, m)
	case *messages.Resume:
		b.paused = b.closed
		m.Reply.Answer(struct{}{}, b.closedErr())
	case *messages.ResetCache:
		b.resetCache(ctx, m)
	case *messages.ReleaseSession:
		b.releaseSession(ctx, m)
	case *messages.Grant:
		b.grant(ctx, m)
	case *messages.StoreCredited:
		b.storeCredited(ctx, m)
	}
}

// serveHeld re-admits the held calls in arrival order, once a commit was
// sent to the CPU tier.
func (b *Bridge) serveHeld(ctx actor.Context) {
	if b.order.waiting() == 0 {
		return
	}
	for _, m := range b.order.release() {
		if b.order.admit(m) {
			b.serve(ctx, m)
		}
	}
}

// failHeld answers every held call with err: the incarnation that held
// them is going away.
func (b *Bridge) failHeld(err error) {
	for _, m := range b.order.release() {
		failCall(m, err)
	}
}

func (b *Bridge) started(ctx actor.Context) {
	if b.restart {
		b.cfg.Log.Warn().Msg("bridge: restarted; releasing every engine lease, pin and write")
		// NB: the engine may still be copying for jobs this incarnation never
		// heard of: their slots stay unusable until no copy can be running.
		ctx.Send(b.cfg.CPU, &cpumsg.ReleaseOrigin{Origin: messages.OriginEngine,
			Quarantine: max(b.cfg.LoadTimeout, b.cfg.StoreTimeout)})
	}
}

// failInFlight answers every engine call waiting on the CPU tier and stops
// the job timers: the incarnation that owned them is going away.
func (b *Bridge) failInFlight() {
	for _, p := range b.pending {
		if p.fail != nil {
			p.fail(ErrRestarted)
		}
	}
	for _, j := range b.reg.jobs {
		if j.timer != nil {
			j.timer.Stop()
		}
	}
	for _, w := range b.waiters {
		w.fail(ErrRestarted)
	}
	b.failHeld(ErrRestarted)
}

// askCPU sends a CPU-tier request built with a fresh correlation id and
// continues with onReply when its answer, of type R, comes back. An answer
// of any other type is a bug in the tier's protocol, not the caller's: the
// call fails with ErrInternal rather than panicking the bridge.
func askCPU[R any](b *Bridge, ctx actor.Context, build func(corr uint64) any, onReply func(R), fail func(error)) {
	b.corr++
	b.pending[b.corr] = pendingCall{fail: fail, onReply: func(r any) {
		reply, ok := r.(R)
		if !ok {
			b.cfg.Log.Error().Str("got", fmt.Sprintf("%T", r)).Msg("bridge: cpu tier answered with the wrong type")
			fail(fmt.Errorf("%w: the cpu tier answered %T", messages.ErrInternal, r))
			return
		}
		onReply(reply)
	}}
	ctx.Request(b.cfg.CPU, build(b.corr))
}

func (b *Bridge) resume(corr uint64, reply any) {
	p, ok := b.pending[corr]
	if !ok {
		return
	}
	delete(b.pending, corr)
	p.onReply(reply)
}

func (b *Bridge) resumeAck(m *messages.Ack) {
	if m.Corr == 0 {
		if m.Err != nil {
			b.cfg.Log.Error().Err(m.Err).Msg("bridge: cpu tier refused a release")
		}
		return
	}
	b.resume(m.Corr, m)
}

func (b *Bridge) closedErr() error {
	if b.closed {
		return messages.ErrClosed
	}
	return nil
}

func validKeys(keys []messages.Key) error {
	for _, k := range keys {
		if err := k.Validate(); err != nil {
			return err
		}
	}
	return nil
}

func (b *Bridge) workers(req *messages.ReqContext) int {
	if req.Workers > 0 {
		return req.Workers
	}
	return b.cfg.Workers
}

func (b *Bridge) lookup(ctx actor.Context, m *messages.Lookup) {
	if err := b.closedErr(); err != nil {
		m.Reply.Answer(nil, err)
		return
	}
	if err := validKeys(m.Keys); err != nil {
		m.Reply.Answer(nil, err)
		return
	}
	if b.paused { // a paused node takes no engine intake: everything is a miss
		m.Reply.Answer(make([]messages.LookupStatus, len(m.Keys)), nil)
		return
	}
	askCPU(b, ctx, func(corr uint64) any {
		return &cpumsg.LookupAndLease{Corr: corr, Holder: m.Req.Holder(), Keys: m.Keys, Prefix: m.Prefix, TTL: b.cfg.LeaseTTL, WantSlots: m.WantSlots}
	}, func(r *cpumsg.LookupResult) {
		if m.WantSlots {
			m.Slots = r.Slots
		}
		b.answerLookup(ctx, m, r.Status)
	}, func(err error) { m.Reply.Answer(nil, err) })
}

// admit checks an engine call that starts a job (the node open and not
// paused, every key well formed) and issues the job's id.
func (b *Bridge) admit(keys []messages.Key) (messages.JobID, error) {
	if err := b.intakeErr(); err != nil {
		return 0, err
	}
	if err := validKeys(keys); err != nil {
		return 0, err
	}
	return messages.JobID(b.cfg.JobSeq.Add(1)), nil
}

func (b *Bridge) intakeErr() error {
	if b.closed {
		return messages.ErrClosed
	}
	if b.paused {
		return messages.ErrPaused
	}
	return nil
}

func (b *Bridge) newJob(id messages.JobID, kind messages.JobKind, req *messages.ReqContext, keys []messages.Key, slots []int) *job {
	j := &job{id: id, kind: kind, req: req, keys: keys,
		slots: make(map[messages.Key]int, len(keys)), open: make(map[messages.Key]struct{}, len(keys)),
		reported: make([]bool, b.workers(req)), allOK: true}
	for i, k := range keys {
		j.slots[k] = slots[i]
		j.open[k] = struct{}{}
	}
	return j
}

func (b *Bridge) arm(ctx actor.Context, j *job) {
	timeout := b.cfg.LoadTimeout
	if j.kind == messages.JobStore {
		timeout = b.cfg.StoreTimeout
	}
	self, root, id := ctx.Self(), ctx.ActorSystem().Root, j.id
	j.timer = b.cfg.Clock.AfterFunc(timeout, func() { root.Send(self, &jobDeadline{id: id}) })
	b.reg.add(j)
}

func (b *Bridge) prepareLoad(ctx actor.Context, m *messages.PrepareLoad) {
	fail := func(err error) { m.Reply.Answer(messages.LoadJob{}, err) }
	id, err := b.admit(m.Keys)
	if err != nil {
		fail(err)
		return
	}
	ref := messages.JobRef{Origin: messages.OriginEngine, ID: id}
	// NB: the job is registered before the CPU tier answers: an engine that
	// does not wait for this answer sends its complete_load right behind,
	// and it must find the job (its unpin reaches the CPU tier after the
	// pin: that mailbox is FIFO from us). Its slots are known at the answer.
	j := b.newJob(id, messages.JobLoad, m.Req, m.Keys, make([]int, len(m.Keys)))
	b.arm(ctx, j)
	refused := func(err error) {
		if b.reg.jobs[id] == j {
			b.reg.remove(j)
		}
		fail(err)
	}
	askCPU(b, ctx, func(corr uint64) any {
		return &cpumsg.LeaseToPin{Corr: corr, Holder: m.Req.Holder(), Job: ref, Keys: m.Keys, KeepRank: true}
	}, func(res *cpumsg.PinResult) {
		if res.Err != nil {
			refused(res.Err)
			return
		}
		for i, k := range m.Keys {
			j.slots[k] = res.Slots[i]
		}
		m.Reply.Answer(messages.LoadJob{ID: id, Slots: res.Slots, Workers: len(j.reported)}, nil)
	}, refused)
}

func (b *Bridge) touch(ctx actor.Context, m *messages.Touch) {
	if err := validKeys(m.Keys); err != nil {
		m.Reply.Answer(struct{}{}, err)
		return
	}
	ctx.Send(b.cfg.CPU, &cpumsg.TouchKeys{Keys: m.Keys})
	m.Reply.Answer(struct{}{}, nil)
}

func (b *Bridge) completeLoad(ctx actor.Context, m *messages.CompleteLoad) {
	byJob, missing, ok := b.reg.claim(m.Req.RequestID, messages.JobLoad, m.Keys)
	if !ok {
		m.Reply.Answer(struct{}{}, fmt.Errorf("%w: %v", messages.ErrNotLoading, missing))
		return
	}
	for j, keys := range byJob {
		// NB: the CPU tier's mailbox is FIFO from us, so any later call we
		// forward sees these pins released; no need to await the ack.
		ctx.Request(b.cfg.CPU, &cpumsg.UnpinKeys{Job: j.ref(), Keys: keys})
		b.closeIfEmpty(ctx, j)
	}
	m.Reply.Answer(struct{}{}, nil)
}

func (b *Bridge) prepareStore(ctx actor.Context, m *messages.PrepareStore) {
	fail := func(err error) { m.Reply.Answer(messages.StorePlan{}, err) }
	id, err := b.admit(m.Keys)
	if err != nil {
		fail(err)
		return
	}
	ref := messages.JobRef{Origin: messages.OriginEngine, ID: id}
	askCPU(b, ctx, func(corr uint64) any {
		return &cpumsg.ReserveSlots{Corr: corr, Job: ref, Keys: m.Keys}
	}, func(res *cpumsg.ReserveResult) {
		if res.Err != nil {
			fail(res.Err)
			return
		}
		plan := messages.StorePlan{ToStore: res.ToStore, Slots: res.Slots, Evicted: res.Evicted}
		if len(res.ToStore) > 0 {
			j := b.openStore(ctx, id, m.Req, m.Keys, res.ToStore, res.Slots)
			plan.Job, plan.Workers = id, len(j.reported)
		}
		m.Reply.Answer(plan, nil)
	}, fail)
}

// openStore registers store job id writing keys (of the call's callKeys)
// into slots, placed in the call's chain order for its stored event.
func (b *Bridge) openStore(ctx actor.Context, id messages.JobID, req *messages.ReqContext, callKeys, keys []messages.Key, slots []int) *job {
	j := b.newJob(id, messages.JobStore, req, keys, slots)
	j.place = make(placeMap, len(keys))
	for i, p := range messages.Place(callKeys, keys, req.ParentBlockHash) {
		j.place[keys[i]] = p
	}
	b.arm(ctx, j)
	return j
}

func (b *Bridge) completeStore(ctx actor.Context, m *messages.CompleteStore) {
	if len(m.Keys) == 0 {
		m.Reply.Answer(struct{}{}, nil)
		return
	}
	byJob, missing, ok := b.reg.claim(m.Req.RequestID, messages.JobStore, m.Keys)
	if !ok {
		m.Reply.Answer(struct{}{}, fmt.Errorf("%w: %v", messages.ErrNotPending, missing))
		return
	}
	remaining := len(byJob)
	var firstErr error
	for j, keys := range byJob {
		b.commit(ctx, j, keys, m.OK, func(err error) {
			if err != nil && firstErr == nil {
				firstErr = err
			}
			if remaining--; remaining == 0 {
				m.Reply.Answer(struct{}{}, firstErr)
			}
		})
		b.closeIfEmpty(ctx, j)
	}
}

// commit ends the job's writes of keys. A successful write is checksummed
// off the mailbox first; then takes the CPU tier's answer.
// Committed keys go in chain order with their placements, so a stored
// event names parents before children.
func (b *Bridge) commit(ctx actor.Context, j *job, keys []messages.Key, ok bool, then func(error)) {
	b.commits++
	if !ok {
		b.sendCommit(ctx, j.ref(), j.req, keys, nil, false, nil, then)
		return
	}
	keys, place := j.placed(keys)
	b.order.issued(keys)
	b.commitIssued++
	seq := b.commitIssued
	slots := make([]int, len(keys))
	for i, k := range keys {
		slots[i] = j.slots[k]
	}
	self, root, ref, req, slot := ctx.Self(), ctx.ActorSystem().Root, j.ref(), j.req, b.cfg.Slot
	b.cfg.Offload.Go(func() {
		// NB: 2 MiB at memory speed is ~200 µs of one core at a step
		// boundary; the budget lets a peer's lookup queued behind it run.
		var budget cede.Budget
		sums := make([]uint32, len(slots))
		for i, s := range slots {
			blk := slot(s)
			sums[i] = crc32.Checksum(blk, castagnoli)
			budget.Spent(len(blk))
		}
		root.Send(self, &checksummed{by: b, job: ref, req: req, keys: keys, pos: place, sums: sums, then: then, seq: seq})
	})
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (b *Bridge) commitChecksummed(ctx actor.Context, m *checksummed) {
	if m.by != b {
		// A previous incarnation's commit: this one never counted it, and
		// the job's slots are quarantined by the CPU tier (ReleaseOrigin).
		// The engine call that waited on it is answered now, not at its
		// deadline.
		b.cfg.Log.Warn().Uint64("job", uint64(m.job.ID)).Msg("bridge: commit of a previous incarnation dropped")
		if m.then != nil {
			m.then(ErrRestarted)
		}
		return
	}
	if m.seq != b.commitNext+1 {
		if b.parked == nil {
			b.parked = map[uint64]*checksummed{}
		}
		b.parked[m.seq] = m // an earlier commit is still being checksummed
		return
	}
	for m != nil {
		b.commitNext = m.seq
		b.sendCommit(ctx, m.job, m.req, m.keys, m.pos, true, m.sums, m.then)
		b.order.landed(m.keys)
		m = b.parked[b.commitNext+1]
		delete(b.parked, b.commitNext+1)
	}
	b.serveHeld(ctx)
}

// sendCommit asks the CPU tier to commit; the answer ends one in-flight
// commit (drains wait for them: a cleared tier must not see a commit land
// after it) and goes to then when someone waits for it.
func (b *Bridge) sendCommit(ctx actor.Context, ref messages.JobRef, req *messages.ReqContext, keys []messages.Key, place []messages.Placement, ok bool, sums []uint32, then func(error)) {
	landed := func(err error) {
		b.commits--
		if ok && err == nil {
			b.cascade(ctx, keys, sums, req) // before the answer: whoever it wakes sees the cascade queued
		}
		if then != nil {
			then(err)
		} else if err != nil {
			b.cfg.Log.Error().Err(err).Uint64("job", uint64(ref.ID)).Msg("bridge: commit refused")
		}
		b.drained(ctx)
	}
	askCPU(b, ctx, func(corr uint64) any {
		return &cpumsg.CommitSlots{Corr: corr, Job: ref, Keys: keys, OK: ok, Checksums: sums, Ctx: req, Place: place}
	}, func(r *messages.Ack) { landed(r.Err) }, landed)
}

// closeIfEmpty removes a job all of whose keys were claimed.
func (b *Bridge) closeIfEmpty(ctx actor.Context, j *job) {
	if len(j.open) > 0 || b.reg.jobs[j.id] != j {
		return
	}
	b.reg.remove(j)
	b.cfg.Counters.JobsCompleted++
	b.drained(ctx)
}

func (b *Bridge) jobDone(ctx actor.Context, m *messages.JobDone) {
	j, ok := b.reg.jobs[m.Job]
	if !ok {
		b.cfg.Counters.LateReports++
		m.Reply.Answer(struct{}{}, fmt.Errorf("%w: %d", messages.ErrUnknownJob, m.Job))
		return
	}
	if m.Worker < 0 || m.Worker >= len(j.reported) {
		m.Reply.Answer(struct{}{}, fmt.Errorf("%w: worker %d of %d for job %d", messages.ErrBadWorker, m.Worker, len(j.reported), m.Job))
		return
	}
	if j.reported[m.Worker] {
		b.cfg.Counters.LateReports++
		m.Reply.Answer(struct{}{}, fmt.Errorf("%w: worker %d already reported job %d", messages.ErrBadWorker, m.Worker, m.Job))
		return
	}
	j.reported[m.Worker], j.allOK = true, j.allOK && m.OK
	j.nReports++
	if j.nReports < len(j.reported) {
		m.Reply.Answer(struct{}{}, nil)
		return
	}
	// The last report is answered once the job's blocks are readable (or
	// freed): an engine that stores then looks up sees a HIT, not a race
	// with the checksum goroutine.
	b.cfg.Counters.JobsCompleted++
	b.finish(ctx, j, j.allOK, func(err error) { m.Reply.Answer(struct{}{}, err) })
}

// finish releases what the job still holds: a load unpins, a store commits
// (readable only if ok) — and removes it from the registry.
// then, if set, gets the outcome once the CPU tier has applied it.
func (b *Bridge) finish(ctx actor.Context, j *job, ok bool, then func(error)) {
	b.reg.remove(j)
	keys := j.openKeys()
	j.open = nil
	switch {
	case j.kind == messages.JobLoad:
		// NB: the CPU tier's mailbox is FIFO from us: any later call sees the
		// pins released, so the answer need not wait for the ack.
		ctx.Request(b.cfg.CPU, &cpumsg.ReleaseJob{Job: j.ref()})
		if then != nil {
			then(nil)
		}
	case len(keys) > 0:
		b.commit(ctx, j, keys, ok, then)
	case then != nil:
		then(nil)
	}
	b.drained(ctx)
}

func (b *Bridge) deadline(ctx actor.Context, m *jobDeadline) {
	j, ok := b.reg.jobs[m.id]
	if !ok {
		return // completed before its deadline; the timer lost the race to Stop
	}
	b.reap(ctx, j, "deadline")
}

func (b *Bridge) reap(ctx actor.Context, j *job, why string) {
	b.countReaped(j)
	b.cfg.Log.Warn().Uint64("job", uint64(j.id)).Stringer("kind", j.kind).Str("request", j.req.RequestID).
		Int("open_keys", len(j.open)).Int("reports", j.nReports).Int("workers", len(j.reported)).
		Str("why", why).Msg("bridge: stalled job reaped")
	b.finish(ctx, j, false, nil)
}

func (b *Bridge) countReaped(j *job) {
	if j.kind == messages.JobLoad {
		b.cfg.Counters.ReapedLoad++
	} else {
		b.cfg.Counters.ReapedStore++
	}
}

func (b *Bridge) takeEvents(ctx actor.Context, m *messages.TakeEvents) {
	askCPU(b, ctx, func(corr uint64) any { return &cpumsg.TakeTierEvents{Corr: corr} },
		func(r *cpumsg.TierEvents) {
			events := r.Events
			if len(*b.carry) > 0 {
				events = append(*b.carry, events...)
				*b.carry = nil
			}
			m.Reply.Answer(events, nil)
		},
		func(err error) { m.Reply.Answer(nil, err) })
}

// onDrained runs done once no job with id ≤ the current highest remains.
// With a reset generation, a reapAt for that generation reaps the
// stragglers.
func (b *Bridge) onDrained(ctx actor.Context, gen uint64, reply messages.Reply[struct{}], done func()) {
	fail := func(err error) { reply.Answer(struct{}{}, err) }
	b.waiters = append(b.waiters, drainWaiter{upTo: messages.JobID(b.cfg.JobSeq.Load()), gen: gen, done: done, fail: fail})
	b.drained(ctx)
}

func (b *Bridge) drained(actor.Context) {
	if len(b.waiters) == 0 || b.commits > 0 {
		return
	}
	oldest := b.oldestJob()
	kept := b.waiters[:0]
	var ready []func()
	for _, w := range b.waiters {
		if oldest == 0 || oldest > w.upTo {
			ready = append(ready, w.done)
		} else {
			kept = append(kept, w)
		}
	}
	b.waiters = kept
	for _, done := range ready {
		done()
	}
}

// oldestJob is the smallest in-flight job id (0 when none). O(jobs), only
// while someone waits for a drain.
func (b *Bridge) oldestJob() messages.JobID {
	var oldest messages.JobID
	for id := range b.reg.jobs {
		if oldest == 0 || id < oldest {
			oldest = id
		}
	}
	return oldest
}

func (b *Bridge) reapUpTo(ctx actor.Context, gen uint64) {
	var upTo messages.JobID
	for _, w := range b.waiters {
		if w.gen == gen && w.upTo > upTo {
			upTo = w.upTo
		}
	}
	for id, j := range b.reg.jobs {
		if id <= upTo {
			b.reap(ctx, j, "drain deadline")
		}
	}
}

func (b *Bridge) drainBy(ctx actor.Context, deadline time.Time, reply messages.Reply[struct{}], done func()) {
	b.resetGen++
	gen := b.resetGen
	self, root := ctx.Self(), ctx.ActorSystem().Root
	timer := b.cfg.Clock.AfterFunc(deadline.Sub(b.cfg.Clock.Now()), func() { root.Send(self, &reapAt{gen: gen}) })
	b.onDrained(ctx, gen, reply, func() {
		timer.Stop()
		done()
	})
}

func (b *Bridge) clearTier(ctx actor.Context, reply messages.Reply[struct{}]) {
	askCPU(b, ctx, func(corr uint64) any { return &cpumsg.ClearTier{Corr: corr} },
		func(r *messages.Ack) { reply.Answer(struct{}{}, r.Err) },
		func(err error) { reply.Answer(struct{}{}, err) })
}

func (b *Bridge) pause(ctx actor.Context, m *messages.Pause) {
	b.paused = true
	b.onDrained(ctx, 0, m.Reply, func() {
		if m.ClearCache {
			b.clearTier(ctx, m.Reply)
			return
		}
		m.Reply.Answer(struct{}{}, nil)
	})
}

func (b *Bridge) resetCache(ctx actor.Context, m *messages.ResetCache) {
	b.drainBy(ctx, m.Deadline, m.Reply, func() { b.clearTier(ctx, m.Reply) })
}

func (b *Bridge) shutdown(ctx actor.Context, m *messages.Shutdown) {
	b.closed, b.paused = true, true
	b.drainBy(ctx, m.Deadline, m.Reply, func() { m.Reply.Answer(struct{}{}, nil) })
}

// stats answers with the bridge's figures as of the call, merged with the
// CPU tier's as of its answer. NB: the CPU tier answers after every release
// the bridge sent before the call, so a job the bridge no longer counts
// shows no pins it gave back; only a finished store whose commit is still
// being checksummed can show write-pending slots for a moment.
func (b *Bridge) stats(ctx actor.Context, m *messages.GetStats) {
	c := *b.cfg.Counters
	jobs, requests, paused := len(b.reg.jobs), len(b.reg.byReq), b.paused
	askCPU(b, ctx, func(corr uint64) any { return &cpumsg.TierStats{Corr: corr} }, func(r *cpumsg.TierStatsResult) {
		s := r.Stats
		s.JobsInFlight, s.Requests, s.Paused = jobs, requests, paused
		s.JobsCompleted, s.JobsReapedLoad, s.JobsReapedStore, s.LateReports =
			c.JobsCompleted, c.ReapedLoad, c.ReapedStore, c.LateReports
		if b.cfg.Restarts != nil {
			s.ActorRestarts = b.cfg.Restarts.Load()
		}
		m.Reply.Answer(s, nil)
	}, func(err error) { m.Reply.Answer(messages.Stats{}, err) })
}

// releaseSession ends what a lost engine connection held (standalone mode,
// sent by the engine endpoint once the session's in-flight calls are over):
// the leases of its unfinished requests, and every in-flight job of any of
// its requests, reaped as a deadline would (a store is never readable, a
// load unpins). Every CPU-tier release is sent before the answer, so a call
// made after the answer sees them applied (the CPU mailbox is FIFO from us).
// Cost: O(requests with jobs at the bridge), once per lost connection.
func (b *Bridge) releaseSession(ctx actor.Context, m *messages.ReleaseSession) {
	if m.Prefix == "" {
		m.Reply.Answer(messages.SessionReleased{}, fmt.Errorf("%w: release of a session without a prefix", messages.ErrInternal))
		return
	}
	for _, id := range m.Open {
		ctx.Send(b.cfg.CPU, &cpumsg.ReleaseHolder{Holder: messages.Holder{Origin: messages.OriginEngine, ID: id}})
	}
	if m.Session != 0 {
		ctx.Send(b.cfg.CPU, &cpumsg.ReleaseCredit{Owner: creditOwner(m.Session), Quarantine: m.Quarantine})
	}
	var doomed []*job
	for id, jobs := range b.reg.byReq {
		if strings.HasPrefix(id, m.Prefix) {
			for _, j := range jobs {
				doomed = append(doomed, j)
			}
		}
	}
	// NB: not reaped (which frees at once): the engine's workers may still
	// be copying; the CPU tier keeps the slots out of use for the
	// quarantine. Their late reports find no job.
	refs := make([]messages.JobRef, 0, len(doomed))
	for _, j := range doomed {
		b.countReaped(j)
		b.reg.remove(j)
		j.open = nil
		refs = append(refs, j.ref())
	}
	if len(refs) > 0 {
		b.cfg.Log.Warn().Int("jobs", len(refs)).Str("session", m.Prefix).Dur("quarantine", m.Quarantine).
			Msg("bridge: jobs of an ended engine session orphaned; their slots are freed after the quarantine")
		ctx.Send(b.cfg.CPU, &cpumsg.OrphanJobs{Jobs: refs, Quarantine: m.Quarantine})
	}
	b.drained(ctx)
	m.Reply.Answer(messages.SessionReleased{Requests: len(m.Open), Jobs: len(doomed)}, nil)
}

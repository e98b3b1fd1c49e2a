package scheduler

import (
	"fmt"
	"hash/crc32"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/internal/cede"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
	"github.com/kvtier/kvtier/tiers/tiering/tieringmsg"
)

// Bridge is the core of the engine-facing actor: it serves the manager
// API, owns the request and job registry, arms one deadline timer per job
// and reaps jobs whose deadline passes. It is driven one message at a time
// through Handle, which writes what it decided outside itself (requests to
// the CPU tier and the tiering actor, deadlines, checksums off the mailbox)
// into an fx.Out; the actor is a shell that carries the Out out
// (bridge_actor.go), and bridge_model_test.go drives the core through a
// seeded world instead, reading its Outs.
//
// Invariants:
//   - state is touched only inside Handle; CPU-tier answers come back as
//     messages matched by correlation id, never awaited. What a call waits
//     for is a typed record (pendingCall), not a closure.
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
	// opening holds the store jobs whose id was issued but whose slots the
	// CPU tier has yet to grant (PrepareStore, StoreCredited): a drain
	// waits for them as for registered jobs, and one whose drain deadline
	// passed meanwhile is reaped as it opens (reapedUpTo).
	opening    map[messages.JobID]struct{}
	reapedUpTo messages.JobID
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
	CPU          fx.Ref            // the CPU tier
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
	Tiering      fx.Ref            // the tiering actor; the zero Ref without secondary tiers (bridge_tiering.go)
	Log          zerolog.Logger    // structured logs
}

// Counters are the bridge's monotonic counters. Only the bridge actor
// writes them, inside Receive.
type Counters struct {
	JobsCompleted, ReapedLoad, ReapedStore, LateReports uint64
}

// waitKind is what a pending call waits for, and so how its answer is
// carried on.
type waitKind uint8

const (
	waitLease   waitKind = iota + 1 // a Lookup's LookupAndLease
	waitTiering                     // a Lookup's AsyncLookup of its MISS keys
	waitPin                         // a PrepareLoad's LeaseToPin
	waitReserve                     // a PrepareStore's ReserveSlots
	waitCommit                      // a commit's CommitSlots
	waitEvents                      // a TakeEvents' drain of the CPU tier's events
	waitClear                       // a ClearTier, for a Pause that clears or a ResetCache
	waitStats                       // a GetStats' CPU-tier figures
	waitGrant                       // a Grant's credit
	waitBind                        // a StoreCredited's binding
)

// pendingCall is a call waiting for a CPU-tier or tiering answer: what it
// waits for, and what carrying it on needs. Only the fields of its kind
// are set.
type pendingCall struct {
	kind    waitKind
	lookup  *messages.Lookup         // waitLease, waitTiering
	tiering *tieringAsk              // waitTiering
	load    *messages.PrepareLoad    // waitPin
	job     *job                     // waitPin: the load job, registered ahead of the answer
	id      messages.JobID           // waitReserve, waitBind: the store job's id
	store   *messages.PrepareStore   // waitReserve
	commit  *commitCall              // waitCommit
	events  *messages.TakeEvents     // waitEvents
	reply   messages.Reply[struct{}] // waitClear
	stats   *statsCall               // waitStats
	grant   *messages.Grant          // waitGrant
	bind    *messages.StoreCredited  // waitBind
}

// tieringAsk is a Lookup's statuses while the tiering actor is asked about
// its MISS keys, at positions idx.
type tieringAsk struct {
	st  []messages.LookupStatus
	idx []int
}

// commitCall is a CommitSlots in flight and who waits for it to land.
type commitCall struct {
	ref   messages.JobRef
	req   *messages.ReqContext
	keys  []messages.Key
	slots []int // per key: its slot, as the CPU tier gave it to the job
	ok    bool
	sums  []uint32
	then  commitWaiter
}

// commitWaiter is who waits for a commit to land: a CompleteStore (for
// every job whose keys it ended), a JobDone's last report, or no one (a
// reaped job: a refusal is logged).
type commitWaiter struct {
	store *storeCompletion
	done  *messages.JobDone
}

// storeCompletion is a CompleteStore waiting for its jobs' commits.
type storeCompletion struct {
	m         *messages.CompleteStore
	remaining int
	firstErr  error
}

// landed answers whoever waited, once the CPU tier applied the commit (err:
// its refusal). It reports whether anyone did.
func (w commitWaiter) landed(o *fx.Out, err error) bool {
	switch {
	case w.store != nil:
		if err != nil && w.store.firstErr == nil {
			w.store.firstErr = err
		}
		if w.store.remaining--; w.store.remaining == 0 {
			reply(o, w.store.m.Reply, struct{}{}, w.store.firstErr)
		}
	case w.done != nil:
		reply(o, w.done.Reply, struct{}{}, err)
	default:
		return false
	}
	return true
}

// statsCall is a GetStats with the bridge's figures as of the call.
type statsCall struct {
	m              *messages.GetStats
	counters       Counters
	jobs, requests int
	paused         bool
}

// drainWaiter is a Pause, ResetCache or Shutdown waiting for the jobs
// issued before it to end.
type drainWaiter struct {
	upTo  messages.JobID // wait for jobs with id ≤ upTo
	gen   uint64         // reset generation that may reap them (0 = none)
	reply messages.Reply[struct{}]
	clear bool              // once drained, clear the CPU tier, then answer
	timer supervision.Timer // the reset's deadline (nil: none)
}

// Messages the bridge sends itself.
type (
	jobDeadline struct{ id messages.JobID }
	reapAt      struct{ gen uint64 }
	checksummed struct {
		by   *Bridge              // the incarnation that counted the commit in flight
		call *commitCall          // the commit, its sums filled off the mailbox
		pos  []messages.Placement // per key: its place in the job's call
		seq  uint64               // the commit's place in begin order
	}
)

// ErrRestarted answers calls in flight when the bridge restarted.
var ErrRestarted = fmt.Errorf("%w: bridge restarted", messages.ErrClosed)

// newBridge is the core of the bridge's incarnation-th incarnation; carry
// is shared by all of them.
func newBridge(cfg Config, incarnation uint64, carry *[]messages.Event) *Bridge {
	return &Bridge{cfg: cfg, reg: newRegistry(), pending: map[uint64]pendingCall{}, opening: map[messages.JobID]struct{}{},
		restart: incarnation > 1, corr: (incarnation - 1) << 40, carry: carry}
}

// Handle handles one message.
func (b *Bridge) Handle(o *fx.Out, msg any) {
	switch m := msg.(type) {
	case *messages.Lookup, *messages.PrepareLoad, *messages.Touch, *messages.CompleteLoad,
		*messages.PrepareStore, *messages.CompleteStore, *messages.JobDone, *messages.RequestFinished,
		*messages.TakeEvents, *messages.HasPendingWork, *messages.Pause, *messages.Resume,
		*messages.ResetCache, *messages.ReleaseSession, *messages.Grant, *messages.StoreCredited:
		if b.order.admit(m) {
			b.serve(o, m)
		}
	case *messages.GetStats:
		b.stats(o, m)
	case *messages.Shutdown:
		b.shutdown(o, m)
	case *cpumsg.CreditGranted:
		b.resume(o, m.Corr, m)
	case *cpumsg.CreditBound:
		b.resume(o, m.Corr, m)
	case *jobDeadline:
		b.deadline(o, m)
	case *reapAt:
		b.reapUpTo(o, m.gen)
	case *checksummed:
		b.commitChecksummed(o, m)
	case *cpumsg.LookupResult:
		b.resume(o, m.Corr, m)
	case *cpumsg.PinResult:
		b.resume(o, m.Corr, m)
	case *cpumsg.ReserveResult:
		b.resume(o, m.Corr, m)
	case *messages.Ack:
		b.resumeAck(o, m)
	case *cpumsg.TierEvents:
		if _, asked := b.pending[m.Corr]; !asked {
			// Drained for a TakeEvents the last restart failed: kept for the
			// next one, never lost.
			*b.carry = append(*b.carry, m.Events...)
			return
		}
		b.resume(o, m.Corr, m)
	case *cpumsg.TierStatsResult:
		b.resume(o, m.Corr, m)
	case *tieringmsg.AsyncLookupResult:
		b.resume(o, m.Corr, m)
	default:
		b.cfg.Log.Warn().Str("type", fmt.Sprintf("%T", m)).Msg("bridge: unknown message dropped")
	}
}

// serve handles an engine call admitted in its order (order.go).
func (b *Bridge) serve(o *fx.Out, m any) {
	switch m := m.(type) {
	case *messages.Lookup:
		b.lookup(o, m)
	case *messages.PrepareLoad:
		b.prepareLoad(o, m)
	case *messages.Touch:
		b.touch(o, m)
	case *messages.CompleteLoad:
		b.completeLoad(o, m)
	case *messages.PrepareStore:
		b.prepareStore(o, m)
	case *messages.CompleteStore:
		b.completeStore(o, m)
	case *messages.JobDone:
		b.jobDone(o, m)
	case *messages.RequestFinished:
		o.Send(b.cfg.CPU, &cpumsg.ReleaseHolder{Holder: m.Req.Holder()})
		reply(o, m.Reply, struct{}{}, nil)
	case *messages.TakeEvents:
		b.takeEvents(o, m)
	case *messages.HasPendingWork:
		// Only engine jobs need an engine step; peers, promotions, cascades
		// and commits progress on their own (the contract: manager.go).
		reply(o, m.Reply, len(b.reg.jobs) > 0, nil)
	case *messages.Pause:
		b.pause(o, m)
	case *messages.Resume:
		b.paused = b.closed
		reply(o, m.Reply, struct{}{}, b.closedErr())
	case *messages.ResetCache:
		b.resetCache(o, m)
	case *messages.ReleaseSession:
		b.releaseSession(o, m)
	case *messages.Grant:
		b.grant(o, m)
	case *messages.StoreCredited:
		b.storeCredited(o, m)
	}
}

// serveHeld re-admits the held calls in arrival order, once a commit was
// sent to the CPU tier.
func (b *Bridge) serveHeld(o *fx.Out) {
	if b.order.waiting() == 0 {
		return
	}
	for _, m := range b.order.release() {
		if b.order.admit(m) {
			b.serve(o, m)
		}
	}
}

// failHeld answers every held call with err: the incarnation that held
// them is going away.
func (b *Bridge) failHeld(o *fx.Out, err error) {
	for _, m := range b.order.release() {
		failCall(o, m, err)
	}
}

func (b *Bridge) started(o *fx.Out) {
	if b.restart {
		b.cfg.Log.Warn().Msg("bridge: restarted; releasing every engine lease, pin and write")
		// NB: the engine may still be copying for jobs this incarnation never
		// heard of: their slots stay unusable until no copy can be running.
		o.Send(b.cfg.CPU, &cpumsg.ReleaseOrigin{Origin: messages.OriginEngine,
			Quarantine: max(b.cfg.LoadTimeout, b.cfg.StoreTimeout)})
	}
}

// failInFlight answers every call waiting on the CPU tier, every drain
// and every held call with ErrRestarted, and stops the job timers: the
// incarnation that owned them is going away (its answers would come to
// the next one, which knows none of them).
func (b *Bridge) failInFlight(o *fx.Out) {
	for _, p := range b.pending {
		b.fail(o, p, ErrRestarted)
	}
	b.pending = map[uint64]pendingCall{}
	for _, j := range b.reg.jobs {
		if j.timer != nil {
			j.timer.Stop()
		}
	}
	for _, w := range b.waiters {
		reply(o, w.reply, struct{}{}, ErrRestarted)
	}
	b.waiters = nil
	// NB: parked commits were checksummed for this incarnation and wait for
	// an earlier one: nothing else would ever answer their callers.
	for _, m := range b.parked {
		m.call.then.landed(o, ErrRestarted)
	}
	b.parked = nil
	b.failHeld(o, ErrRestarted)
}

// reply answers a call the core held, through o: in order with the
// messages decided before it, so a caller that waits on the answer finds
// them sent (an idle probe answered before the commits it waited for were
// sent saw blocks still pending).
func reply[T any](o *fx.Out, r messages.Reply[T], v T, err error) { o.Answer(r, v, err) }

// ask sends a request built with a fresh correlation id to to and parks p
// until its answer comes back (resume).
func (b *Bridge) ask(o *fx.Out, to fx.Ref, p pendingCall, build func(corr uint64) any) {
	b.corr++
	b.pending[b.corr] = p
	o.Request(to, build(b.corr))
}

// resume carries on the call waiting for corr with its answer. An answer
// of a type its call does not wait for is a bug in the other side's
// protocol: the call fails with ErrInternal rather than panicking the
// bridge.
func (b *Bridge) resume(o *fx.Out, corr uint64, ans any) {
	p, ok := b.pending[corr]
	if !ok {
		return
	}
	delete(b.pending, corr)
	switch r := ans.(type) {
	case *cpumsg.LookupResult:
		if p.kind == waitLease {
			b.onLease(o, p.lookup, r)
			return
		}
	case *tieringmsg.AsyncLookupResult:
		if p.kind == waitTiering {
			b.onTiering(o, p.lookup, p.tiering, r)
			return
		}
	case *cpumsg.PinResult:
		if p.kind == waitPin {
			b.onPin(o, p, r)
			return
		}
	case *cpumsg.ReserveResult:
		if p.kind == waitReserve {
			b.onReserve(o, p, r)
			return
		}
	case *messages.Ack:
		switch p.kind {
		case waitCommit:
			b.commitLanded(o, p.commit, r.Err)
			return
		case waitClear:
			reply(o, p.reply, struct{}{}, r.Err)
			return
		}
	case *cpumsg.TierEvents:
		if p.kind == waitEvents {
			b.onEvents(o, p.events, r)
			return
		}
	case *cpumsg.TierStatsResult:
		if p.kind == waitStats {
			b.onStats(o, p.stats, r)
			return
		}
	case *cpumsg.CreditGranted:
		if p.kind == waitGrant {
			reply(o, p.grant.Reply, messages.CreditGrant{Slots: r.Slots, Evicted: r.Evicted}, nil)
			return
		}
	case *cpumsg.CreditBound:
		if p.kind == waitBind {
			b.onBound(o, p, r)
			return
		}
	}
	b.cfg.Log.Error().Str("got", fmt.Sprintf("%T", ans)).Msg("bridge: answered with the wrong type")
	b.fail(o, p, fmt.Errorf("%w: answered %T", messages.ErrInternal, ans))
	if p.kind == waitCommit {
		b.drained(o)
	}
}

// fail answers the call p carries on with err.
func (b *Bridge) fail(o *fx.Out, p pendingCall, err error) {
	switch p.kind {
	case waitLease, waitTiering:
		reply(o, p.lookup.Reply, nil, err)
	case waitPin:
		b.refuseLoad(o, p, err)
	case waitReserve:
		delete(b.opening, p.id)
		reply(o, p.store.Reply, messages.StorePlan{}, err)
	case waitCommit:
		b.commits--
		b.commitAnswered(o, p.commit, err)
	case waitEvents:
		reply(o, p.events.Reply, nil, err)
	case waitClear:
		reply(o, p.reply, struct{}{}, err)
	case waitStats:
		reply(o, p.stats.m.Reply, messages.Stats{}, err)
	case waitGrant:
		reply(o, p.grant.Reply, messages.CreditGrant{}, err)
	case waitBind:
		delete(b.opening, p.id)
		reply(o, p.bind.Reply, messages.StoreBound{}, err)
	}
}

func (b *Bridge) resumeAck(o *fx.Out, m *messages.Ack) {
	if m.Corr == 0 {
		if m.Err != nil {
			b.cfg.Log.Error().Err(m.Err).Msg("bridge: cpu tier refused a release")
		}
		return
	}
	b.resume(o, m.Corr, m)
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

func (b *Bridge) lookup(o *fx.Out, m *messages.Lookup) {
	if err := b.closedErr(); err != nil {
		reply(o, m.Reply, nil, err)
		return
	}
	if err := validKeys(m.Keys); err != nil {
		reply(o, m.Reply, nil, err)
		return
	}
	if b.paused { // a paused node takes no engine intake: everything is a miss
		reply(o, m.Reply, make([]messages.LookupStatus, len(m.Keys)), nil)
		return
	}
	b.ask(o, b.cfg.CPU, pendingCall{kind: waitLease, lookup: m}, func(corr uint64) any {
		return &cpumsg.LookupAndLease{Corr: corr, Holder: m.Req.Holder(), Keys: m.Keys, Prefix: m.Prefix, TTL: b.cfg.LeaseTTL, WantSlots: m.WantSlots}
	})
}

func (b *Bridge) onLease(o *fx.Out, m *messages.Lookup, r *cpumsg.LookupResult) {
	if m.WantSlots {
		m.Slots = r.Slots
	}
	b.answerLookup(o, m, r.Status)
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
	j := &job{id: id, kind: kind, req: req, keys: keys, slots: slots, open: make([]bool, len(keys)), nOpen: len(keys),
		reported: make([]bool, b.workers(req)), allOK: true}
	for i := range j.open {
		j.open[i] = true
	}
	j.indexKeys()
	return j
}

func (b *Bridge) arm(o *fx.Out, j *job) {
	timeout := b.cfg.LoadTimeout
	if j.kind == messages.JobStore {
		timeout = b.cfg.StoreTimeout
	}
	j.timer = o.After(timeout, &jobDeadline{id: j.id})
	b.reg.add(j)
}

func (b *Bridge) prepareLoad(o *fx.Out, m *messages.PrepareLoad) {
	id, err := b.admit(m.Keys)
	if err != nil {
		reply(o, m.Reply, messages.LoadJob{}, err)
		return
	}
	// NB: the job is registered before the CPU tier answers: an engine that
	// does not wait for this answer sends its complete_load right behind,
	// and it must find the job (its unpin reaches the CPU tier after the
	// pin: that mailbox is FIFO from us). Its slots are known at the answer.
	j := b.newJob(id, messages.JobLoad, m.Req, m.Keys, make([]int, len(m.Keys)))
	b.arm(o, j)
	b.ask(o, b.cfg.CPU, pendingCall{kind: waitPin, load: m, job: j}, func(corr uint64) any {
		return &cpumsg.LeaseToPin{Corr: corr, Holder: m.Req.Holder(), Job: j.ref(), Keys: m.Keys, KeepRank: true}
	})
}

func (b *Bridge) onPin(o *fx.Out, p pendingCall, res *cpumsg.PinResult) {
	if res.Err != nil {
		b.refuseLoad(o, p, res.Err)
		return
	}
	copy(p.job.slots, res.Slots) // NB: the job's keys are the load's
	reply(o, p.load.Reply, messages.LoadJob{ID: p.job.id, Slots: res.Slots, Workers: len(p.job.reported)}, nil)
}

// refuseLoad ends a load the CPU tier could not pin: its job goes (unless
// a completion or its deadline took it already) and the call fails.
func (b *Bridge) refuseLoad(o *fx.Out, p pendingCall, err error) {
	if b.reg.jobs[p.job.id] == p.job {
		b.reg.remove(p.job)
	}
	reply(o, p.load.Reply, messages.LoadJob{}, err)
}

func (b *Bridge) touch(o *fx.Out, m *messages.Touch) {
	if err := validKeys(m.Keys); err != nil {
		reply(o, m.Reply, struct{}{}, err)
		return
	}
	o.Send(b.cfg.CPU, &cpumsg.TouchKeys{Keys: m.Keys})
	reply(o, m.Reply, struct{}{}, nil)
}

func (b *Bridge) completeLoad(o *fx.Out, m *messages.CompleteLoad) {
	byJob, missing, ok := b.reg.claim(m.Req.RequestID, messages.JobLoad, m.Keys)
	if !ok {
		reply(o, m.Reply, struct{}{}, fmt.Errorf("%w: %v", messages.ErrNotLoading, missing))
		return
	}
	for _, c := range byJob {
		// NB: the CPU tier's mailbox is FIFO from us, so any later call we
		// forward sees these pins released; no need to await the ack.
		o.Request(b.cfg.CPU, &cpumsg.UnpinKeys{Job: c.j.ref(), Keys: c.keys()})
		b.closeIfEmpty(o, c.j)
	}
	reply(o, m.Reply, struct{}{}, nil)
}

func (b *Bridge) prepareStore(o *fx.Out, m *messages.PrepareStore) {
	err := b.askStoreSlots(o, m.Keys, pendingCall{kind: waitReserve, store: m}, func(corr uint64, job messages.JobRef) any {
		return &cpumsg.ReserveSlots{Corr: corr, Job: job, Keys: m.Keys, BlockBytes: m.Req.BlockBytes}
	})
	if err != nil {
		reply(o, m.Reply, messages.StorePlan{}, err)
	}
}

// askStoreSlots admits a store job over keys and asks the CPU tier for its
// slots (build makes the request, for the job's ref); the job is opening
// until the answer, which p (given the job's id) carries on. An error is
// the admission's: nothing was asked.
func (b *Bridge) askStoreSlots(o *fx.Out, keys []messages.Key, p pendingCall, build func(corr uint64, job messages.JobRef) any) error {
	id, err := b.admit(keys)
	if err != nil {
		return err
	}
	b.opening[id] = struct{}{}
	p.id = id
	b.ask(o, b.cfg.CPU, p, func(corr uint64) any {
		return build(corr, messages.JobRef{Origin: messages.OriginEngine, ID: id})
	})
	return nil
}

func (b *Bridge) onReserve(o *fx.Out, p pendingCall, res *cpumsg.ReserveResult) {
	m := p.store
	delete(b.opening, p.id)
	defer b.drained(o)
	if res.Err != nil {
		reply(o, m.Reply, messages.StorePlan{}, res.Err)
		return
	}
	plan := messages.StorePlan{ToStore: res.ToStore, Slots: res.Slots, Evicted: res.Evicted}
	plan.Job, plan.Workers = b.openStore(o, p.id, m.Req, m.Keys, res.ToStore, res.Slots)
	reply(o, m.Reply, plan, nil)
}

// openStore registers store job id writing keys (of the call's callKeys)
// into slots, placed in the call's chain order for its stored event, and
// returns the job's id and workers for the answer (0, 0 when there is no
// key to write: no job).
func (b *Bridge) openStore(o *fx.Out, id messages.JobID, req *messages.ReqContext, callKeys, keys []messages.Key, slots []int) (messages.JobID, int) {
	if len(keys) == 0 {
		return 0, 0
	}
	j := b.newJob(id, messages.JobStore, req, keys, slots)
	j.place = messages.Place(callKeys, keys, req.ParentBlockHash)
	b.arm(o, j)
	if id <= b.reapedUpTo {
		// NB: opened after its drain's deadline reaped the jobs issued
		// before it: reaped too (its writes are never readable; the engine's
		// completion finds no job).
		b.reap(o, j, "drain deadline")
	}
	return id, len(j.reported)
}

func (b *Bridge) completeStore(o *fx.Out, m *messages.CompleteStore) {
	if len(m.Keys) == 0 {
		reply(o, m.Reply, struct{}{}, nil)
		return
	}
	byJob, missing, ok := b.reg.claim(m.Req.RequestID, messages.JobStore, m.Keys)
	if !ok {
		reply(o, m.Reply, struct{}{}, fmt.Errorf("%w: %v", messages.ErrNotPending, missing))
		return
	}
	done := &storeCompletion{m: m, remaining: len(byJob)}
	for _, c := range byJob {
		b.commit(o, c.j, c.at, m.OK, commitWaiter{store: done})
		b.closeIfEmpty(o, c.j)
	}
}

// commit ends the job's writes of keys. A successful write is checksummed
// off the mailbox first; then takes the CPU tier's answer.
// Committed keys go in chain order with their placements, so a stored
// event names parents before children.
func (b *Bridge) commit(o *fx.Out, j *job, at []int, ok bool, then commitWaiter) {
	b.commits++
	keys, slots, place := j.placed(at)
	call := &commitCall{ref: j.ref(), req: j.req, keys: keys, slots: slots, ok: ok, then: then}
	if !ok {
		b.sendCommit(o, call, nil)
		return
	}
	b.order.issued(keys)
	b.commitIssued++
	m, slot := &checksummed{by: b, call: call, pos: place, seq: b.commitIssued}, b.cfg.Slot
	o.Offload(func() any {
		// NB: 2 MiB at memory speed is ~200 µs of one core at a step
		// boundary; the budget lets a peer's lookup queued behind it run.
		var budget cede.Budget
		sums := make([]uint32, len(slots))
		for i, s := range slots {
			blk := slot(s)
			sums[i] = crc32.Checksum(blk, castagnoli)
			budget.Spent(len(blk))
		}
		call.sums = sums
		return m
	})
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (b *Bridge) commitChecksummed(o *fx.Out, m *checksummed) {
	if m.by != b {
		// A previous incarnation's commit: this one never counted it, and
		// the job's slots are quarantined by the CPU tier (ReleaseOrigin).
		// The engine call that waited on it is answered now, not at its
		// deadline.
		b.cfg.Log.Warn().Uint64("job", uint64(m.call.ref.ID)).Msg("bridge: commit of a previous incarnation dropped")
		m.call.then.landed(o, ErrRestarted)
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
		b.sendCommit(o, m.call, m.pos)
		b.order.landed(m.call.keys)
		m = b.parked[b.commitNext+1]
		delete(b.parked, b.commitNext+1)
	}
	b.serveHeld(o)
}

// sendCommit asks the CPU tier to commit c (place: its keys' placements);
// the answer ends one in-flight commit (commitLanded).
func (b *Bridge) sendCommit(o *fx.Out, c *commitCall, place []messages.Placement) {
	b.ask(o, b.cfg.CPU, pendingCall{kind: waitCommit, commit: c}, func(corr uint64) any {
		return &cpumsg.CommitSlots{Corr: corr, Job: c.ref, Keys: c.keys, Slots: c.slots, OK: c.ok, Checksums: c.sums, Ctx: c.req, Place: place}
	})
}

// commitLanded ends one in-flight commit (drains wait for them: a cleared
// tier must not see a commit land after it): a readable one is cascaded
// before the answer, so whoever it wakes sees the cascade queued.
func (b *Bridge) commitLanded(o *fx.Out, c *commitCall, err error) {
	b.commits--
	if c.ok && err == nil {
		b.cascade(o, c.keys, c.sums, c.req)
	}
	b.commitAnswered(o, c, err)
	b.drained(o)
}

// commitAnswered tells whoever waits for c how it went; a refusal nobody
// waits for is logged.
func (b *Bridge) commitAnswered(o *fx.Out, c *commitCall, err error) {
	if !c.then.landed(o, err) && err != nil {
		b.cfg.Log.Error().Err(err).Uint64("job", uint64(c.ref.ID)).Msg("bridge: commit refused")
	}
}

// closeIfEmpty removes a job all of whose keys were claimed.
func (b *Bridge) closeIfEmpty(o *fx.Out, j *job) {
	if j.nOpen > 0 || b.reg.jobs[j.id] != j {
		return
	}
	b.reg.remove(j)
	b.cfg.Counters.JobsCompleted++
	b.drained(o)
}

func (b *Bridge) jobDone(o *fx.Out, m *messages.JobDone) {
	j, ok := b.reg.jobs[m.Job]
	if !ok {
		b.cfg.Counters.LateReports++
		reply(o, m.Reply, struct{}{}, fmt.Errorf("%w: %d", messages.ErrUnknownJob, m.Job))
		return
	}
	if m.Worker < 0 || m.Worker >= len(j.reported) {
		reply(o, m.Reply, struct{}{}, fmt.Errorf("%w: worker %d of %d for job %d", messages.ErrBadWorker, m.Worker, len(j.reported), m.Job))
		return
	}
	if j.reported[m.Worker] {
		b.cfg.Counters.LateReports++
		reply(o, m.Reply, struct{}{}, fmt.Errorf("%w: worker %d already reported job %d", messages.ErrBadWorker, m.Worker, m.Job))
		return
	}
	j.reported[m.Worker], j.allOK = true, j.allOK && m.OK
	j.nReports++
	if j.nReports < len(j.reported) {
		reply(o, m.Reply, struct{}{}, nil)
		return
	}
	// The last report is answered once the job's blocks are readable (or
	// freed): an engine that stores then looks up sees a HIT, not a race
	// with the checksum goroutine.
	b.cfg.Counters.JobsCompleted++
	b.finish(o, j, j.allOK, commitWaiter{done: m})
}

// finish releases what the job still holds: a load unpins, a store commits
// (readable only if ok) — and removes it from the registry. then, if
// anyone, gets the outcome once the CPU tier has applied it.
func (b *Bridge) finish(o *fx.Out, j *job, ok bool, then commitWaiter) {
	b.reg.remove(j)
	open := j.openPlaces()
	j.closeAll()
	switch {
	case j.kind == messages.JobLoad:
		// NB: the CPU tier's mailbox is FIFO from us: any later call sees the
		// pins released, so the answer need not wait for the ack.
		o.Request(b.cfg.CPU, &cpumsg.ReleaseJob{Job: j.ref()})
		then.landed(o, nil)
	case len(open) > 0:
		b.commit(o, j, open, ok, then)
	default:
		then.landed(o, nil)
	}
	b.drained(o)
}

func (b *Bridge) deadline(o *fx.Out, m *jobDeadline) {
	j, ok := b.reg.jobs[m.id]
	if !ok {
		return // completed before its deadline; the timer lost the race to Stop
	}
	b.reap(o, j, "deadline")
}

func (b *Bridge) reap(o *fx.Out, j *job, why string) {
	b.countReaped(j)
	b.cfg.Log.Warn().Uint64("job", uint64(j.id)).Stringer("kind", j.kind).Str("request", j.req.RequestID).
		Int("open_keys", j.nOpen).Int("reports", j.nReports).Int("workers", len(j.reported)).
		Str("why", why).Msg("bridge: stalled job reaped")
	b.finish(o, j, false, commitWaiter{})
}

func (b *Bridge) countReaped(j *job) {
	if j.kind == messages.JobLoad {
		b.cfg.Counters.ReapedLoad++
	} else {
		b.cfg.Counters.ReapedStore++
	}
}

func (b *Bridge) takeEvents(o *fx.Out, m *messages.TakeEvents) {
	b.ask(o, b.cfg.CPU, pendingCall{kind: waitEvents, events: m}, func(corr uint64) any {
		return &cpumsg.TakeTierEvents{Corr: corr}
	})
}

func (b *Bridge) onEvents(o *fx.Out, m *messages.TakeEvents, r *cpumsg.TierEvents) {
	events := r.Events
	if len(*b.carry) > 0 {
		events = append(*b.carry, events...)
		*b.carry = nil
	}
	reply(o, m.Reply, events, nil)
}

// onDrained parks w until no job with id ≤ the current highest remains
// (at once if none does). With a reset generation, a reapAt for that
// generation reaps the stragglers.
func (b *Bridge) onDrained(o *fx.Out, w drainWaiter) {
	w.upTo = messages.JobID(b.cfg.JobSeq.Load())
	b.waiters = append(b.waiters, w)
	b.drained(o)
}

// drained carries on the drain waiters whose jobs all ended, once no commit
// is in flight: a clearing one clears the CPU tier, the others are
// answered.
func (b *Bridge) drained(o *fx.Out) {
	if len(b.waiters) == 0 || b.commits > 0 {
		return
	}
	oldest := b.oldestJob()
	kept := b.waiters[:0]
	var ready []drainWaiter
	for _, w := range b.waiters {
		if oldest == 0 || oldest > w.upTo {
			ready = append(ready, w)
		} else {
			kept = append(kept, w)
		}
	}
	b.waiters = kept
	for _, w := range ready {
		if w.timer != nil {
			w.timer.Stop()
		}
		if w.clear {
			b.clearTier(o, w.reply)
			continue
		}
		reply(o, w.reply, struct{}{}, nil)
	}
}

// oldestJob is the smallest in-flight job id, opening ones included (0
// when none). O(jobs), only while someone waits for a drain.
func (b *Bridge) oldestJob() messages.JobID {
	var oldest messages.JobID
	for id := range b.reg.jobs {
		if oldest == 0 || id < oldest {
			oldest = id
		}
	}
	for id := range b.opening {
		if oldest == 0 || id < oldest {
			oldest = id
		}
	}
	return oldest
}

func (b *Bridge) reapUpTo(o *fx.Out, gen uint64) {
	var upTo messages.JobID
	for _, w := range b.waiters {
		if w.gen == gen && w.upTo > upTo {
			upTo = w.upTo
		}
	}
	b.reapedUpTo = max(b.reapedUpTo, upTo)
	for id, j := range b.reg.jobs {
		if id <= upTo {
			b.reap(o, j, "drain deadline")
		}
	}
}

// drainBy parks a drain whose stragglers are reaped at deadline.
func (b *Bridge) drainBy(o *fx.Out, deadline time.Time, reply messages.Reply[struct{}], clear bool) {
	b.resetGen++
	gen := b.resetGen
	timer := o.After(deadline.Sub(b.cfg.Clock.Now()), &reapAt{gen: gen})
	b.onDrained(o, drainWaiter{gen: gen, reply: reply, clear: clear, timer: timer})
}

func (b *Bridge) clearTier(o *fx.Out, reply messages.Reply[struct{}]) {
	b.ask(o, b.cfg.CPU, pendingCall{kind: waitClear, reply: reply}, func(corr uint64) any {
		return &cpumsg.ClearTier{Corr: corr}
	})
}

func (b *Bridge) pause(o *fx.Out, m *messages.Pause) {
	b.paused = true
	b.onDrained(o, drainWaiter{reply: m.Reply, clear: m.ClearCache})
}

func (b *Bridge) resetCache(o *fx.Out, m *messages.ResetCache) {
	b.drainBy(o, m.Deadline, m.Reply, true)
}

func (b *Bridge) shutdown(o *fx.Out, m *messages.Shutdown) {
	b.closed, b.paused = true, true
	b.drainBy(o, m.Deadline, m.Reply, false)
}

// stats answers with the bridge's figures as of the call, merged with the
// CPU tier's as of its answer. NB: the CPU tier answers after every release
// the bridge sent before the call, so a job the bridge no longer counts
// shows no pins it gave back; only a finished store whose commit is still
// being checksummed can show write-pending slots for a moment.
func (b *Bridge) stats(o *fx.Out, m *messages.GetStats) {
	c := &statsCall{m: m, counters: *b.cfg.Counters, jobs: len(b.reg.jobs), requests: len(b.reg.byReq), paused: b.paused}
	b.ask(o, b.cfg.CPU, pendingCall{kind: waitStats, stats: c}, func(corr uint64) any {
		return &cpumsg.TierStats{Corr: corr}
	})
}

func (b *Bridge) onStats(o *fx.Out, c *statsCall, r *cpumsg.TierStatsResult) {
	s := r.Stats
	s.JobsInFlight, s.Requests, s.Paused = c.jobs, c.requests, c.paused
	s.JobsCompleted, s.JobsReapedLoad, s.JobsReapedStore, s.LateReports =
		c.counters.JobsCompleted, c.counters.ReapedLoad, c.counters.ReapedStore, c.counters.LateReports
	if b.cfg.Restarts != nil {
		s.ActorRestarts = b.cfg.Restarts.Load()
	}
	reply(o, c.m.Reply, s, nil)
}

// releaseSession ends what a lost engine connection held (standalone mode,
// sent by the engine endpoint once the session's in-flight calls are over):
// the leases of its unfinished requests, and every in-flight job of any of
// its requests, reaped as a deadline would (a store is never readable, a
// load unpins). Every CPU-tier release is sent before the answer, so a call
// made after the answer sees them applied (the CPU mailbox is FIFO from us).
// Cost: O(requests with jobs at the bridge), once per lost connection.
func (b *Bridge) releaseSession(o *fx.Out, m *messages.ReleaseSession) {
	if m.Prefix == "" {
		reply(o, m.Reply, messages.SessionReleased{}, fmt.Errorf("%w: release of a session without a prefix", messages.ErrInternal))
		return
	}
	for _, id := range m.Open {
		o.Send(b.cfg.CPU, &cpumsg.ReleaseHolder{Holder: messages.Holder{Origin: messages.OriginEngine, ID: id}})
	}
	if m.Session != 0 {
		o.Send(b.cfg.CPU, &cpumsg.ReleaseCredit{Owner: creditOwner(m.Session), Quarantine: m.Quarantine})
	}
	var doomed []*job
	for id, jobs := range b.reg.byReq {
		if strings.HasPrefix(id, m.Prefix) {
			doomed = append(doomed, jobs...)
		}
	}
	// NB: not reaped (which frees at once): the engine's workers may still
	// be copying; the CPU tier keeps the slots out of use for the
	// quarantine. Their late reports find no job.
	refs := make([]messages.JobRef, 0, len(doomed))
	for _, j := range doomed {
		b.countReaped(j)
		b.reg.remove(j)
		j.closeAll()
		refs = append(refs, j.ref())
	}
	if len(refs) > 0 {
		b.cfg.Log.Warn().Int("jobs", len(refs)).Str("session", m.Prefix).Dur("quarantine", m.Quarantine).
			Msg("bridge: jobs of an ended engine session orphaned; their slots are freed after the quarantine")
		o.Send(b.cfg.CPU, &cpumsg.OrphanJobs{Jobs: refs, Quarantine: m.Quarantine})
	}
	b.drained(o)

	reply(o, m.Reply, messages.SessionReleased{Requests: len(m.Open), Jobs: len(doomed)}, nil)
}

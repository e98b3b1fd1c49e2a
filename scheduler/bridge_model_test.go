package scheduler

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/supervision/modeltime"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
	"github.com/kvtier/kvtier/tiers/tiering/tieringmsg"
)

// The bridge's core driven through a seeded world: engines (four requests)
// call the manager API as vLLM's scheduler and workers do — lookups, loads
// and stores and their completions, worker reports, a pause, a reset —
// against a CPU tier that answers in order (one mailbox) some steps later
// and a tiering actor that answers the MISS keys; checksums finish in any
// order; job deadlines fire at random (stopped ones too). After every
// message the world checks what the bridge promises, and at the end, with
// every answer delivered and every deadline fired, that nothing is left.
//
// The promises checked:
//   - every engine call is answered exactly once;
//   - every key a job holds at the CPU tier (pinned for a load, reserved
//     for a store) is given back exactly once (unpinned, committed, or with
//     its job's release), a job is released at most once, and a job gives
//     back only what it holds;
//   - readable commits reach the CPU tier in the order they began, however
//     their checksums finish;
//   - a Pause is answered only once every job issued before it ended (a
//     store whose slots the CPU tier has yet to grant included); once a
//     reset's deadline passed, no job issued before it runs (one that opens
//     later is reaped as it opens); HasPendingWork is true exactly while
//     engine jobs are in flight;
//   - settled, the bridge holds nothing: no job, pending answer, parked
//     commit, held call or drain, and the CPU tier no job's keys.
func TestBridgeModelSeeded(t *testing.T) {
	modeltime.Run(t, 120, 500, newBridgeWorld, (*bridgeWorld).step, (*bridgeWorld).settle)
}

// engineCall is an engine call and how often it was answered.
type engineCall struct {
	msg     any
	got     []func() // its answers not yet seen: each checks one (ReplyFunc's)
	answers int
}

// openJob is a job the engine was told about, as the engine sees it.
type openJob struct {
	id      messages.JobID
	req     *messages.ReqContext
	store   bool
	keys    []messages.Key // not yet completed by the engine
	workers int
	next    int // the next worker to report
}

type bridgeWorld struct {
	t    *testing.T
	rng  *rand.Rand
	b    *Bridge
	cpu  *actor.PID
	tier *actor.PID
	seq  atomic.Uint64
	cnt  Counters

	clock    *supervision.ManualClock
	cpuQueue []any
	tierAsks []*tieringmsg.AsyncLookup
	offload  []func() any
	timers   modeltime.Timers
	out      fx.Out // what the core decided, carried out by carry

	calls    []*engineCall
	current  *engineCall // the call being handed to the core, if any
	inTurn   bool        // the answer being seen came in its own call's turn
	reqs     []*messages.ReqContext
	jobs     map[messages.JobID]*openJob
	busyKeys map[string]map[messages.Key]bool         // per request: keys of its jobs (as an engine, never two at once)
	holds    map[messages.JobID]map[messages.Key]bool // the CPU tier: what each job holds
	released map[messages.JobID]bool
	seqOf    map[string]uint64 // a readable commit's begin order, by its job and first key
	reaped   messages.JobID    // the highest job id a passed drain deadline covers
	lastSeq  uint64
}

func newBridgeWorld(t *testing.T, seed uint64) *bridgeWorld {
	w := &bridgeWorld{t: t, rng: rand.New(rand.NewPCG(seed, 0xb41d)),
		cpu: actor.NewPID("model", "cpu"), tier: actor.NewPID("model", "tiering"),
		clock: supervision.NewManualClock(time.Unix(1_700_000_000, 0)),
		jobs:  map[messages.JobID]*openJob{}, busyKeys: map[string]map[messages.Key]bool{}, holds: map[messages.JobID]map[messages.Key]bool{},
		released: map[messages.JobID]bool{}, seqOf: map[string]uint64{}}
	for i := range 4 {
		id := fmt.Sprintf("req-%d", i)
		w.reqs = append(w.reqs, &messages.ReqContext{RequestID: id, Workers: 1 + i%2})
		w.busyKeys[id] = map[messages.Key]bool{}
	}
	slot := make([]byte, 64)
	w.b = newBridge(Config{CPU: fx.RefOf(w.cpu), Tiering: fx.RefOf(w.tier), Slot: func(int) []byte { return slot },
		Clock: w.clock, LeaseTTL: time.Minute, Workers: 1, LoadTimeout: time.Minute, StoreTimeout: time.Minute,
		JobSeq: &w.seq, Counters: &w.cnt, Log: zerolog.Nop()}, 1, new([]messages.Event))
	return w
}

// What the core decided (its fx.Out), checked message by message in the
// order it decided it.
func (w *bridgeWorld) carry() {
	w.offload = append(w.offload, w.out.Offloads...)
	w.timers.Carry(&w.out, w)
}

// Request is a Send here: the world queues both for the actor they went to,
// which answers (or not) in its own time.
func (w *bridgeWorld) Request(to *actor.PID, msg any) { w.Send(to, msg) }

// Respond fails: the bridge answers engine calls it held (fx.Answer), never
// in place.
func (w *bridgeWorld) Respond(msg any) { w.t.Fatalf("an in-place answer %T", msg) }

func (w *bridgeWorld) Send(to *actor.PID, msg any) {
	switch to {
	case w.cpu:
		if c, ok := msg.(*cpumsg.CommitSlots); ok && c.OK {
			s := w.seqOf[commitID(c.Job, c.Keys)]
			require.Greater(w.t, s, w.lastSeq, "a readable commit overtook one that began before it")
			w.lastSeq = s
		}
		w.cpuQueue = append(w.cpuQueue, msg)
	case w.tier:
		switch m := msg.(type) {
		case *tieringmsg.AsyncLookup:
			w.tierAsks = append(w.tierAsks, m)
		case *tieringmsg.Cascade:
		default:
			w.t.Fatalf("unexpected %T to the tiering actor", msg)
		}
	default:
		w.t.Fatalf("a message to an unknown actor %v", to)
	}
}

func commitID(job messages.JobRef, keys []messages.Key) string {
	return fmt.Sprint(job.ID, keys[0])
}

// handle gives the core one message, then takes every answer it gave.
func (w *bridgeWorld) handle(msg any) {
	if m, ok := msg.(*reapAt); ok {
		for _, d := range w.b.waiters {
			if d.gen == m.gen {
				w.reaped = max(w.reaped, d.upTo)
			}
		}
	}
	w.b.Handle(&w.out, msg)
	w.carry()
	w.collect()
	for id := range w.b.reg.jobs {
		require.Greater(w.t, id, w.reaped, "job %d runs past the deadline of a drain it was issued before", id)
	}
}

func (w *bridgeWorld) collect() {
	for _, c := range w.calls {
		for _, answer := range c.got {
			c.answers++
			require.Equal(w.t, 1, c.answers, "%T answered twice", c.msg)
			w.inTurn = c == w.current
			answer()
		}
		c.got = nil
	}
}

// call makes an engine call with a fresh Reply and hands it to the core;
// then, if set, sees its answer's value and error.
func call[T any](w *bridgeWorld, build func(messages.Reply[T]) any, then func(T, error)) {
	c := &engineCall{}
	reply := messages.ReplyFunc(func(r messages.Result[T]) {
		c.got = append(c.got, func() {
			if then != nil {
				then(r.Value, r.Err)
			}
		})
	})
	c.msg = build(reply)
	w.calls = append(w.calls, c)
	w.current = c
	w.handle(c.msg)
	w.current = nil
}

func (w *bridgeWorld) keys() []messages.Key {
	first, n := w.rng.IntN(12), 1+w.rng.IntN(4)
	out := make([]messages.Key, n)
	for i := range out {
		out[i] = k((first + i) % 12)
	}
	return out
}

// freeKeys are keys for a new job of req: none that a job of req still
// holds (an engine loads or stores a block once per request at a time).
func (w *bridgeWorld) freeKeys(req *messages.ReqContext) []messages.Key {
	var out []messages.Key
	for _, key := range w.keys() {
		if !w.busyKeys[req.RequestID][key] {
			out = append(out, key)
			w.busyKeys[req.RequestID][key] = true
		}
	}
	return out
}

func (w *bridgeWorld) freed(req *messages.ReqContext, keys []messages.Key) {
	for _, key := range keys {
		delete(w.busyKeys[req.RequestID], key)
	}
}

func (w *bridgeWorld) req() *messages.ReqContext { return w.reqs[w.rng.IntN(len(w.reqs))] }

func (w *bridgeWorld) step() {
	switch r := w.rng.IntN(100); {
	case r < 10:
		call(w, func(reply messages.Reply[[]messages.LookupStatus]) any {
			return &messages.Lookup{Req: w.req(), Keys: w.keys(), Prefix: w.rng.IntN(2) == 0, Reply: reply}
		}, nil)
	case r < 18:
		w.prepare(false)
	case r < 26:
		w.prepare(true)
	case r < 34:
		w.complete()
	case r < 42:
		w.report()
	case r < 58:
		w.answerCPU()
	case r < 64:
		w.answerTiering()
	case r < 72:
		w.finishChecksum()
	case r < 80:
		w.fireTimer(false)
	case r < 83:
		call(w, func(reply messages.Reply[bool]) any { return &messages.HasPendingWork{Reply: reply} },
			func(busy bool, err error) {
				require.NoError(w.t, err)
				if w.inTurn {
					// NB: answered in its own turn (not held behind a commit,
					// then answered amid others): the registry is as it saw it.
					require.Equal(w.t, len(w.b.reg.jobs) > 0, busy, "HasPendingWork")
				}
			})
	case r < 85:
		call(w, func(reply messages.Reply[[]messages.Event]) any { return &messages.TakeEvents{Reply: reply} }, nil)
	case r < 87:
		call(w, func(reply messages.Reply[messages.Stats]) any { return &messages.GetStats{Reply: reply} }, nil)
	case r < 89:
		req := w.req()
		call(w, func(reply messages.Reply[struct{}]) any { return &messages.RequestFinished{Req: req, Reply: reply} }, nil)
	case r < 91:
		w.pause()
	case r < 93:
		call(w, func(reply messages.Reply[struct{}]) any { return &messages.Resume{Reply: reply} }, nil)
	case r < 94:
		deadline := w.clock.Now().Add(time.Duration(w.rng.IntN(3)) * time.Second)
		call(w, func(reply messages.Reply[struct{}]) any {
			return &messages.ResetCache{Deadline: deadline, Reply: reply}
		}, nil)
	default:
		w.clock.Advance(time.Second)
	}
}

// prepare opens a load job (a store job if store) for a random request,
// on keys none of its jobs holds.
func (w *bridgeWorld) prepare(store bool) {
	req := w.req()
	keys := w.freeKeys(req)
	switch {
	case len(keys) == 0:
	case store:
		call(w, func(reply messages.Reply[messages.StorePlan]) any {
			return &messages.PrepareStore{Req: req, Keys: keys, Reply: reply}
		}, func(p messages.StorePlan, err error) {
			w.freed(req, keys)
			if err == nil && len(p.ToStore) > 0 {
				for _, key := range p.ToStore {
					w.busyKeys[req.RequestID][key] = true
				}
				w.jobs[p.Job] = &openJob{id: p.Job, req: req, store: true, keys: p.ToStore, workers: p.Workers}
			}
		})
	default:
		call(w, func(reply messages.Reply[messages.LoadJob]) any {
			return &messages.PrepareLoad{Req: req, Keys: keys, Reply: reply}
		}, func(j messages.LoadJob, err error) {
			if err != nil {
				w.freed(req, keys)
				return
			}
			require.Len(w.t, j.Slots, len(keys))
			w.jobs[j.ID] = &openJob{id: j.ID, req: req, keys: keys, workers: j.Workers}
		})
	}
}

// pick is a random job the engine knows of (nil: none).
func (w *bridgeWorld) pick() *openJob {
	if len(w.jobs) == 0 {
		return nil
	}
	ids := slices.Sorted(maps.Keys(w.jobs)) // NB: map order is random per run; sorted for a seed's replay
	return w.jobs[ids[w.rng.IntN(len(ids))]]
}

// complete ends some keys of a job as its connector does (CompleteLoad,
// CompleteStore), now and then keys it does not own.
func (w *bridgeWorld) complete() {
	j := w.pick()
	if j == nil || len(j.keys) == 0 {
		return
	}
	n := 1 + w.rng.IntN(len(j.keys))
	keys := append([]messages.Key(nil), j.keys[:n]...)
	j.keys = j.keys[n:]
	w.freed(j.req, keys)
	if w.rng.IntN(10) == 0 {
		keys = append(keys, k(20)) // not the job's: the call is refused whole
	}
	if j.store {
		ok := w.rng.IntN(6) != 0
		call(w, func(reply messages.Reply[struct{}]) any {
			return &messages.CompleteStore{Req: j.req, Keys: keys, OK: ok, Reply: reply}
		}, nil)
		return
	}
	call(w, func(reply messages.Reply[struct{}]) any {
		return &messages.CompleteLoad{Req: j.req, Keys: keys, Reply: reply}
	}, nil)
}

// report sends a job's next worker report (and now and then a repeated
// or out-of-range one).
func (w *bridgeWorld) report() {
	j := w.pick()
	if j == nil {
		return
	}
	worker := j.next
	switch w.rng.IntN(10) {
	case 0:
		worker = j.workers // out of range
	case 1:
		worker = max(j.next-1, 0) // a repeat
	default:
		j.next++
	}
	if j.next >= j.workers {
		delete(w.jobs, j.id)
		w.freed(j.req, j.keys)
	}
	ok := w.rng.IntN(8) != 0
	call(w, func(reply messages.Reply[struct{}]) any {
		return &messages.JobDone{Job: j.id, Worker: worker, OK: ok, Reply: reply}
	}, nil)
}

func (w *bridgeWorld) pause() {
	upTo := messages.JobID(w.seq.Load())
	clearCache := w.rng.IntN(2) == 0
	call(w, func(reply messages.Reply[struct{}]) any {
		return &messages.Pause{ClearCache: clearCache, Reply: reply}
	}, func(_ struct{}, err error) {
		if err != nil {
			return
		}
		for id := range w.b.reg.jobs {
			require.Greater(w.t, id, upTo, "a Pause answered while job %d, issued before it, runs", id)
		}
	})
}

// answerCPU processes the CPU tier's oldest request, as its mailbox would.
func (w *bridgeWorld) answerCPU() {
	if len(w.cpuQueue) == 0 {
		return
	}
	msg := w.cpuQueue[0]
	w.cpuQueue = w.cpuQueue[1:]
	if reply := w.cpuAnswer(msg); reply != nil {
		w.handle(reply)
	}
}

func (w *bridgeWorld) hold(job messages.JobID, keys []messages.Key) {
	if len(keys) == 0 {
		return
	}
	require.False(w.t, w.released[job], "job %d holds keys after its release", job)
	if w.holds[job] == nil {
		w.holds[job] = map[messages.Key]bool{}
	}
	for _, key := range keys {
		w.holds[job][key] = true
	}
}

func (w *bridgeWorld) giveBack(job messages.JobID, keys []messages.Key, what string) {
	for _, key := range keys {
		require.True(w.t, w.holds[job][key], "job %d %s %v, which it does not hold", job, what, key)
		delete(w.holds[job], key)
	}
	if len(w.holds[job]) == 0 {
		delete(w.holds, job)
	}
}

func (w *bridgeWorld) cpuAnswer(msg any) any {
	switch m := msg.(type) {
	case *cpumsg.LookupAndLease:
		st := make([]messages.LookupStatus, len(m.Keys))
		for i := range st {
			st[i] = []messages.LookupStatus{messages.Hit, messages.Miss, messages.Retry}[w.rng.IntN(3)]
		}
		return &cpumsg.LookupResult{Corr: m.Corr, Status: st}
	case *cpumsg.LeaseToPin:
		if w.rng.IntN(5) == 0 {
			return &cpumsg.PinResult{Corr: m.Corr, Job: m.Job, Err: messages.ErrUnknownKey}
		}
		w.hold(m.Job.ID, m.Keys)
		return &cpumsg.PinResult{Corr: m.Corr, Job: m.Job, Slots: make([]int, len(m.Keys))}
	case *cpumsg.ReserveSlots:
		if w.rng.IntN(6) == 0 {
			return &cpumsg.ReserveResult{Corr: m.Corr, Err: messages.ErrFull}
		}
		var toStore []messages.Key
		for _, key := range m.Keys {
			if w.rng.IntN(4) != 0 && !containsKey(toStore, key) {
				toStore = append(toStore, key)
			}
		}
		w.hold(m.Job.ID, toStore)
		return &cpumsg.ReserveResult{Corr: m.Corr, ToStore: toStore, Slots: make([]int, len(toStore))}
	case *cpumsg.UnpinKeys:
		w.giveBack(m.Job.ID, m.Keys, "unpins")
		return &messages.Ack{}
	case *cpumsg.CommitSlots:
		w.giveBack(m.Job.ID, m.Keys, "commits")
		return &messages.Ack{Corr: m.Corr}
	case *cpumsg.ReleaseJob:
		require.False(w.t, w.released[m.Job.ID], "job %d released twice", m.Job.ID)
		w.released[m.Job.ID] = true
		delete(w.holds, m.Job.ID)
		return &messages.Ack{}
	case *cpumsg.TakeTierEvents:
		return &cpumsg.TierEvents{Corr: m.Corr}
	case *cpumsg.TierStats:
		return &cpumsg.TierStatsResult{Corr: m.Corr}
	case *cpumsg.ClearTier:
		return &messages.Ack{Corr: m.Corr}
	case *cpumsg.TouchKeys, *cpumsg.ReleaseHolder:
		return nil
	}
	w.t.Fatalf("unexpected CPU request %T", msg)
	return nil
}

func containsKey(keys []messages.Key, k messages.Key) bool {
	for _, x := range keys {
		if x == k {
			return true
		}
	}
	return false
}

func (w *bridgeWorld) answerTiering() {
	if len(w.tierAsks) == 0 {
		return
	}
	m := modeltime.Take(&w.tierAsks, w.rng.IntN(len(w.tierAsks)))
	st := make([]messages.LookupStatus, len(m.Keys))
	for j := range st {
		st[j] = []messages.LookupStatus{messages.Miss, messages.Retry}[w.rng.IntN(2)]
	}
	w.handle(&tieringmsg.AsyncLookupResult{Corr: m.Corr, Status: st})
}

// finishChecksum hands back a random checksum's result: they finish in
// any order.
func (w *bridgeWorld) finishChecksum() {
	if len(w.offload) == 0 {
		return
	}
	work := modeltime.Take(&w.offload, w.rng.IntN(len(w.offload)))
	res := work()
	if c, ok := res.(*checksummed); ok {
		w.seqOf[commitID(c.call.ref, c.call.keys)] = c.seq
	}
	w.handle(res)
}

func (w *bridgeWorld) fireTimer(settling bool) bool {
	msg, ok := w.timers.Fire(w.rng, settling)
	if ok {
		w.clock.Advance(time.Second)
		w.handle(msg)
	}
	return ok
}

// settle delivers every answer and checksum and fires every deadline
// until nothing is in flight, then checks that nothing is left.
func (w *bridgeWorld) settle() {
	for progress := true; progress; {
		progress = false
		for len(w.cpuQueue) > 0 || len(w.tierAsks) > 0 || len(w.offload) > 0 {
			w.answerCPU()
			w.answerTiering()
			w.finishChecksum()
			progress = true
		}
		if w.fireTimer(true) {
			progress = true
		}
	}
	for _, c := range w.calls {
		require.Equal(w.t, 1, c.answers, "%T never answered", c.msg)
	}
	b := w.b
	require.Empty(w.t, b.reg.jobs, "jobs left in the registry")
	require.Empty(w.t, b.reg.byReq)
	require.Empty(w.t, b.pending, "answers still awaited")
	require.Empty(w.t, b.parked, "commits parked")
	require.Zero(w.t, b.commits, "commits in flight")
	require.Empty(w.t, b.waiters, "drains waiting")
	require.Empty(w.t, b.opening, "store jobs opening")
	require.Zero(w.t, b.order.waiting(), "calls held")
	require.Empty(w.t, w.holds, "the CPU tier still holds keys for jobs")
}

// A restart answers every call the dying incarnation owed, a commit parked
// behind an earlier one's checksum included: two stores' completions, the
// second's checksum first (parked), then the restart — the parked one's
// completion is answered at once, the first's when its checksum reaches
// the next incarnation; none waits for a deadline.
func TestBridgeRestartAnswersParkedCommits(t *testing.T) {
	w := newBridgeWorld(t, 1)
	req := w.reqs[0]
	var stores []*engineCall
	for i := range 2 {
		keys := []messages.Key{k(i)}
		var job messages.JobID
		call(w, func(reply messages.Reply[messages.StorePlan]) any {
			return &messages.PrepareStore{Req: req, Keys: keys, Reply: reply}
		}, func(p messages.StorePlan, err error) { job = p.Job })
		m := w.cpuQueue[0].(*cpumsg.ReserveSlots)
		w.cpuQueue = w.cpuQueue[1:]
		w.hold(m.Job.ID, keys)
		w.handle(&cpumsg.ReserveResult{Corr: m.Corr, ToStore: keys, Slots: []int{i}})
		require.NotZero(t, job)
		call(w, func(reply messages.Reply[struct{}]) any {
			return &messages.CompleteStore{Req: req, Keys: keys, OK: true, Reply: reply}
		}, nil)
		stores = append(stores, w.calls[len(w.calls)-1])
	}
	require.Len(t, w.offload, 2, "both commits are being checksummed")
	second := w.offload[1]()
	w.offload = w.offload[:1]
	w.handle(second)
	require.Len(t, w.b.parked, 1, "the second commit waits for the first")
	w.b.failInFlight(&w.out)
	w.carry()
	w.collect()
	require.Equal(t, 1, stores[1].answers, "the parked commit's completion is answered by the restart")
	require.Zero(t, stores[0].answers, "the first is still being checksummed")
	// The next incarnation gets the first checksum: a commit it never
	// counted, answered at once.
	w.b = newBridge(w.b.cfg, 2, w.b.carry)
	sent := len(w.cpuQueue)
	w.handle(w.offload[0]())
	require.Equal(t, 1, stores[0].answers, "the first commit's completion is answered by the next incarnation")
	require.Len(t, w.cpuQueue, sent, "no commit of the old incarnation reaches the CPU tier")
}

package scheduler

import (
	"hash/crc32"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/supervision/fxlog"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
	"github.com/kvtier/kvtier/tiers/tiering/tieringmsg"
)

// Scenario tests of the bridge's core, one engine flow each, with exact
// expectations of what it asks the CPU tier and the tiering actor and how
// it answers the engine (bridge_model_test.go checks the invariants over
// random interleavings; these pin the decisions).

// rig is a Bridge with a recording world around it.
type rig struct {
	t     *testing.T
	b     *Bridge
	cpu   *actor.PID
	tier  *actor.PID
	clock *supervision.ManualClock
	cnt   Counters
	seq   atomic.Uint64
	fxlog.Log
	out fx.Out // what the core decided, taken into the log
}

// newRig: a bridge with a tiering actor (tiered) or without, two workers
// per job by default.
func newRig(t *testing.T, tiered bool) *rig {
	r := &rig{t: t, cpu: actor.NewPID("core", "cpu"), clock: supervision.NewManualClock(time.Unix(1_700_000_000, 0))}
	if tiered {
		r.tier = actor.NewPID("core", "tiering")
	}
	slots := [][]byte{[]byte("slot zero"), []byte("slot one"), []byte("slot two"), []byte("slot three")}
	r.b = newBridge(Config{CPU: fx.RefOf(r.cpu), Tiering: fx.RefOf(r.tier), Slot: func(i int) []byte { return slots[i] },
		Clock: r.clock, LeaseTTL: time.Minute, Workers: 2, LoadTimeout: time.Minute, StoreTimeout: time.Minute,
		JobSeq: &r.seq, Counters: &r.cnt, Log: zerolog.Nop()}, 1, new([]messages.Event))
	return r
}

func (r *rig) handle(msg any) []fxlog.Sent {
	return r.Step(&r.out, func(o *fx.Out) { r.b.Handle(o, msg) })
}

// runOffloaded runs the checksums handed off so far and hands their
// results back, in the order given.
func (r *rig) runOffloaded(order ...int) []fxlog.Sent {
	work := r.Offloaded
	r.Offloaded = nil
	var out []fxlog.Sent
	for _, i := range order {
		out = append(out, r.handle(work[i]())...)
	}
	return out
}

func answer[T any](t *testing.T, r messages.Reply[T]) (T, error) {
	t.Helper()
	select {
	case got := <-r.C():
		return got.Value, got.Err
	default:
		t.Fatal("not answered")
		var zero T
		return zero, nil
	}
}

func unanswered[T any](t *testing.T, r messages.Reply[T]) {
	t.Helper()
	require.Empty(t, r.C(), "answered too early")
}

var req1 = &messages.ReqContext{RequestID: "r1"}

func TestLookupPutsOnlyTheCPUMissesToTheTiers(t *testing.T) {
	r := newRig(t, true)
	reply := messages.NewReply[[]messages.LookupStatus]()
	lease := fxlog.One[*cpumsg.LookupAndLease](t, r.handle(&messages.Lookup{Req: req1, Keys: []messages.Key{k(1), k(2), k(3)}, Reply: reply}), r.cpu)
	require.Equal(t, time.Minute, lease.TTL)
	ask := fxlog.One[*tieringmsg.AsyncLookup](t, r.handle(&cpumsg.LookupResult{Corr: lease.Corr,
		Status: []messages.LookupStatus{messages.Hit, messages.Miss, messages.HitPending}}), r.tier)
	require.Equal(t, []messages.Key{k(2)}, ask.Keys)
	unanswered(t, reply)
	r.handle(&tieringmsg.AsyncLookupResult{Corr: ask.Corr, Status: []messages.LookupStatus{messages.Retry}})
	st, err := answer(t, reply)
	require.NoError(t, err)
	require.Equal(t, []messages.LookupStatus{messages.Hit, messages.Retry, messages.HitPending}, st)
}

func TestPrefixLookupAsksTheTiersOnlyWhenTheScanStoppedAtAMiss(t *testing.T) {
	for _, tc := range []struct {
		cpu  []messages.LookupStatus
		asks []messages.Key
	}{
		{[]messages.LookupStatus{messages.Hit, messages.Miss, messages.Miss}, []messages.Key{k(2), k(3)}},
		{[]messages.LookupStatus{messages.Hit, messages.HitPending, messages.Miss}, nil}, // stopped at a pending HIT
		{[]messages.LookupStatus{messages.Hit, messages.Hit, messages.Hit}, nil},
	} {
		r := newRig(t, true)
		reply := messages.NewReply[[]messages.LookupStatus]()
		lease := fxlog.One[*cpumsg.LookupAndLease](t, r.handle(&messages.Lookup{Req: req1, Keys: []messages.Key{k(1), k(2), k(3)}, Prefix: true, Reply: reply}), r.cpu)
		require.True(t, lease.Prefix)
		out := r.handle(&cpumsg.LookupResult{Corr: lease.Corr, Status: tc.cpu})
		if tc.asks == nil {
			require.Empty(t, out, "cpu %v", tc.cpu)
			st, _ := answer(t, reply)
			require.Equal(t, tc.cpu, st)
			continue
		}
		ask := fxlog.One[*tieringmsg.AsyncLookup](t, out, r.tier)
		require.Equal(t, tc.asks, ask.Keys)
		require.True(t, ask.Prefix)
	}
}

func TestWithoutTiersAMissIsAnsweredAsTheCPUTierSaid(t *testing.T) {
	r := newRig(t, false)
	reply := messages.NewReply[[]messages.LookupStatus]()
	lease := fxlog.One[*cpumsg.LookupAndLease](t, r.handle(&messages.Lookup{Req: req1, Keys: []messages.Key{k(1)}, Reply: reply}), r.cpu)
	require.Empty(t, r.handle(&cpumsg.LookupResult{Corr: lease.Corr, Status: []messages.LookupStatus{messages.Miss}}))
	st, err := answer(t, reply)
	require.NoError(t, err)
	require.Equal(t, []messages.LookupStatus{messages.Miss}, st)
}

func TestALoadIsPinnedReleasedAfterEveryWorkerAndLateReportsAreRefused(t *testing.T) {
	r := newRig(t, false)
	reply := messages.NewReply[messages.LoadJob]()
	pin := fxlog.One[*cpumsg.LeaseToPin](t, r.handle(&messages.PrepareLoad{Req: req1, Keys: []messages.Key{k(1), k(2)}, Reply: reply}), r.cpu)
	require.True(t, pin.KeepRank)
	r.handle(&cpumsg.PinResult{Corr: pin.Corr, Job: pin.Job, Slots: []int{3, 1}})
	job, err := answer(t, reply)
	require.NoError(t, err)
	require.Equal(t, messages.LoadJob{ID: pin.Job.ID, Slots: []int{3, 1}, Workers: 2}, job)

	done := func(worker int) ([]fxlog.Sent, error) {
		d := messages.NewReply[struct{}]()
		out := r.handle(&messages.JobDone{Job: job.ID, Worker: worker, OK: true, Reply: d})
		_, err := answer(t, d)
		return out, err
	}
	out, err := done(1)
	require.NoError(t, err)
	require.Empty(t, out, "one of two workers: the pins stay")
	_, err = done(1)
	require.ErrorIs(t, err, messages.ErrBadWorker, "a worker reports once")
	_, err = done(2)
	require.ErrorIs(t, err, messages.ErrBadWorker, "no third worker")
	out, err = done(0)
	require.NoError(t, err)
	require.Equal(t, pin.Job, fxlog.One[*cpumsg.ReleaseJob](t, out, r.cpu).Job)
	_, err = done(0)
	require.ErrorIs(t, err, messages.ErrUnknownJob)
	require.Equal(t, Counters{JobsCompleted: 1, LateReports: 2}, r.cnt)
}

func TestARefusedPinFailsTheLoadAndLeavesNoJob(t *testing.T) {
	r := newRig(t, false)
	reply := messages.NewReply[messages.LoadJob]()
	pin := fxlog.One[*cpumsg.LeaseToPin](t, r.handle(&messages.PrepareLoad{Req: req1, Keys: []messages.Key{k(1)}, Reply: reply}), r.cpu)
	r.handle(&cpumsg.PinResult{Corr: pin.Corr, Job: pin.Job, Err: messages.ErrUnknownKey})
	_, err := answer(t, reply)
	require.ErrorIs(t, err, messages.ErrUnknownKey)
	require.Empty(t, r.b.reg.jobs)
}

// store prepares keys for req1 and returns the plan the engine got.
func (r *rig) store(keys ...messages.Key) messages.StorePlan {
	r.t.Helper()
	reply := messages.NewReply[messages.StorePlan]()
	res := fxlog.One[*cpumsg.ReserveSlots](r.t, r.handle(&messages.PrepareStore{Req: req1, Keys: keys, Reply: reply}), r.cpu)
	slots := make([]int, len(keys))
	for i := range slots {
		slots[i] = i
	}
	r.handle(&cpumsg.ReserveResult{Corr: res.Corr, ToStore: keys, Slots: slots})
	plan, err := answer(r.t, reply)
	require.NoError(r.t, err)
	return plan
}

func TestAStoreCommitsWithTheSlotsChecksumsThenCascades(t *testing.T) {
	r := newRig(t, true)
	plan := r.store(k(1), k(2))
	require.Equal(t, 2, plan.Workers)
	done := messages.NewReply[struct{}]()
	require.Empty(t, r.handle(&messages.CompleteStore{Req: req1, Keys: []messages.Key{k(1), k(2)}, OK: true, Reply: done}),
		"checksummed off the mailbox first")
	require.Len(t, r.Offloaded, 1)
	commit := fxlog.One[*cpumsg.CommitSlots](t, r.runOffloaded(0), r.cpu)
	require.True(t, commit.OK)
	require.Equal(t, []messages.Key{k(1), k(2)}, commit.Keys)
	require.Equal(t, []uint32{castagnoliSum("slot zero"), castagnoliSum("slot one")}, commit.Checksums)
	unanswered(t, done)

	out := r.handle(&messages.Ack{Corr: commit.Corr})
	cascade := fxlog.One[*tieringmsg.Cascade](t, out, r.tier)
	require.Equal(t, commit.Checksums, cascade.Checksums, "cascaded before the engine hears")
	_, err := answer(t, done)
	require.NoError(t, err)
	require.Empty(t, r.b.reg.jobs, "every key claimed: the job is gone")
}

func TestAFailedStoreIsCommittedUnreadableWithoutChecksumsOrCascade(t *testing.T) {
	r := newRig(t, true)
	plan := r.store(k(1))
	reports := func(ok bool, w int) []fxlog.Sent {
		return r.handle(&messages.JobDone{Job: plan.Job, Worker: w, OK: ok, Reply: messages.NewReply[struct{}]()})
	}
	require.Empty(t, reports(true, 0))
	commit := fxlog.One[*cpumsg.CommitSlots](t, reports(false, 1), r.cpu)
	require.False(t, commit.OK, "one worker failed: never readable")
	require.Empty(t, r.Offloaded, "nothing to checksum")
	require.Empty(t, r.handle(&messages.Ack{Corr: commit.Corr}), "nothing cascaded")
}

func TestCommitsReachTheCPUTierInTheOrderTheyBegan(t *testing.T) {
	r := newRig(t, false)
	r.store(k(1))
	r.store(k(2))
	r.handle(&messages.CompleteStore{Req: req1, Keys: []messages.Key{k(1)}, OK: true, Reply: messages.NewReply[struct{}]()})
	r.handle(&messages.CompleteStore{Req: req1, Keys: []messages.Key{k(2)}, OK: true, Reply: messages.NewReply[struct{}]()})
	out := r.runOffloaded(1, 0) // the later checksum finishes first
	var order []messages.Key
	for _, c := range out {
		order = append(order, c.Msg.(*cpumsg.CommitSlots).Keys...)
	}
	require.Equal(t, []messages.Key{k(1), k(2)}, order, "blocks ranked in completion order")
}

func TestAStalledStoreIsReapedAtItsDeadlineAndItsReportIsLate(t *testing.T) {
	r := newRig(t, false)
	plan := r.store(k(1))
	commit := fxlog.One[*cpumsg.CommitSlots](t, r.handle(r.Armed[0]), r.cpu)
	require.False(t, commit.OK, "a reaped store is never readable")
	require.Equal(t, uint64(1), r.cnt.ReapedStore)
	d := messages.NewReply[struct{}]()
	r.handle(&messages.JobDone{Job: plan.Job, Worker: 0, OK: true, Reply: d})
	_, err := answer(t, d)
	require.ErrorIs(t, err, messages.ErrUnknownJob)
}

func TestPauseWaitsForJobsAndRefusesIntakeUntilResume(t *testing.T) {
	r := newRig(t, false)
	plan := r.store(k(1))
	paused := messages.NewReply[struct{}]()
	r.handle(&messages.Pause{Reply: paused})
	unanswered(t, paused)

	lookup := messages.NewReply[[]messages.LookupStatus]()
	require.Empty(t, r.handle(&messages.Lookup{Req: req1, Keys: []messages.Key{k(9)}, Reply: lookup}), "a paused node asks no tier")
	st, err := answer(t, lookup)
	require.NoError(t, err)
	require.Equal(t, []messages.LookupStatus{messages.Miss}, st)
	storeReply := messages.NewReply[messages.StorePlan]()
	r.handle(&messages.PrepareStore{Req: req1, Keys: []messages.Key{k(9)}, Reply: storeReply})
	_, err = answer(t, storeReply)
	require.ErrorIs(t, err, messages.ErrPaused)

	for w := range 2 {
		r.handle(&messages.JobDone{Job: plan.Job, Worker: w, OK: false, Reply: messages.NewReply[struct{}]()})
	}
	commit := fxlog.One[*cpumsg.CommitSlots](t, r.Out, r.cpu)
	unanswered(t, paused)
	r.handle(&messages.Ack{Corr: commit.Corr})
	_, err = answer(t, paused)
	require.NoError(t, err, "answered once the job ended and its commit landed")

	resumed := messages.NewReply[struct{}]()
	r.handle(&messages.Resume{Reply: resumed})
	_, err = answer(t, resumed)
	require.NoError(t, err)
	require.NotEmpty(t, r.handle(&messages.PrepareStore{Req: req1, Keys: []messages.Key{k(9)}, Reply: messages.NewReply[messages.StorePlan]()}))
}

func TestResetCacheReapsStragglersAtItsDeadlineThenClears(t *testing.T) {
	r := newRig(t, false)
	r.store(k(1))
	reset := messages.NewReply[struct{}]()
	r.handle(&messages.ResetCache{Deadline: r.clock.Now().Add(time.Second), Reply: reset})
	at, armed := fxlog.Armed[*reapAt](&r.Log)
	require.True(t, armed)
	commit := fxlog.One[*cpumsg.CommitSlots](t, r.handle(at), r.cpu)
	require.False(t, commit.OK)
	clear := fxlog.One[*cpumsg.ClearTier](t, r.handle(&messages.Ack{Corr: commit.Corr}), r.cpu)
	unanswered(t, reset)
	r.handle(&messages.Ack{Corr: clear.Corr})
	_, err := answer(t, reset)
	require.NoError(t, err)
}

func TestShutdownClosesIntakeForGood(t *testing.T) {
	r := newRig(t, false)
	down := messages.NewReply[struct{}]()
	r.handle(&messages.Shutdown{Deadline: r.clock.Now().Add(time.Second), Reply: down})
	_, err := answer(t, down)
	require.NoError(t, err, "nothing in flight: answered at once")
	lookup := messages.NewReply[[]messages.LookupStatus]()
	r.handle(&messages.Lookup{Req: req1, Keys: []messages.Key{k(1)}, Reply: lookup})
	_, err = answer(t, lookup)
	require.ErrorIs(t, err, messages.ErrClosed)
	resumed := messages.NewReply[struct{}]()
	r.handle(&messages.Resume{Reply: resumed})
	_, err = answer(t, resumed)
	require.ErrorIs(t, err, messages.ErrClosed, "a closed node does not resume")
}

func TestBadKeysAreRefusedBeforeAnyTierIsAsked(t *testing.T) {
	r := newRig(t, false)
	bad := []messages.Key{{Namespace: "ns"}}
	lookup := messages.NewReply[[]messages.LookupStatus]()
	load := messages.NewReply[messages.LoadJob]()
	touch := messages.NewReply[struct{}]()
	require.Empty(t, r.handle(&messages.Lookup{Req: req1, Keys: bad, Reply: lookup}))
	require.Empty(t, r.handle(&messages.PrepareLoad{Req: req1, Keys: bad, Reply: load}))
	require.Empty(t, r.handle(&messages.Touch{Req: req1, Keys: bad, Reply: touch}))
	_, err := answer(t, lookup)
	require.ErrorIs(t, err, messages.ErrBadKey)
	_, err = answer(t, load)
	require.ErrorIs(t, err, messages.ErrBadKey)
	_, err = answer(t, touch)
	require.ErrorIs(t, err, messages.ErrBadKey)
	require.Zero(t, r.seq.Load(), "no job id spent on a refused call")
}

func TestCompletingKeysNoJobHoldsIsRefused(t *testing.T) {
	r := newRig(t, false)
	load := messages.NewReply[struct{}]()
	r.handle(&messages.CompleteLoad{Req: req1, Keys: []messages.Key{k(1)}, Reply: load})
	_, err := answer(t, load)
	require.ErrorIs(t, err, messages.ErrNotLoading)
	store := messages.NewReply[struct{}]()
	r.handle(&messages.CompleteStore{Req: req1, Keys: []messages.Key{k(1)}, OK: true, Reply: store})
	_, err = answer(t, store)
	require.ErrorIs(t, err, messages.ErrNotPending)
}

func TestAnEndedSessionOrphansItsJobsAndReleasesItsHolders(t *testing.T) {
	r := newRig(t, false)
	sess := &messages.ReqContext{RequestID: "\x1es7\x1freq"}
	res := fxlog.One[*cpumsg.ReserveSlots](t, r.handle(&messages.PrepareStore{Req: sess, Keys: []messages.Key{k(1)}, Reply: messages.NewReply[messages.StorePlan]()}), r.cpu)
	r.handle(&cpumsg.ReserveResult{Corr: res.Corr, ToStore: []messages.Key{k(1)}, Slots: []int{0}})
	r.store(k(2)) // another session's job stays

	reply := messages.NewReply[messages.SessionReleased]()
	out := r.handle(&messages.ReleaseSession{Prefix: "\x1es7\x1f", Open: []string{"\x1es7\x1freq"}, Session: 7, Quarantine: time.Second, Reply: reply})
	got, err := answer(t, reply)
	require.NoError(t, err)
	require.Equal(t, messages.SessionReleased{Requests: 1, Jobs: 1}, got)
	orphans := fxlog.One[*cpumsg.OrphanJobs](t, out, r.cpu)
	require.Equal(t, []messages.JobRef{res.Job}, orphans.Jobs)
	require.Equal(t, time.Second, orphans.Quarantine, "not freed at once: the engine may still copy")
	fxlog.One[*cpumsg.ReleaseHolder](t, out, r.cpu)
	fxlog.One[*cpumsg.ReleaseCredit](t, out, r.cpu)
	require.Len(t, r.b.reg.jobs, 1)
	require.Equal(t, uint64(1), r.cnt.ReapedStore)
}

func TestHasPendingWorkCountsEngineJobsOnly(t *testing.T) {
	r := newRig(t, true)
	pending := func() bool {
		reply := messages.NewReply[bool]()
		r.handle(&messages.HasPendingWork{Reply: reply})
		v, err := answer(t, reply)
		require.NoError(t, err)
		return v
	}
	require.False(t, pending())
	r.handle(&messages.Lookup{Req: req1, Keys: []messages.Key{k(1)}, Reply: messages.NewReply[[]messages.LookupStatus]()})
	require.False(t, pending(), "a lookup in flight needs no engine step")
	plan := r.store(k(1))
	require.True(t, pending())
	for w := range 2 {
		r.handle(&messages.JobDone{Job: plan.Job, Worker: w, OK: true, Reply: messages.NewReply[struct{}]()})
	}
	require.False(t, pending(), "the commit progresses on its own")
}

func castagnoliSum(s string) uint32 { return crc32.Checksum([]byte(s), castagnoli) }

package node

import (
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/internal/testutil/testleak"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/client"
	"github.com/kvtier/kvtier/supervision"
)

// NB: zmq4 v0.17.0's PUB socket never stops its writer goroutine on Close
// (upstream bug, see events/); it is the one goroutine allowed to outlive a
// node that published events.
func TestMain(m *testing.M) {
	testleak.VerifyTestMain(m)
}

const (
	testBlock   = 4096
	testTimeout = 30 * time.Second // per-call deadline; never reached by a passing test
)

var testNS = messages.Layout{Model: "m", DType: "fp16", BlockTokens: 16, TPSize: 1}.Namespace()

func key(i int) messages.Key {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(i))
	return messages.Key{Namespace: testNS, Hash: string(b[:])}
}

func keys(ids ...int) []messages.Key {
	out := make([]messages.Key, len(ids))
	for i, id := range ids {
		out[i] = key(id)
	}
	return out
}

// mode is a way into a node (docs/DESIGN.md §3.2):
// the behaviour tests run through both, and must give the same results.
type mode string

const (
	embeddedMode   mode = "embedded"   // the in-process Manager
	standaloneMode mode = "standalone" // the Go client over the engine endpoint's socket and the shared pool
	unixMode       mode = "unix"       // standalone, over the endpoint's unix:// stream transport
)

var modes = []mode{embeddedMode, standaloneMode, unixMode}

// remote reports whether a mode goes through the engine endpoint.
func (m mode) remote() bool { return m != embeddedMode }

// eachMode runs a behaviour test once per mode.
func eachMode(t *testing.T, test func(t *testing.T, m mode)) {
	for _, m := range modes {
		t.Run(string(m), func(t *testing.T) { test(t, m) })
	}
}

type harness struct {
	t     *testing.T
	mode  mode
	node  *Node
	m     Manager
	clock *supervision.ManualClock
	ctx   context.Context
}

// openReal opens a node of cfg as it is (on the real clock, unless cfg
// says otherwise), with a context that ends after d; the node must close
// cleanly when the test ends.
func openReal(t *testing.T, d time.Duration, cfg config.Config) (*Node, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	node, err := Open(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, node.Close(ctx)) })
	return node, ctx
}

// open starts an embedded node of `slots` slots on a manual clock.
func open(t *testing.T, slots int, tweak ...func(*config.Config)) *harness {
	t.Helper()
	return openMode(t, embeddedMode, slots, tweak...)
}

// openMode starts a node of `slots` slots on a manual clock; in standalone
// mode the manager is a client connected through the node's engine endpoint
// (an ipc socket) with the pool mapped from its shared-memory file.
func openMode(t *testing.T, m mode, slots int, tweak ...func(*config.Config)) *harness {
	t.Helper()
	clock := supervision.NewManualClock(time.Unix(1_700_000_000, 0))
	cfg := config.Config{PoolBytes: int64(slots * testBlock), BlockBytes: testBlock, Clock: clock}
	if m.remote() {
		dir := t.TempDir()
		cfg.PoolPath = filepath.Join(dir, "pool")
		cfg.EngineListen = "ipc://" + filepath.Join(dir, "engine.sock")
		if m == unixMode {
			cfg.EngineListen = "unix://" + filepath.Join(dir, "engine.sock")
		}
	}
	for _, f := range tweak {
		f(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	node, err := Open(ctx, cfg)
	require.NoError(t, err)
	h := &harness{t: t, mode: m, node: node, m: node.Manager(), clock: clock, ctx: ctx}
	var closeClient func(context.Context) error
	if m.remote() {
		// the real client: a DEALER on the engine endpoint, the pool mapped from its file
		c, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: t.Name()})
		require.NoError(t, err)
		h.m, closeClient = c, c.Close
	}
	t.Cleanup(func() {
		if closeClient != nil {
			require.NoError(t, closeClient(ctx))
		}
		require.NoError(t, node.Close(ctx))
		cancel()
	})
	return h
}

func fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(seed*31 + i)
	}
}

// store writes blocks for ids through a store job reported by every worker.
func (h *harness) store(req *messages.ReqContext, ids ...int) messages.StorePlan {
	h.t.Helper()
	plan, err := h.m.PrepareStore(h.ctx, req, keys(ids...))
	require.NoError(h.t, err)
	for i, k := range plan.ToStore {
		fill(h.m.Pool().Slot(plan.Slots[i]), int(binary.BigEndian.Uint64([]byte(k.Hash))))
	}
	for w := 0; w < plan.Workers; w++ {
		require.NoError(h.t, h.m.JobDone(h.ctx, plan.Job, w, true))
	}
	return plan
}

// storeAndLookup stores ids through a writer "w", then has a reader "r"
// look up the blocks seen until they settle (leasing the hits to it).
func (h *harness) storeAndLookup(ids []int, seen ...int) (writer, reader *messages.ReqContext) {
	h.t.Helper()
	writer, reader = h.storeAs("w", ids...), &messages.ReqContext{RequestID: "r"}
	h.lookupUntilSettled(reader, keys(seen...))
	return writer, reader
}

// storeAs stores ids through a new request of that id, and returns it.
func (h *harness) storeAs(id string, ids ...int) *messages.ReqContext {
	h.t.Helper()
	req := &messages.ReqContext{RequestID: id}
	h.store(req, ids...)
	return req
}

func (h *harness) stats() messages.Stats {
	h.t.Helper()
	s, err := h.m.Stats(h.ctx)
	require.NoError(h.t, err)
	return s
}

// quiet ends the requests given, then asserts nothing is pinned, leased
// or being written.
func (h *harness) quiet(finished ...*messages.ReqContext) {
	h.t.Helper()
	for _, req := range finished {
		require.NoError(h.t, h.m.RequestFinished(h.ctx, req))
	}
	s := h.stats()
	require.Zero(h.t, s.Pinned, "pinned slots")
	require.Zero(h.t, s.Leased, "leased slots")
	require.Zero(h.t, s.WritePending, "write-pending slots")
	require.Zero(h.t, s.JobsInFlight, "jobs in flight")
}

// lookupUntilSettled looks up until no key is HIT_PENDING (a store's commit
// is checksummed off the mailbox, so it lands a moment after JobDone).
func (h *harness) lookupUntilSettled(req *messages.ReqContext, ks []messages.Key) []messages.LookupStatus {
	h.t.Helper()
	for {
		st, err := h.m.Lookup(h.ctx, req, ks, false)
		require.NoError(h.t, err)
		settled := true
		for _, s := range st {
			settled = settled && s != messages.HitPending
		}
		if settled {
			return st
		}
		require.NoError(h.t, h.ctx.Err())
	}
}

func TestStoreLookupLoadRoundTrip(t *testing.T) { eachMode(t, testStoreLookupLoadRoundTrip) }

func testStoreLookupLoadRoundTrip(t *testing.T, m mode) {
	h := openMode(t, m, 8)
	writer := &messages.ReqContext{RequestID: "w"}
	plan := h.store(writer, 1, 2, 3)
	require.Len(t, plan.ToStore, 3)
	require.NoError(t, h.m.RequestFinished(h.ctx, writer))

	reader := &messages.ReqContext{RequestID: "r"}
	st := h.lookupUntilSettled(reader, keys(1, 2, 3, 4))
	require.Equal(t, []messages.LookupStatus{messages.Hit, messages.Hit, messages.Hit, messages.Miss}, st)
	require.Equal(t, 3, h.stats().Leased)

	job, err := h.m.PrepareLoad(h.ctx, reader, keys(1, 2, 3))
	require.NoError(t, err)
	for i, id := range []int{1, 2, 3} {
		want := make([]byte, testBlock)
		fill(want, id)
		require.Equal(t, want, h.m.Pool().Slot(job.Slots[i]), "block %d", id)
	}
	s := h.stats()
	require.Equal(t, 3, s.Pinned)
	require.Zero(t, s.Leased, "PrepareLoad consumes the leases")
	require.True(t, h.pending())

	require.NoError(t, h.m.JobDone(h.ctx, job.ID, 0, true))
	require.False(t, h.pending())
	h.quiet()

	events, err := h.m.TakeEvents(h.ctx)
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.Equal(t, messages.BlockStored, events[0].Kind)
	h.sameCtx(writer, events[0].Ctx, "stored event carries the producing request's context")
	require.Equal(t, keys(1, 2, 3), events[0].Keys)
}

func TestPrefixLookupStopsAtFirstMiss(t *testing.T) { eachMode(t, testPrefixLookupStopsAtFirstMiss) }

func testPrefixLookupStopsAtFirstMiss(t *testing.T, m mode) {
	h := openMode(t, m, 8)
	h.store(&messages.ReqContext{RequestID: "w"}, 1, 3)
	req := &messages.ReqContext{RequestID: "r"}
	h.lookupUntilSettled(&messages.ReqContext{RequestID: "probe"}, keys(1, 3))
	require.NoError(t, h.m.RequestFinished(h.ctx, &messages.ReqContext{RequestID: "probe"}))
	st := h.lookup(req, keys(1, 2, 3), true)
	require.Equal(t, []messages.LookupStatus{messages.Hit, messages.Miss, messages.Miss}, st)
	require.Equal(t, 1, h.stats().Leased, "keys after the first miss are not leased")
	h.quiet(req)
}

func TestLeasedHitSurvivesEvictionPressure(t *testing.T) {
	eachMode(t, testLeasedHitSurvivesEvictionPressure)
}

func testLeasedHitSurvivesEvictionPressure(t *testing.T, m mode) {
	h := openMode(t, m, 4)
	h.store(&messages.ReqContext{RequestID: "w"}, 1, 2, 3, 4)
	reader := &messages.ReqContext{RequestID: "r"}
	require.Equal(t, messages.Hit, h.lookupUntilSettled(reader, keys(1))[0])

	// Three more blocks fit only by evicting three of the four: key 1 is
	// leased, so 2, 3, 4 go.
	plan, err := h.m.PrepareStore(h.ctx, &messages.ReqContext{RequestID: "w2"}, keys(5, 6, 7))
	require.NoError(t, err)
	require.ElementsMatch(t, keys(2, 3, 4), plan.Evicted)
	require.NoError(t, h.m.JobDone(h.ctx, plan.Job, 0, true))

	// A fourth cannot: everything is leased or just being committed... and
	// key 1 still loads.
	job, err := h.m.PrepareLoad(h.ctx, reader, keys(1))
	require.NoError(t, err)
	require.NoError(t, h.m.JobDone(h.ctx, job.ID, 0, true))
	h.lookupUntilSettled(&messages.ReqContext{RequestID: "probe"}, keys(5))
	require.NoError(t, h.m.RequestFinished(h.ctx, &messages.ReqContext{RequestID: "probe"}))
	h.quiet()
}

func TestFullWhenEverythingIsLeased(t *testing.T) { eachMode(t, testFullWhenEverythingIsLeased) }

func testFullWhenEverythingIsLeased(t *testing.T, m mode) {
	h := openMode(t, m, 2)
	_, reader := h.storeAndLookup([]int{1, 2}, 1, 2)
	_, err := h.m.PrepareStore(h.ctx, &messages.ReqContext{RequestID: "w2"}, keys(3))
	require.ErrorIs(t, err, messages.ErrFull)
	require.Equal(t, uint64(1), h.stats().Full)

	require.NoError(t, h.m.RequestFinished(h.ctx, reader))
	plan, err := h.m.PrepareStore(h.ctx, &messages.ReqContext{RequestID: "w2"}, keys(3))
	require.NoError(t, err, "leases released by RequestFinished make room")
	require.Len(t, plan.Evicted, 1)
	require.NoError(t, h.m.JobDone(h.ctx, plan.Job, 0, true))
}

func TestLeaseExpiresOnTheInjectedClock(t *testing.T) {
	eachMode(t, testLeaseExpiresOnTheInjectedClock)
}

func testLeaseExpiresOnTheInjectedClock(t *testing.T, m mode) {
	h := openMode(t, m, 2, func(c *config.Config) { c.LeaseTTL = time.Second })
	h.storeAndLookup([]int{1, 2}, 1, 2)
	h.clock.Advance(time.Second)
	s := h.stats()
	require.Zero(t, s.Leased)
	require.Equal(t, uint64(2), s.LeasesExpired)
}

func TestBadInputGetsTypedErrors(t *testing.T) { eachMode(t, testBadInputGetsTypedErrors) }

func testBadInputGetsTypedErrors(t *testing.T, m mode) {
	h := openMode(t, m, 4)
	req := &messages.ReqContext{RequestID: "r"}

	_, err := h.m.PrepareLoad(h.ctx, req, keys(42))
	require.ErrorIs(t, err, messages.ErrUnknownKey)
	require.ErrorIs(t, h.m.CompleteLoad(h.ctx, req, keys(42)), messages.ErrNotLoading)
	require.ErrorIs(t, h.m.CompleteStore(h.ctx, req, keys(42), true), messages.ErrNotPending)
	require.ErrorIs(t, h.m.JobDone(h.ctx, 999, 0, true), messages.ErrUnknownJob)
	_, err = h.m.Lookup(h.ctx, req, []messages.Key{{Namespace: testNS}}, false)
	require.ErrorIs(t, err, messages.ErrBadKey)

	// PrepareLoad is all-or-nothing: one unknown key pins nothing.
	h.store(&messages.ReqContext{RequestID: "w"}, 1)
	h.lookupUntilSettled(req, keys(1))
	_, err = h.m.PrepareLoad(h.ctx, req, keys(1, 42))
	require.ErrorIs(t, err, messages.ErrUnknownKey)
	require.Zero(t, h.stats().Pinned)

	// Double CompleteStore.
	plan, err := h.m.PrepareStore(h.ctx, req, keys(7))
	require.NoError(t, err)
	require.NoError(t, h.m.CompleteStore(h.ctx, req, keys(7), true))
	require.ErrorIs(t, h.m.CompleteStore(h.ctx, req, keys(7), true), messages.ErrNotPending)
	require.ErrorIs(t, h.m.JobDone(h.ctx, plan.Job, 0, true), messages.ErrUnknownJob, "job ended by CompleteStore")
	require.ErrorIs(t, h.m.JobDone(h.ctx, plan.Job, 5, true), messages.ErrUnknownJob)

	st := h.lookup(req, keys(7), false)
	require.Equal(t, messages.Hit, st[0], "CompleteStore answers once the block is readable")
	require.Equal(t, uint64(3), h.stats().LateReports)
	h.quiet(req)
}

func TestBadConfig(t *testing.T) {
	for name, cfg := range map[string]config.Config{
		"zero pool":      {PoolBytes: -1},
		"negative block": {BlockBytes: -4096},
		"pool < block":   {PoolBytes: 100, BlockBytes: 4096},
		"bad policy":     {Policy: "fifo"},
		"workers":        {JobWorkers: -2},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Open(context.Background(), cfg)
			require.ErrorIs(t, err, messages.ErrBadConfig)
		})
	}
}

func TestWorkerReportsCompleteAJob(t *testing.T) { eachMode(t, testWorkerReportsCompleteAJob) }

func testWorkerReportsCompleteAJob(t *testing.T, m mode) {
	h := openMode(t, m, 4, func(c *config.Config) { c.JobWorkers = 3 })
	req := &messages.ReqContext{RequestID: "w"}
	plan, err := h.m.PrepareStore(h.ctx, req, keys(1))
	require.NoError(t, err)
	require.Equal(t, 3, plan.Workers)
	require.NoError(t, h.m.JobDone(h.ctx, plan.Job, 0, true))
	require.ErrorIs(t, h.m.JobDone(h.ctx, plan.Job, 0, true), messages.ErrBadWorker, "duplicate report")
	require.ErrorIs(t, h.m.JobDone(h.ctx, plan.Job, 3, true), messages.ErrBadWorker, "out of range")
	require.NoError(t, h.m.JobDone(h.ctx, plan.Job, 1, false))
	require.True(t, h.pending(), "one worker still owes a report")
	require.NoError(t, h.m.JobDone(h.ctx, plan.Job, 2, true))

	// One worker failed: the store is not readable and its slot is free.
	st := h.lookupUntilSettled(&messages.ReqContext{RequestID: "r"}, keys(1))
	require.Equal(t, messages.Miss, st[0])
	s := h.stats()
	require.Equal(t, uint64(1), s.StoresFailed)
	require.Equal(t, 4, s.Free)
}

func TestStalledJobsAreReapedAtTheirDeadline(t *testing.T) {
	eachMode(t, testStalledJobsAreReapedAtTheirDeadline)
}

func testStalledJobsAreReapedAtTheirDeadline(t *testing.T, m mode) {
	const deadline = 300 * time.Second
	h := openMode(t, m, 4)
	writer, reader := h.storeAndLookup([]int{1}, 1)
	load, err := h.m.PrepareLoad(h.ctx, reader, keys(1))
	require.NoError(t, err)
	store, err := h.m.PrepareStore(h.ctx, writer, keys(2))
	require.NoError(t, err)
	require.Equal(t, 2, h.clock.Pending(), "one armed timer per job")

	h.clock.Advance(deadline - time.Nanosecond)
	s := h.stats()
	require.Equal(t, 2, s.JobsInFlight, "nothing reaped before the deadline")

	h.clock.Advance(time.Nanosecond)
	s = h.stats()
	require.Zero(t, s.JobsInFlight)
	require.Equal(t, uint64(1), s.JobsReapedLoad)
	require.Equal(t, uint64(1), s.JobsReapedStore)
	require.Zero(t, s.Pinned, "reaped load released its pin")
	require.Zero(t, s.WritePending, "reaped store freed its slot")
	st := h.lookup(&messages.ReqContext{RequestID: "p"}, keys(2), false)
	require.Equal(t, messages.Miss, st[0], "a reaped store is never readable")

	// Reports after reaping are counted and dropped.
	require.ErrorIs(t, h.m.JobDone(h.ctx, load.ID, 0, true), messages.ErrUnknownJob)
	require.ErrorIs(t, h.m.JobDone(h.ctx, store.Job, 0, true), messages.ErrUnknownJob)
	require.Equal(t, uint64(2), h.stats().LateReports)
	require.Zero(t, h.clock.Pending(), "no timer left armed")
}

func TestCompletedJobDisarmsItsTimer(t *testing.T) { eachMode(t, testCompletedJobDisarmsItsTimer) }

func testCompletedJobDisarmsItsTimer(t *testing.T, m mode) {
	h := openMode(t, m, 4)
	h.store(&messages.ReqContext{RequestID: "w"}, 1)
	require.Zero(t, h.clock.Pending())
	h.clock.Advance(time.Hour)
	require.Zero(t, h.stats().JobsReapedStore)
}

func TestPauseStopsIntakeAndResumeRestoresIt(t *testing.T) {
	eachMode(t, testPauseStopsIntakeAndResumeRestoresIt)
}

func testPauseStopsIntakeAndResumeRestoresIt(t *testing.T, m mode) {
	h := openMode(t, m, 4)
	_, req := h.storeAndLookup([]int{1}, 1)
	require.NoError(t, h.m.RequestFinished(h.ctx, req))

	require.NoError(t, h.m.Pause(h.ctx, false))
	st := h.lookup(req, keys(1), false)
	require.Equal(t, messages.Miss, st[0])
	_, err := h.m.PrepareStore(h.ctx, req, keys(2))
	require.ErrorIs(t, err, messages.ErrPaused)
	require.True(t, h.stats().Paused)

	require.NoError(t, h.m.Resume(h.ctx))
	st = h.lookup(req, keys(1), false)
	require.Equal(t, messages.Hit, st[0], "pause without clearCache keeps the blocks")
	require.NoError(t, h.m.RequestFinished(h.ctx, req))
}

func TestPauseWaitsForJobsThenClears(t *testing.T) { eachMode(t, testPauseWaitsForJobsThenClears) }

func testPauseWaitsForJobsThenClears(t *testing.T, m mode) {
	h := openMode(t, m, 4)
	writer := h.storeAs("w", 1)
	plan, err := h.m.PrepareStore(h.ctx, writer, keys(2))
	require.NoError(t, err)

	paused := make(chan error, 1)
	go func() { paused <- h.m.Pause(h.ctx, true) }()
	require.NoError(t, h.m.JobDone(h.ctx, plan.Job, 0, true))
	require.NoError(t, <-paused)
	s := h.stats()
	require.Equal(t, 4, s.Free, "clearCache emptied the primary tier")
	events, err := h.m.TakeEvents(h.ctx)
	require.NoError(t, err)
	require.Equal(t, messages.AllBlocksCleared, events[len(events)-1].Kind)
}

func TestResetCacheReapsStragglersAtItsDeadline(t *testing.T) {
	eachMode(t, testResetCacheReapsStragglersAtItsDeadline)
}

func testResetCacheReapsStragglersAtItsDeadline(t *testing.T, m mode) {
	h := openMode(t, m, 4)
	writer := h.storeAs("w", 1)
	_, err := h.m.PrepareStore(h.ctx, writer, keys(2))
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(h.ctx, 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- h.m.ResetCache(ctx) }()
	// The drain deadline is on the node's (manual) clock: advancing it past
	// the drain bound reaps the stalled store, then the tier clears.
	for h.clock.Pending() < 2 {
		require.NoError(t, ctx.Err())
	}
	h.clock.Advance(20 * time.Second)
	require.NoError(t, <-done)
	s := h.stats()
	require.Equal(t, 4, s.Free)
	require.Equal(t, uint64(1), s.JobsReapedStore)
}

func TestBridgeRestartReleasesEngineState(t *testing.T) {
	eachMode(t, testBridgeRestartReleasesEngineState)
}

func testBridgeRestartReleasesEngineState(t *testing.T, m mode) {
	h := openMode(t, m, 4)
	writer, reader := h.storeAndLookup([]int{1}, 1)
	plan, err := h.m.PrepareStore(h.ctx, writer, keys(2))
	require.NoError(t, err)

	h.node.system.Root.Send(h.node.bridge, &supervision.InjectPanic{Reason: "test"})
	s := h.stats()
	require.Equal(t, uint64(1), s.ActorRestarts)
	require.Zero(t, s.Leased, "a restarted bridge drops engine leases")
	require.Equal(t, 1, s.WritePending, "its writes' slots stay out of use: the engine may still be copying into them")
	require.Zero(t, s.JobsInFlight)
	require.ErrorIs(t, h.m.JobDone(h.ctx, plan.Job, 0, true), messages.ErrUnknownJob, "and they never commit")
	// Once no copy can still be running (the job deadline), they are freed.
	h.clock.Advance(config.DefaultEngineJobTimeout)
	for h.stats().WritePending != 0 {
		require.NoError(t, h.ctx.Err())
	}
	st := h.lookup(reader, keys(1, 2), false)
	require.Equal(t, []messages.LookupStatus{messages.Hit, messages.Miss}, st, "ready blocks survive")
	h.quiet(reader)
}

func TestCPUTierRestartKeepsItsSlotTable(t *testing.T) {
	eachMode(t, testCPUTierRestartKeepsItsSlotTable)
}

func testCPUTierRestartKeepsItsSlotTable(t *testing.T, m mode) {
	h := openMode(t, m, 4)
	_, reader := h.storeAndLookup([]int{1, 2}, 1)

	h.node.system.Root.Send(h.cpuPID(), &supervision.InjectPanic{Reason: "test"})
	s := h.stats()
	require.Equal(t, uint64(1), s.ActorRestarts)
	require.Equal(t, 2, s.Ready)
	require.Equal(t, 1, s.Leased, "leases survive a CPU tier restart")
	job, err := h.m.PrepareLoad(h.ctx, reader, keys(1))
	require.NoError(t, err, "a leased HIT still loads after the restart")
	require.NoError(t, h.m.JobDone(h.ctx, job.ID, 0, true))
	h.quiet()
}

func (h *harness) cpuPID() *actor.PID {
	return actor.NewPID(h.node.system.Address(), "kvtier/cpu")
}

// Embedded only: a closed daemon cannot answer, so a standalone caller
// learns it from its own deadline (tests/standalone_test.go).
func TestCloseIsIdempotentAndRefusesCalls(t *testing.T) {
	testCloseIsIdempotentAndRefusesCalls(t, embeddedMode)
}

func testCloseIsIdempotentAndRefusesCalls(t *testing.T, m mode) {
	h := openMode(t, m, 4)
	require.NoError(t, h.node.Close(h.ctx))
	_, err := h.m.Lookup(h.ctx, &messages.ReqContext{RequestID: "r"}, keys(1), false)
	require.True(t, errors.Is(err, messages.ErrClosed))
}

// sameCtx asserts an event carries want's request context: the very value
// in process; through the socket, a copy with the same content (the
// engine's request id, without the endpoint's session prefix).
func (h *harness) sameCtx(want, got *messages.ReqContext, msg string) {
	h.t.Helper()
	if h.mode == embeddedMode {
		require.Same(h.t, want, got, msg)
		return
	}
	require.NotNil(h.t, got, msg)
	require.Equal(h.t, *want, *got, msg)
}

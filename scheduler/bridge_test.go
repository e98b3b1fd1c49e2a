package scheduler

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The bridge's job registry is plain data: the registry tests drive it with
// no actor. The actor tests at the end spawn a bridge against a scripted CPU
// tier.

func k(i int) messages.Key {
	return messages.Key{Namespace: "ns", Hash: string(rune('a' + i))}
}

type stopCount struct{ n *int }

func (s stopCount) Stop() bool { *s.n++; return true }

func newJob(id messages.JobID, kind messages.JobKind, req string, keys ...messages.Key) *job {
	j := &job{id: id, kind: kind, req: &messages.ReqContext{RequestID: req}, keys: keys,
		open: make([]bool, len(keys)), slots: make([]int, len(keys)), nOpen: len(keys)}
	for i := range keys {
		j.open[i], j.slots[i] = true, i
	}
	j.indexKeys()
	return j
}

func TestRegistryClaimsEachKeyOnceFromTheJobThatOwnsIt(t *testing.T) {
	type call struct {
		req  string
		kind messages.JobKind
		keys []messages.Key
		ok   bool
	}
	cases := []struct {
		name  string
		calls []call
		open  map[messages.JobID]int // keys still open per job afterwards
	}{
		{"one job, all keys", []call{{"r", messages.JobStore, []messages.Key{k(0), k(1)}, true}},
			map[messages.JobID]int{1: 0, 2: 1}},
		{"one job, all keys, out of order", []call{{"r", messages.JobStore, []messages.Key{k(1), k(0)}, true}},
			map[messages.JobID]int{1: 0, 2: 1}},
		{"a whole job's keys after one of them was claimed", []call{
			{"r", messages.JobStore, []messages.Key{k(0)}, true},
			{"r", messages.JobStore, []messages.Key{k(0), k(1)}, false}},
			map[messages.JobID]int{1: 1, 2: 1}},
		{"keys of two jobs of one request", []call{{"r", messages.JobStore, []messages.Key{k(0), k(2)}, true}},
			map[messages.JobID]int{1: 1, 2: 0}},
		{"a second completion of the same key is refused", []call{
			{"r", messages.JobStore, []messages.Key{k(0)}, true},
			{"r", messages.JobStore, []messages.Key{k(0)}, false}},
			map[messages.JobID]int{1: 1, 2: 1}},
		{"all or nothing: one unowned key claims nothing", []call{{"r", messages.JobStore, []messages.Key{k(0), k(9)}, false}},
			map[messages.JobID]int{1: 2, 2: 1}},
		{"a key twice in one call is refused", []call{{"r", messages.JobStore, []messages.Key{k(0), k(0)}, false}},
			map[messages.JobID]int{1: 2, 2: 1}},
		{"another request's keys are not ours", []call{{"other", messages.JobStore, []messages.Key{k(0)}, false}},
			map[messages.JobID]int{1: 2, 2: 1}},
		{"a load completion does not end a store", []call{{"r", messages.JobLoad, []messages.Key{k(0)}, false}},
			map[messages.JobID]int{1: 2, 2: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRegistry()
			j1, j2 := newJob(1, messages.JobStore, "r", k(0), k(1)), newJob(2, messages.JobStore, "r", k(2))
			r.add(j1)
			r.add(j2)
			for i, cl := range c.calls {
				byJob, missing, ok := r.claim(cl.req, cl.kind, cl.keys)
				require.Equal(t, cl.ok, ok, "call %d", i)
				if !ok {
					assert.Nil(t, byJob)
					assert.Contains(t, cl.keys, missing, "the refusal names a key of the call")
					continue
				}
				n := 0
				for _, c := range byJob {
					n += len(c.at)
				}
				assert.Equal(t, len(cl.keys), n, "every key claimed exactly once")
			}
			assert.Equal(t, c.open[1], j1.nOpen)
			assert.Equal(t, c.open[2], j2.nOpen)
			assert.Equal(t, c.open[1], len(j1.openPlaces()))
			assert.Equal(t, c.open[2], len(j2.openPlaces()))
		})
	}
}

// A job finds its keys by place, scanning a small job and through its
// index a large one; a key a job names twice is claimed once, closing both
// its places.
func TestRegistryClaimsKeysOfLargeJobsAndKeysNamedTwice(t *testing.T) {
	keys := make([]messages.Key, 3*smallJob)
	for i := range keys {
		keys[i] = messages.Key{Namespace: "ns", Hash: string(rune(0x100 + i))}
	}
	r := newRegistry()
	big := newJob(1, messages.JobStore, "r", keys...)
	twice := newJob(2, messages.JobStore, "r", k(0), k(1), k(0))
	r.add(big)
	r.add(twice)
	require.NotNil(t, big.index, "a large job has an index")
	require.True(t, twice.dups)

	byJob, _, ok := r.claim("r", messages.JobStore, []messages.Key{keys[40], keys[3]})
	require.True(t, ok)
	require.Equal(t, []claimed{{big, []int{40, 3}}}, byJob, "each key at its own place")
	assert.Equal(t, []messages.Key{keys[40], keys[3]}, byJob[0].keys())
	assert.Equal(t, len(keys)-2, big.nOpen)
	_, missing, ok := r.claim("r", messages.JobStore, []messages.Key{keys[7], keys[40]})
	require.False(t, ok, "a key claimed before is no longer the job's")
	assert.Equal(t, keys[40], missing)
	assert.Equal(t, len(keys)-2, big.nOpen, "a refused claim takes nothing")

	_, _, ok = r.claim("r", messages.JobStore, []messages.Key{k(0), k(1), k(0)})
	require.False(t, ok, "a key twice in one completion is refused, whole job or not")
	byJob, _, ok = r.claim("r", messages.JobStore, []messages.Key{k(0)})
	require.True(t, ok)
	assert.Equal(t, []claimed{{twice, []int{0}}}, byJob)
	assert.Equal(t, 1, twice.nOpen, "both places of the key closed")
	assert.Equal(t, []int{1}, twice.openPlaces())
	_, _, ok = r.claim("r", messages.JobStore, []messages.Key{k(0)})
	require.False(t, ok)
}

func TestRegistryRemoveForgetsTheJobAndStopsItsTimer(t *testing.T) {
	r := newRegistry()
	stops := 0
	j := newJob(7, messages.JobLoad, "r", k(0))
	j.timer = stopCount{&stops}
	r.add(j)
	other := newJob(8, messages.JobLoad, "r", k(1))
	r.add(other)
	r.remove(j)
	assert.Equal(t, 1, stops, "a removed job's deadline is disarmed")
	assert.NotContains(t, r.jobs, messages.JobID(7))
	_, _, ok := r.claim("r", messages.JobLoad, []messages.Key{k(0)})
	assert.False(t, ok, "a removed job's keys cannot be completed (a late report)")
	r.remove(other)
	assert.Empty(t, r.byReq, "a request with no job left holds nothing")
}

func TestJobPlacedOrdersKeysByTheirPlaceInTheCall(t *testing.T) {
	j := newJob(1, messages.JobStore, "r", k(0), k(1), k(2))
	j.place = []messages.Placement{{Index: 2}, {Index: 0}, {Index: 1, Parent: "x"}}
	keys, slots, place := j.placed([]int{0, 1, 2})
	assert.Equal(t, []messages.Key{k(1), k(2), k(0)}, keys, "parents before children")
	assert.Equal(t, []int{1, 2, 0}, slots, "each key with its own slot")
	assert.Equal(t, []int{0, 1, 2}, []int{place[0].Index, place[1].Index, place[2].Index})
	assert.Equal(t, "x", place[1].Parent)
}

// wrongTypeCPU answers the first LookupAndLease with an Ack (a protocol bug
// in the tier) and every later one with its proper LookupResult: all HITs.
type wrongTypeCPU struct{ lookups int }

func (c *wrongTypeCPU) Receive(ctx actor.Context) {
	m, ok := ctx.Message().(*cpumsg.LookupAndLease)
	if !ok {
		return
	}
	c.lookups++
	if c.lookups == 1 {
		ctx.Respond(&messages.Ack{Corr: m.Corr})
		return
	}
	status := make([]messages.LookupStatus, len(m.Keys))
	for i := range status {
		status[i] = messages.Hit
	}
	ctx.Respond(&cpumsg.LookupResult{Corr: m.Corr, Status: status})
}

// A CPU-tier answer of the wrong type fails that one engine call with
// ErrInternal (a panic would answer ErrRestarted instead); the call is not
// left unanswered, and the next call is served.
func TestBridgeFailsACallWhoseAnswerHasTheWrongTypeAndKeepsServing(t *testing.T) {
	system := actor.NewActorSystem()
	defer system.Shutdown()
	cpu := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &wrongTypeCPU{} }))
	var seq atomic.Uint64
	bridge := system.Root.Spawn(Props(Config{CPU: fx.RefOf(cpu), Clock: supervision.RealClock{}, LeaseTTL: time.Second,
		Workers: 1, LoadTimeout: time.Second, StoreTimeout: time.Second, JobSeq: &seq,
		Counters: &Counters{}})) // a zero Log is disabled

	lookup := func() messages.Result[[]messages.LookupStatus] {
		reply := messages.NewReply[[]messages.LookupStatus]()
		system.Root.Send(bridge, &messages.Lookup{Req: &messages.ReqContext{RequestID: "r"}, Keys: []messages.Key{k(0)}, Reply: reply})
		select {
		case r := <-reply.C():
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("the bridge never answered the Lookup")
			return messages.Result[[]messages.LookupStatus]{}
		}
	}
	first := lookup()
	require.ErrorIs(t, first.Err, messages.ErrInternal)
	second := lookup()
	require.NoError(t, second.Err)
	require.Equal(t, []messages.LookupStatus{messages.Hit}, second.Value)
}

// pinningCPU answers LeaseToPin with a slot per key and records the unpins
// it gets, in the order it gets them.
type pinningCPU struct {
	log chan string
}

func (c *pinningCPU) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *cpumsg.LeaseToPin:
		c.log <- "pin"
		ctx.Respond(&cpumsg.PinResult{Corr: m.Corr, Job: m.Job, Slots: make([]int, len(m.Keys))})
	case *cpumsg.UnpinKeys:
		c.log <- "unpin"
		ctx.Respond(&messages.Ack{Corr: m.Corr})
	}
}

// An engine that does not wait for prepare_load's answer sends its
// complete_load right behind it (the vLLM connector does): the completion
// finds the load job although the CPU tier has not answered the pin yet,
// and the unpin reaches the tier after the pin. (The job used to be
// registered at the answer: the completion was refused NOT_LOADING and the
// pins stayed until the job's deadline.)
func TestCompleteLoadRightBehindPrepareLoadFindsItsJob(t *testing.T) {
	system := actor.NewActorSystem()
	defer system.Shutdown()
	cpu := &pinningCPU{log: make(chan string, 4)}
	cpuPID := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return cpu }))
	var seq atomic.Uint64
	counters := &Counters{}
	bridge := system.Root.Spawn(Props(Config{CPU: fx.RefOf(cpuPID), Clock: supervision.RealClock{}, LeaseTTL: time.Second,
		Workers: 1, LoadTimeout: time.Minute, StoreTimeout: time.Minute, JobSeq: &seq, Counters: counters}))

	req := &messages.ReqContext{RequestID: "r"}
	load, done := messages.NewReply[messages.LoadJob](), messages.NewReply[struct{}]()
	system.Root.Send(bridge, &messages.PrepareLoad{Req: req, Keys: []messages.Key{k(0), k(1)}, Reply: load})
	system.Root.Send(bridge, &messages.CompleteLoad{Req: req, Keys: []messages.Key{k(0), k(1)}, Reply: done})
	for _, r := range []<-chan messages.Result[struct{}]{done.C()} {
		select {
		case res := <-r:
			require.NoError(t, res.Err, "the completion found its job")
		case <-time.After(10 * time.Second):
			t.Fatal("complete_load never answered")
		}
	}
	select {
	case res := <-load.C():
		require.NoError(t, res.Err)
	case <-time.After(10 * time.Second):
		t.Fatal("prepare_load never answered")
	}
	for _, want := range []string{"pin", "unpin"} {
		select {
		case got := <-cpu.log:
			require.Equal(t, want, got)
		case <-time.After(10 * time.Second):
			t.Fatalf("the CPU tier never got the %s", want)
		}
	}
	pending := messages.NewReply[bool]()
	system.Root.Send(bridge, &messages.HasPendingWork{Reply: pending})
	require.False(t, (<-pending.C()).Value, "the job is gone: nothing waits for its deadline")
}

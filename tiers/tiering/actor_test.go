package tiering

import (
	"context"
	"hash/crc32"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/cpu"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
	"github.com/kvtier/kvtier/tiers/tiering/tieringmsg"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// stalledTier is a tier whose device hangs: it says it has every key, and
// holds every read until the test releases it (a hung disk or endpoint).
type stalledTier struct {
	reads       chan heldRead
	lookups     bool // answer lookups (false: hang on them too)
	unavailable bool // answer lookups with ErrTierUnavailable (an unhealthy tier)
}

type heldRead struct {
	sender *actor.PID
	m      *tiermsg.Read
}

func (s *stalledTier) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *tiermsg.Lookup:
		if s.unavailable {
			ctx.Respond(&tiermsg.LookupResult{Corr: m.Corr, Found: make([]bool, len(m.Keys)), Err: messages.ErrTierUnavailable})
			return
		}
		if s.lookups {
			found := make([]bool, len(m.Keys))
			for i := range found {
				found[i] = true
			}
			ctx.Respond(&tiermsg.LookupResult{Corr: m.Corr, Found: found})
		}
	case *tiermsg.Read:
		s.reads <- heldRead{sender: ctx.Sender(), m: m}
	}
}

type rig struct {
	t       *testing.T
	ctx     context.Context
	system  *actor.ActorSystem
	tiering *actor.PID
	cpu     *actor.PID
	clock   *supervision.ManualClock
	reads   chan heldRead
}

func newRig(t *testing.T, answerLookups bool, tweak ...func(*stalledTier)) *rig {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	pool, err := cpu.OpenPool("", 4, 64)
	require.NoError(t, err)
	clock := supervision.NewManualClock(time.Unix(1_700_000_000, 0))
	state, err := cpu.NewState(4, "lru", clock.Now)
	require.NoError(t, err)
	system := actors.NewSystem(zerolog.Nop())
	reads := make(chan heldRead, 16)
	cpuPID := actor.NewPID(system.Address(), "g/cpu")
	tierPID := actor.NewPID(system.Address(), "g/slow")
	children := []actors.Child{
		{Name: "cpu", Props: cpu.Props(state, pool, clock.Now, zerolog.Nop())},
		{Name: "slow", Props: actor.PropsFromProducer(func() actor.Actor {
			tier := &stalledTier{reads: reads, lookups: answerLookups}
			for _, f := range tweak {
				f(tier)
			}
			return tier
		})},
		{Name: "tiering", Props: Props(Config{CPU: fx.RefOf(cpuPID), Tiers: []Tier{{Name: "slow", Kind: "obj", Ref: fx.RefOf(tierPID)}},
			Slot: pool.Slot, Clock: clock, LookupDeadline: time.Second, PromotionTimeout: 5 * time.Second})},
	}
	spawned := make(chan map[string]*actor.PID, 1)
	var restarts = new(atomicCounter)
	g, err := system.Root.SpawnNamed(actors.GuardianProps(children, spawned, &restarts.Uint64, zerolog.Nop()), "g")
	require.NoError(t, err)
	pids := <-spawned
	t.Cleanup(func() {
		require.NoError(t, actors.StopAndWait(ctx, system, g))
		system.Shutdown()
		require.NoError(t, pool.Close())
		cancel()
	})
	return &rig{t: t, ctx: ctx, system: system, tiering: pids["tiering"], cpu: pids["cpu"], clock: clock, reads: reads}
}

func (r *rig) ask(pid *actor.PID, msg any) any {
	r.t.Helper()
	res, err := actors.Ask(r.ctx, r.system, pid, msg)
	require.NoError(r.t, err)
	return res
}

func (r *rig) lookup(keys ...messages.Key) []messages.LookupStatus {
	r.t.Helper()
	return r.ask(r.tiering, &tieringmsg.AsyncLookup{Corr: 1, Req: &messages.ReqContext{RequestID: "r"}, Keys: keys}).(*tieringmsg.AsyncLookupResult).Status
}

func (r *rig) cpuStats() messages.Stats {
	r.t.Helper()
	return r.ask(r.cpu, &cpumsg.TierStats{Corr: 1}).(*cpumsg.TierStatsResult).Stats
}

func (r *rig) idle() {
	r.t.Helper()
	reply := messages.NewReply[struct{}]()
	r.system.Root.Send(r.tiering, &tieringmsg.Idle{Reply: reply})
	select {
	case <-reply.C():
	case <-r.ctx.Done():
		r.t.Fatal("tiering never became idle")
	}
}

func k(i byte) messages.Key { return messages.Key{Namespace: "ab", Hash: string([]byte{i})} }

// A tier that never answers a lookup cannot hold the engine: RETRY until the
// deadline, MISS from then on, and nothing is left in flight.
func TestLookupDeadlineTurnsRetryIntoMiss(t *testing.T) {
	r := newRig(t, false)
	require.Equal(t, []messages.LookupStatus{messages.Retry}, r.lookup(k(1)))
	require.Equal(t, []messages.LookupStatus{messages.Retry}, r.lookup(k(1)), "still in flight")
	r.clock.Advance(time.Second)
	require.Equal(t, []messages.LookupStatus{messages.Miss}, r.lookup(k(1)), "deadline passed")
	r.idle()
}

// An unhealthy tier answers at once with an error: that must not become
// RETRY on every engine step (a livelock the deadline never ends, since the
// answer is never late). The key is a MISS from the next lookup on, with
// the clock never moved.
func TestUnavailableTierIsAMissNotRetryForever(t *testing.T) {
	r := newRig(t, true, func(s *stalledTier) { s.unavailable = true })
	first := r.lookup(k(1))
	r.idle()
	require.Contains(t, []messages.LookupStatus{messages.Retry, messages.Miss}, first[0])
	for range 3 {
		require.Equal(t, []messages.LookupStatus{messages.Miss}, r.lookup(k(1)))
	}
	r.idle()
}

// A promotion whose read hangs is reaped at its deadline: the key answers
// MISS at once, but its reserved slot is freed only when the read returns
// (a worker may still be writing into it), and it never becomes readable.
func TestStalledPromotionIsReapedAndItsSlotFreedWhenTheReadReturns(t *testing.T) {
	r := newRig(t, true)
	require.Equal(t, []messages.LookupStatus{messages.Retry}, r.lookup(k(2)))
	held := <-r.reads
	require.Equal(t, 1, r.cpuStats().WritePending, "slot reserved for the promotion")
	r.clock.Advance(5 * time.Second)
	require.Equal(t, []messages.LookupStatus{messages.Miss}, r.lookup(k(2)), "reaped: a miss for the engine")
	require.Equal(t, 1, r.cpuStats().WritePending, "the read may still land in the slot: it stays reserved")
	r.system.Root.Send(held.sender, &tiermsg.ReadResult{Corr: held.m.Corr, Key: held.m.Key, Checksum: 0})
	r.idle()
	st := r.cpuStats()
	require.Zero(t, st.WritePending, "released once the read returned")
	require.Zero(t, st.Ready, "a reaped promotion is never readable")
}

// A read the tier refuses because its I/O queue is full is back-pressure,
// not absence: the slot is freed, the key is not remembered as absent, and
// the next lookup promotes it.
func TestBusyTierReadIsAskedAgainNotCachedAbsent(t *testing.T) {
	r := newRig(t, true)
	require.Equal(t, []messages.LookupStatus{messages.Retry}, r.lookup(k(3)))
	held := <-r.reads
	r.system.Root.Send(held.sender, &tiermsg.ReadResult{Corr: held.m.Corr, Key: held.m.Key, Err: messages.ErrTierBusy})
	r.idle()
	require.Zero(t, r.cpuStats().WritePending, "the refused read's slot is freed")
	require.Equal(t, []messages.LookupStatus{messages.Retry}, r.lookup(k(3)), "asked again, not a MISS")
	held = <-r.reads
	r.system.Root.Send(held.sender, &tiermsg.ReadResult{Corr: held.m.Corr, Key: held.m.Key,
		Checksum: crc32.Checksum(make([]byte, 64), crc32.MakeTable(crc32.Castagnoli))})
	r.idle()
	require.Equal(t, 1, r.cpuStats().Ready, "promoted on the second ask")
}

type atomicCounter struct{ atomic.Uint64 }

// A tier that may hold more now (a peer came up) is asked again: the
// absences cached from its answers go, the other tiers' stay.
func TestRefreshedTierForgetsItsCachedAbsencesOnly(t *testing.T) {
	clock := supervision.NewManualClock(time.Unix(1_700_000_000, 0))
	a := NewState(Config{Tiers: []Tier{{Name: "fs"}, {Name: "peers"}}, Clock: clock}.WithDefaults())
	until := clock.Now().Add(time.Minute)
	a.markAbsent(k(1), 0b11, until) // absent from both
	a.markAbsent(k(2), 0b10, until) // absent from the peers only
	a.refreshed("peers")
	require.Equal(t, uint64(0b01), a.negative[k(1)].absent.tiers, "still known absent from fs")
	_, cached := a.negative[k(2)]
	require.False(t, cached, "nothing left to know about k(2)")
	a.refreshed("no-such-tier")
	require.Len(t, a.negative, 1)
}

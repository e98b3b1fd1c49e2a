package tiering

import (
	"slices"
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
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// Scenario tests of the core's decisions, one flow each, with exact
// expectations of what it sends (model_test.go checks the invariants over
// random interleavings; these pin the choices themselves).

// core is a State with a recording world around it.
type core struct {
	t     *testing.T
	s     *State
	clock *supervision.ManualClock
	cpu   *actor.PID
	tiers []*actor.PID
	fxlog.Log
	out fx.Out // what the core decided, taken into the log
}

// newCore: tiers fs (per key) and peers (batched, never cascaded to).
func newCore(t *testing.T, tweak ...func(*Config)) *core {
	c := &core{t: t, clock: supervision.NewManualClock(time.Unix(1_700_000_000, 0)),
		cpu: actor.NewPID("core", "cpu"), tiers: []*actor.PID{actor.NewPID("core", "fs"), actor.NewPID("core", "peers")}}
	cfg := Config{CPU: fx.RefOf(c.cpu), Clock: c.clock, Log: zerolog.Nop(),
		Tiers: []Tier{{Name: "fs", Kind: "fs", Ref: fx.RefOf(c.tiers[0])},
			{Name: "peers", Kind: "p2p", Ref: fx.RefOf(c.tiers[1]), Batched: true, NoCascade: true}},
		Slot: func(i int) []byte { return make([]byte, 1+i) }}
	for _, f := range tweak {
		f(&cfg)
	}
	c.s = NewState(cfg.WithDefaults())
	return c
}

// handle hands the core msg and returns what it sent doing so.
func (c *core) handle(msg any) []fxlog.Sent {
	return c.Step(&c.out, func(o *fx.Out) { c.s.Handle(o, msg) })
}

// lookup asks about keys and returns the statuses answered at once.
func (c *core) lookup(req *messages.ReqContext, prefix bool, keys ...messages.Key) []messages.LookupStatus {
	c.t.Helper()
	c.handle(&tieringmsg.AsyncLookup{Corr: 9, Req: req, Keys: keys, Prefix: prefix})
	require.Len(c.t, c.Resp, 1)
	r := c.Resp[0].(*tieringmsg.AsyncLookupResult)
	require.Equal(c.t, uint64(9), r.Corr)
	return r.Status
}

// lookups returns the tier Lookups out holds, by tier index (nil: not asked).
func (c *core) lookups(out []fxlog.Sent) []*tiermsg.Lookup {
	got := make([]*tiermsg.Lookup, len(c.tiers))
	for _, s := range out {
		if m, ok := s.Msg.(*tiermsg.Lookup); ok {
			for i, p := range c.tiers {
				if p == s.To {
					got[i] = m
				}
			}
		}
	}
	return got
}

func found(m *tiermsg.Lookup, f ...bool) *tiermsg.LookupResult {
	return &tiermsg.LookupResult{Corr: m.Corr, Found: f}
}

func TestLookupPromotesEachKeyFromTheFirstTierThatHoldsIt(t *testing.T) {
	c := newCore(t)
	require.Equal(t, []messages.LookupStatus{messages.Retry, messages.Retry}, c.lookup(nil, false, k(1), k(2)))
	asked := c.lookups(c.Out)
	require.NotNil(t, asked[0])
	require.NotNil(t, asked[1])
	require.Empty(t, c.handle(found(asked[0], false, true)), "nothing promoted before every tier answered")
	out := c.handle(found(asked[1], true, true))

	reserves := fxlog.All[*cpumsg.ReserveSlots](out)
	require.Len(t, reserves, 2, "one promotion per source tier")
	require.Equal(t, []messages.Key{k(2)}, reserves[0].Keys, "k2 from fs, the first tier holding it")
	require.Equal(t, []messages.Key{k(1)}, reserves[1].Keys, "k1 only the peers hold")
	require.Equal(t, []messages.LookupStatus{messages.Retry}, c.lookup(nil, false, k(1)), "promoting: RETRY, no new lookup")
	require.Empty(t, fxlog.All[*tiermsg.Lookup](c.Out))
}

func TestPrefixLookupPromotesOnlyUpToTheFirstGap(t *testing.T) {
	c := newCore(t)
	st := c.lookup(nil, true, k(1), k(2), k(3))
	require.Equal(t, []messages.LookupStatus{messages.Retry, messages.Miss, messages.Miss}, st, "a prefix answers for its first key only")
	asked := c.lookups(c.Out)
	c.handle(found(asked[0], true, false, true))
	out := c.handle(found(asked[1], false, false, false))
	r := fxlog.One[*cpumsg.ReserveSlots](t, out, c.cpu)
	require.Equal(t, []messages.Key{k(1)}, r.Keys, "k3 lies beyond k2's gap: not worth a slot")

	// k2 is now known absent: a prefix scan stops there without asking.
	st = c.lookup(nil, true, k(2), k(3))
	require.Equal(t, messages.Miss, st[0])
	require.Empty(t, c.Out)
}

func TestAbsenceIsCachedForNegativeTTLPerTier(t *testing.T) {
	c := newCore(t, func(cfg *Config) { cfg.NegativeTTL = 10 * time.Second })
	c.lookup(nil, false, k(1))
	asked := c.lookups(c.Out)
	c.handle(found(asked[0], false))
	c.handle(found(asked[1], false))

	require.Equal(t, []messages.LookupStatus{messages.Miss}, c.lookup(nil, false, k(1)))
	require.Empty(t, c.Out, "a cached absence asks no tier")
	require.Equal(t, uint64(1), c.s.stats.NegativeHits)

	c.handle(&tieringmsg.TierRefreshed{Tier: "peers"})
	require.Equal(t, []messages.LookupStatus{messages.Retry}, c.lookup(nil, false, k(1)))
	asked = c.lookups(c.Out)
	require.Nil(t, asked[0], "fs's absence still holds")
	require.NotNil(t, asked[1], "a refreshed tier is asked again")
	c.handle(found(asked[1], false))

	c.clock.Advance(11 * time.Second)
	require.Equal(t, []messages.LookupStatus{messages.Retry}, c.lookup(nil, false, k(1)))
	asked = c.lookups(c.Out)
	require.NotNil(t, asked[0], "an expired absence asks again")
	require.NotNil(t, asked[1])
}

func TestTierFilterNamesTheTiersARequestMayLoadFrom(t *testing.T) {
	for _, tc := range []struct {
		filter []string
		want   messages.LookupStatus
		asked  []bool
	}{
		{nil, messages.Retry, []bool{true, true}},
		{[]string{"peers"}, messages.Retry, []bool{false, true}},
		{[]string{"fs"}, messages.Retry, []bool{true, false}},
		{[]string{"p2p"}, messages.Retry, []bool{false, true}}, // by kind too
		{[]string{"none"}, messages.Miss, []bool{false, false}},
	} {
		c := newCore(t)
		require.Equal(t, []messages.LookupStatus{tc.want}, c.lookup(&messages.ReqContext{TierFilter: tc.filter}, false, k(1)), "filter %v", tc.filter)
		asked := c.lookups(c.Out)
		for i, want := range tc.asked {
			require.Equal(t, want, asked[i] != nil, "filter %v: tier %d asked", tc.filter, i)
		}
	}
}

func TestLookupDeadlineResolvesWithTheAnswersInAndDropsLateOnes(t *testing.T) {
	c := newCore(t)
	c.lookup(nil, false, k(1), k(2))
	asked := c.lookups(c.Out)
	c.handle(found(asked[1], true, false))
	out := c.handle(c.Armed[0]) // the batch's deadline: fs never answered
	r := fxlog.One[*cpumsg.ReserveSlots](t, out, c.cpu)
	require.Equal(t, []messages.Key{k(1)}, r.Keys, "what the peers found is promoted")
	require.Equal(t, uint64(2), c.s.stats.LookupsTimedOut)
	require.Empty(t, c.handle(found(asked[0], true, true)), "fs's late answer is dropped")
	require.Empty(t, c.s.pending[asked[0].Corr], "its question was forgotten")
}

// promoteFromFS runs a lookup of keys that only fs holds up to the CPU
// tier's reservation of slots 0..n-1, and returns the reads sent.
func (c *core) promoteFromFS(keys ...messages.Key) (*cpumsg.ReserveSlots, []*tiermsg.Read) {
	c.t.Helper()
	c.lookup(nil, false, keys...)
	asked := c.lookups(c.Out)
	c.handle(&tiermsg.LookupResult{Corr: asked[0].Corr, Found: trues(len(keys))})
	r := fxlog.One[*cpumsg.ReserveSlots](c.t, c.handle(&tiermsg.LookupResult{Corr: asked[1].Corr, Found: make([]bool, len(keys))}), c.cpu)
	slots := make([]int, len(keys))
	for i := range slots {
		slots[i] = i
	}
	out := c.handle(&cpumsg.ReserveResult{Corr: r.Corr, ToStore: keys, Slots: slots})
	return r, fxlog.All[*tiermsg.Read](out)
}

func trues(n int) []bool { return slices.Repeat([]bool{true}, n) }

func TestPromotionCommitsTheVerifiedKeysThenReleasesTheRest(t *testing.T) {
	c := newCore(t)
	res, reads := c.promoteFromFS(k(1), k(2), k(3))
	require.Len(t, reads, 3)
	require.Empty(t, c.handle(&tiermsg.ReadResult{Corr: reads[0].Corr, Key: k(1), Checksum: 11}))
	out := c.handle(&tiermsg.ReadResult{Corr: reads[1].Corr, Key: k(2), Err: messages.ErrChecksum})
	del := fxlog.One[*tiermsg.Delete](t, out, c.tiers[0])
	require.Equal(t, k(2), del.Key, "a corrupt copy is deleted from its tier")
	out = c.handle(&tiermsg.ReadResult{Corr: reads[2].Corr, Key: k(3), Err: messages.ErrTierBusy})

	require.Len(t, out, 2)
	commit := out[0].Msg.(*cpumsg.CommitSlots)
	require.Equal(t, []messages.Key{k(1)}, commit.Keys)
	require.Equal(t, []uint32{11}, commit.Checksums)
	require.Equal(t, res.Job, commit.Job)
	release := out[1].Msg.(*cpumsg.ReleaseJob)
	require.Equal(t, res.Job, release.Job, "released after the commit: frees only the failed keys")

	require.Equal(t, uint64(1), c.s.stats.Promoted["fs"])
	require.Equal(t, uint64(1), c.s.stats.PromotionsFailed["fs"])
	require.Equal(t, uint64(1), c.s.stats.PromotionsBusy)
	require.Equal(t, []messages.LookupStatus{messages.Retry}, c.lookup(nil, false, k(3)), "back-pressure is not absence")
	require.Equal(t, []messages.LookupStatus{messages.Retry}, c.lookup(&messages.ReqContext{TierFilter: []string{"fs"}}, false, k(4)))
	require.Equal(t, []messages.LookupStatus{messages.Miss}, c.lookup(&messages.ReqContext{TierFilter: []string{"fs"}}, false, k(2)),
		"a failed copy is a miss for its tier")
}

func TestPromotionReadsWaitForTheirTiersBudgetInOrder(t *testing.T) {
	c := newCore(t)
	keys := make([]messages.Key, maxReadsPerTier+3)
	for i := range keys {
		keys[i] = messages.Key{Namespace: "ab", Hash: string(rune(1000 + i))}
	}
	_, reads := c.promoteFromFS(keys...)
	require.Len(t, reads, maxReadsPerTier, "reads beyond the budget wait")
	out := c.handle(&tiermsg.ReadResult{Corr: reads[5].Corr, Key: reads[5].Key})
	next := fxlog.One[*tiermsg.Read](t, out, c.tiers[0])
	require.Equal(t, keys[maxReadsPerTier], next.Key, "the oldest waiting read goes next")
}

// refusePromotion looks k(1) up, found on fs only, and has the CPU tier
// refuse its promotion with err; it returns what the core sent then.
func (c *core) refusePromotion(err error) []fxlog.Sent {
	c.lookup(nil, false, k(1))
	asked := c.lookups(c.Out)
	c.handle(found(asked[0], true))
	r := fxlog.One[*cpumsg.ReserveSlots](c.t, c.handle(found(asked[1], false)), c.cpu)
	return c.handle(&cpumsg.ReserveResult{Corr: r.Corr, Err: err})
}

func TestAFullCPUTierMakesThePromotedKeysMissForThatTier(t *testing.T) {
	c := newCore(t)
	require.Empty(t, c.refusePromotion(messages.ErrFull), "nothing reserved, nothing to release")
	require.Equal(t, uint64(1), c.s.stats.PromotionsFull)
	require.Equal(t, []messages.LookupStatus{messages.Miss}, c.lookup(&messages.ReqContext{TierFilter: []string{"fs"}}, false, k(1)),
		"no livelock on a full pool")
	require.Equal(t, []messages.LookupStatus{messages.Retry}, c.lookup(nil, false, k(1)))
	asked := c.lookups(c.Out)
	require.Nil(t, asked[0], "fs's copy waits for the mark to expire")
	require.NotNil(t, asked[1], "the other tier is still asked")
	c.handle(found(asked[1], false)) // peers: absent for NegativeTTL

	// No room is a busy step, not a missing block: fs is asked again after
	// NoRoomTTL, however long the peers' absence lasts (its own expiry).
	c.clock.Advance(DefaultNoRoomTTL - time.Millisecond)
	require.Equal(t, []messages.LookupStatus{messages.Miss}, c.lookup(nil, false, k(1)), "both marks hold")
	c.clock.Advance(2 * time.Millisecond)
	require.Equal(t, []messages.LookupStatus{messages.Retry}, c.lookup(nil, false, k(1)))
	asked = c.lookups(c.Out)
	require.NotNil(t, asked[0], "fs is asked again once no room has passed")
	require.Nil(t, asked[1], "the peers' absence keeps its NegativeTTL")
	r := fxlog.One[*cpumsg.ReserveSlots](t, c.handle(found(asked[0], true)), c.cpu)
	require.Equal(t, []messages.Key{k(1)}, r.Keys, "and its copy is promoted")
}

// A promotion refused for another reason than room (none today; the CPU
// tier answers only ErrFull) is an absence of NegativeTTL.
func TestAPromotionRefusedOtherwiseIsAnAbsence(t *testing.T) {
	c := newCore(t)
	c.refusePromotion(messages.ErrTierUnavailable)
	c.clock.Advance(DefaultNoRoomTTL + time.Millisecond)
	require.Equal(t, []messages.LookupStatus{messages.Miss}, c.lookup(&messages.ReqContext{TierFilter: []string{"fs"}}, false, k(1)))
	c.clock.Advance(DefaultNegativeTTL)
	require.Equal(t, []messages.LookupStatus{messages.Retry}, c.lookup(&messages.ReqContext{TierFilter: []string{"fs"}}, false, k(1)))
}

func TestAReapedPromotionReleasesOnlyOnceItsReadsReturn(t *testing.T) {
	c := newCore(t)
	res, reads := c.promoteFromFS(k(1), k(2))
	deadline, armed := fxlog.Armed[*promotionDeadline](&c.Log)
	require.True(t, armed)
	require.Equal(t, res.Job.ID, deadline.job)
	require.Empty(t, c.handle(deadline), "reads still write into the slots: no release")
	require.Equal(t, uint64(1), c.s.stats.PromotionsReaped)
	require.Zero(t, c.s.reading[0], "the reaped reads gave their budget back")
	require.Empty(t, c.handle(&tiermsg.ReadResult{Corr: reads[0].Corr, Key: k(1)}))
	out := c.handle(&tiermsg.ReadResult{Corr: reads[1].Corr, Key: k(2)})
	release := fxlog.One[*cpumsg.ReleaseJob](t, out, c.cpu)
	require.Equal(t, res.Job, release.Job)
	require.Empty(t, fxlog.All[*cpumsg.CommitSlots](out), "a reaped promotion commits nothing")
	require.Zero(t, c.s.reading[0])
}

func TestABatchedTierGetsOneReadAndAShortAnswerFailsTheRest(t *testing.T) {
	c := newCore(t)
	c.lookup(nil, false, k(1), k(2))
	asked := c.lookups(c.Out)
	c.handle(found(asked[0], false, false))
	r := fxlog.One[*cpumsg.ReserveSlots](t, c.handle(found(asked[1], true, true)), c.cpu)
	rb := fxlog.One[*tiermsg.ReadBatch](t, c.handle(&cpumsg.ReserveResult{Corr: r.Corr, ToStore: r.Keys, Slots: []int{3, 4}}), c.tiers[1])
	require.Equal(t, []int{3, 4}, rb.Slots)
	out := c.handle(&tiermsg.ReadBatchResult{Corr: rb.Corr, Checksums: []uint32{5}, Errs: []error{nil}})
	commit := fxlog.One[*cpumsg.CommitSlots](t, out, c.cpu)
	require.Equal(t, []messages.Key{k(1)}, commit.Keys)
	fxlog.One[*cpumsg.ReleaseJob](t, out, c.cpu)
	require.Equal(t, uint64(1), c.s.stats.PromotionsFailed["peers"], "the key the answer left out failed")
}

func TestCascadeShedsBeyondItsQueueAndPinsWithinItsBound(t *testing.T) {
	c := newCore(t, func(cfg *Config) { cfg.CascadeQueue, cfg.CascadeInFlight = 4, 2 })
	keys := []messages.Key{k(1), k(2), k(3), k(4), k(5), k(6)}
	out := c.handle(&tieringmsg.Cascade{Keys: keys, Checksums: []uint32{1, 2, 3, 4, 5, 6}})
	pin := fxlog.One[*cpumsg.LeaseToPin](t, out, c.cpu)
	require.Equal(t, keys[:2], pin.Keys, "one pin for what the in-flight bound allows")
	require.Equal(t, uint64(2), c.s.stats.CascadeDropped["fs"], "beyond the queue: shed")
	require.Zero(t, c.s.stats.CascadeDropped["peers"], "a NoCascade tier is never a target")

	out = c.handle(&cpumsg.PinResult{Corr: pin.Corr, Job: pin.Job, Slots: []int{7, 8}})
	writes := fxlog.All[*tiermsg.Write](out)
	require.Len(t, writes, 2)
	require.Equal(t, uint32(1), writes[0].Checksum)
	require.Empty(t, c.handle(&tiermsg.WriteResult{Corr: writes[0].Corr, Key: k(1)}))
	out = c.handle(&tiermsg.WriteResult{Corr: writes[1].Corr, Key: k(2), Err: messages.ErrTierFull})
	require.Len(t, out, 2)
	require.Equal(t, pin.Job, out[0].Msg.(*cpumsg.ReleaseJob).Job, "the pins go back once every write returned")
	require.Equal(t, keys[2:4], out[1].Msg.(*cpumsg.LeaseToPin).Keys, "then the next blocks waiting")
	require.Equal(t, uint64(1), c.s.stats.CascadeWritten["fs"])
	require.Equal(t, uint64(3), c.s.stats.CascadeDropped["fs"], "a full tier drops, it does not fail")
}

func TestCascadePinsKeyByKeyWhenOneWasEvicted(t *testing.T) {
	c := newCore(t)
	pin := fxlog.One[*cpumsg.LeaseToPin](t, c.handle(&tieringmsg.Cascade{Keys: []messages.Key{k(1), k(2)}, Checksums: []uint32{1, 2}}), c.cpu)
	out := c.handle(&cpumsg.PinResult{Corr: pin.Corr, Job: pin.Job, Err: messages.ErrUnknownKey})
	singles := fxlog.All[*cpumsg.LeaseToPin](out)
	require.Len(t, singles, 2, "an all-or-nothing pin failed: each key alone")
	require.Empty(t, c.handle(&cpumsg.PinResult{Corr: singles[0].Corr, Job: pin.Job, Err: messages.ErrUnknownKey}))
	out = c.handle(&cpumsg.PinResult{Corr: singles[1].Corr, Job: pin.Job, Slots: []int{2}})
	w := fxlog.One[*tiermsg.Write](t, out, c.tiers[0])
	require.Equal(t, k(2), w.Key)
	require.Equal(t, uint32(2), w.Checksum)
	require.Equal(t, uint64(1), c.s.stats.CascadeDropped["fs"])
}

func TestACascadeWriteClearsTheKeysAbsenceForItsTier(t *testing.T) {
	c := newCore(t)
	c.lookup(nil, false, k(1))
	asked := c.lookups(c.Out)
	c.handle(found(asked[0], false))
	c.handle(found(asked[1], false))
	pin := fxlog.One[*cpumsg.LeaseToPin](t, c.handle(&tieringmsg.Cascade{Keys: []messages.Key{k(1)}, Checksums: []uint32{1}}), c.cpu)
	w := fxlog.One[*tiermsg.Write](t, c.handle(&cpumsg.PinResult{Corr: pin.Corr, Job: pin.Job, Slots: []int{0}}), c.tiers[0])
	c.handle(&tiermsg.WriteResult{Corr: w.Corr, Key: k(1)})
	require.Equal(t, []messages.LookupStatus{messages.Retry}, c.lookup(&messages.ReqContext{TierFilter: []string{"fs"}}, false, k(1)),
		"fs holds it now: asked again before the absence expires")
}

func TestMalformedCascadeAndUnknownMessagesChangeNothing(t *testing.T) {
	c := newCore(t)
	require.Empty(t, c.handle(&tieringmsg.Cascade{Keys: []messages.Key{k(1), k(2)}, Checksums: []uint32{1}}))
	require.Empty(t, c.handle(&tieringmsg.Cascade{}))
	require.Empty(t, c.handle(struct{ x int }{1}))
	require.Empty(t, c.handle(&tiermsg.ReadResult{Corr: 77}), "an answer nothing asked for")
	require.False(t, c.s.busy())
}

func TestIdleIsAnsweredOnlyOnceNothingIsInFlight(t *testing.T) {
	c := newCore(t)
	c.lookup(nil, false, k(1))
	asked := c.lookups(c.Out)
	idle := messages.NewReply[struct{}]()
	c.handle(&tieringmsg.Idle{Reply: idle})
	require.Empty(t, idle.C(), "a lookup is in flight")
	c.handle(found(asked[0], false))
	require.Empty(t, idle.C())
	c.handle(found(asked[1], false))
	require.Len(t, idle.C(), 1, "answered as the last answer came in")
}

func TestStatsGatherEveryTiersOwn(t *testing.T) {
	c := newCore(t)
	reply := messages.NewReply[messages.TieringStats]()
	out := c.handle(&tieringmsg.GetStats{Reply: reply})
	queries := fxlog.All[*tiermsg.StatsQuery](out)
	require.Len(t, queries, 2)
	c.handle(&tiermsg.StatsReply{Corr: queries[1].Corr, Stats: messages.SecondaryStats{Name: "peers", Blocks: 3}})
	require.Empty(t, reply.C())
	c.handle(&tiermsg.StatsReply{Corr: queries[0].Corr, Stats: messages.SecondaryStats{Name: "fs", Blocks: 5}})
	got := <-reply.C()
	require.NoError(t, got.Err)
	require.Equal(t, []int{5, 3}, []int{got.Value.Tiers[0].Blocks, got.Value.Tiers[1].Blocks}, "in configured order")
}

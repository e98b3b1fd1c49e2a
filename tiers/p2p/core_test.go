package p2p

import (
	"errors"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer"
	"github.com/kvtier/kvtier/peer/peermsg"
	"github.com/kvtier/kvtier/supervision/fxlog"
	"github.com/kvtier/kvtier/tiers/tiering/tieringmsg"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// Scenario tests of the core's decisions, one flow each, with exact
// expectations of what it sends (model_test.go checks the invariants over
// random interleavings).

// core is a State with a recording world around it; the tiering actor
// asks it everything.
type core struct {
	t       *testing.T
	s       *State
	tiering *actor.PID
	fxlog.Log
	out Out // what the core decided, taken into the log
}

func newCore(t *testing.T) *core {
	c := &core{t: t, tiering: actor.NewPID("core", "tiering")}
	c.s = NewState(Config{Tiering: fx.RefOf(c.tiering), Log: zerolog.Nop()}.WithDefaults())
	return c
}

// handle hands the core msg, from the tiering actor, and returns what it
// sent doing so.
func (c *core) handle(msg any) []fxlog.Sent {
	sent := c.Step(&c.out.Out, func(*fx.Out) { c.s.Handle(&c.out, fx.RefOf(c.tiering), msg) })
	require.Empty(c.t, c.out.Watches, "a watcher without a directory")
	require.Empty(c.t, c.out.Unwatches, "a watcher without a directory")
	return sent
}

// up brings peer node's session up and returns its PID.
func (c *core) up(node string) *actor.PID {
	pid := actor.NewPID("core", "session-"+node)
	out := c.handle(&peer.Up{Node: node, Session: pid})
	require.Len(c.t, out, 1)
	require.Equal(c.t, &tieringmsg.TierRefreshed{Tier: DefaultName}, out[0].Msg, "absences cached for the peers are dropped")
	return pid
}

// asks maps each session asked in out to its peermsg.Lookup.
func asks(out []fxlog.Sent) map[*actor.PID]*peermsg.Lookup {
	got := map[*actor.PID]*peermsg.Lookup{}
	for _, s := range out {
		if m, ok := s.Msg.(*peermsg.Lookup); ok {
			got[s.To] = m
		}
	}
	return got
}

// answered returns the tier's answer to the tiering actor in out.
func answered[M any](t *testing.T, c *core, out []fxlog.Sent) M {
	t.Helper()
	var got []M
	for _, s := range out {
		if m, ok := s.Msg.(M); ok {
			require.Equal(t, c.tiering, s.To)
			got = append(got, m)
		}
	}
	require.Len(t, got, 1, "want one answer in %v", out)
	return got[0]
}

func releases(out []fxlog.Sent) map[*actor.PID][]uint64 {
	got := map[*actor.PID][]uint64{}
	for _, s := range out {
		if m, ok := s.Msg.(*peermsg.Release); ok {
			got[s.To] = append(got[s.To], m.Round)
		}
	}
	return got
}

func hits(l *peermsg.Lookup, node string, round uint64, h ...bool) *peermsg.LookupResult {
	sums := make([]uint32, len(h))
	for i := range sums {
		sums[i] = uint32(100 + i)
	}
	return &peermsg.LookupResult{Corr: l.Corr, Node: node, Round: round, Hits: h, Checksums: sums}
}

func TestWithoutPeersALookupIsAnsweredAtOnceAndReadsAndWritesAreRefused(t *testing.T) {
	c := newCore(t)
	c.handle(&tiermsg.Lookup{Corr: 1, Keys: []messages.Key{key(1)}})
	require.Equal(t, []any{&tiermsg.LookupResult{Corr: 1, Found: []bool{false}}}, c.Resp)
	c.handle(&tiermsg.Read{Corr: 2, Key: key(1)})
	require.ErrorIs(t, c.Resp[0].(*tiermsg.ReadResult).Err, messages.ErrTierUnavailable, "only batched reads")
	c.handle(&tiermsg.Write{Corr: 3, Key: key(1)})
	require.ErrorIs(t, c.Resp[0].(*tiermsg.WriteResult).Err, messages.ErrTierUnavailable, "never a cascade target")
	c.handle(&tiermsg.StatsQuery{Corr: 4})
	require.False(t, c.Resp[0].(*tiermsg.StatsReply).Stats.Healthy, "no peer: unhealthy")
}

func TestAKeyIsTakenFromTheFirstPeerThatHasItAndOtherHitsAreReleased(t *testing.T) {
	c := newCore(t)
	a, b := c.up("a"), c.up("b")
	out := c.handle(&tiermsg.Lookup{Corr: 7, Keys: []messages.Key{key(1), key(2)}})
	asked := asks(out)
	require.Len(t, asked, 2, "every ready peer is asked at once")

	require.Empty(t, c.handle(hits(asked[b], "b", 20, true, false)), "b has k1: held, the lookup still waits for a")
	out = c.handle(hits(asked[a], "a", 10, true, true))
	res := answered[*tiermsg.LookupResult](t, c, out)
	require.Equal(t, []bool{true, true}, res.Found)
	require.Empty(t, releases(out), "a's round holds k2 for us: kept")
	require.Equal(t, roundID{"b", 20}, c.s.held[key(1)].round, "k1 from b, whose answer came first")
	require.Equal(t, roundID{"a", 10}, c.s.held[key(2)].round)

	// A round none of whose hits is wanted goes back at once.
	out = c.handle(&tiermsg.Lookup{Corr: 8, Keys: []messages.Key{key(1)}})
	asked = asks(out)
	out = c.handle(hits(asked[a], "a", 11, true))
	require.Equal(t, map[*actor.PID][]uint64{a: {11}}, releases(out), "k1 is held at b already")
}

func TestPeerSourcesNameThePeersARequestMayFetchFrom(t *testing.T) {
	c := newCore(t)
	c.up("a")
	b := c.up("b")
	out := c.handle(&tiermsg.Lookup{Corr: 1, Keys: []messages.Key{key(1)}, Req: &messages.ReqContext{PeerSources: []string{"b"}}})
	asked := asks(out)
	require.Len(t, asked, 1)
	require.NotNil(t, asked[b])
	c.handle(&tiermsg.Lookup{Corr: 2, Keys: []messages.Key{key(1)}, Req: &messages.ReqContext{PeerSources: []string{"gone"}}})
	require.Equal(t, []any{&tiermsg.LookupResult{Corr: 2, Found: []bool{false}}}, c.Resp, "no eligible peer: answered at once")
}

func TestAHeldRoundIsReleasedWhenItsHoldExpiresNotBefore(t *testing.T) {
	c := newCore(t)
	a := c.up("a")
	asked := asks(c.handle(&tiermsg.Lookup{Corr: 1, Keys: []messages.Key{key(1)}}))
	c.handle(hits(asked[a], "a", 5, true))
	hold, armed := fxlog.Armed[*holdExpired](&c.Log)
	require.True(t, armed)
	require.Empty(t, c.handle(&holdExpired{round: hold.round, seq: hold.seq + 1}), "another generation's timer")
	out := c.handle(hold)
	require.Equal(t, map[*actor.PID][]uint64{a: {5}}, releases(out))
	require.Empty(t, c.s.held)
	require.Empty(t, c.handle(hold), "released once")
}

func TestAReadFetchesOneRoundPerProducerAndAnswersAfterAll(t *testing.T) {
	c := newCore(t)
	a, b := c.up("a"), c.up("b")
	asked := asks(c.handle(&tiermsg.Lookup{Corr: 1, Keys: []messages.Key{key(1), key(2), key(3)}}))
	c.handle(hits(asked[a], "a", 10, true, false, true))
	c.handle(hits(asked[b], "b", 20, false, true, false))

	out := c.handle(&tiermsg.ReadBatch{Corr: 2, Keys: []messages.Key{key(1), key(2), key(3), key(4)}, Slots: []int{0, 1, 2, 3}})
	fetches := map[*actor.PID]*peermsg.Fetch{}
	for _, s := range out {
		if f, ok := s.Msg.(*peermsg.Fetch); ok {
			fetches[s.To] = f
		}
	}
	require.Len(t, fetches, 2, "one fetch per producer round")
	require.Equal(t, []messages.Key{key(1), key(3)}, fetches[a].Keys)
	require.Equal(t, []int{0, 2}, fetches[a].Slots)
	require.Equal(t, []uint32{100, 102}, fetches[a].Checksums, "verified against the producer's checksums")
	require.Equal(t, uint64(20), fetches[b].Round)
	require.Empty(t, c.s.rounds, "the fetches consume the rounds: no hold timer releases them")

	require.Empty(t, c.handle(&peermsg.FetchResult{Corr: fetches[a].Corr, Node: "a", Round: 10, OK: []bool{true, false}}),
		"b's fetch still writes into its slots")
	out = c.handle(&peermsg.FetchResult{Corr: fetches[b].Corr, Node: "b", Round: 20, Err: messages.ErrPeerTimeout})
	res := answered[*tiermsg.ReadBatchResult](t, c, out)
	require.NoError(t, res.Errs[0])
	require.Equal(t, uint32(100), res.Checksums[0])
	require.ErrorIs(t, res.Errs[1], messages.ErrPeerTimeout)
	require.ErrorIs(t, res.Errs[2], messages.ErrInvalidBlock)
	require.ErrorIs(t, res.Errs[3], messages.ErrLeaseLost, "a key no round holds")
	require.Equal(t, []string{"a", "b", "a", ""}, res.Source)
	require.Equal(t, uint64(1), c.s.stats.Reads)
	require.Equal(t, uint64(3), c.s.stats.ReadFailures)
}

func TestALookupDeadlineAnswersWhatIsFoundAndALateHitIsReleased(t *testing.T) {
	c := newCore(t)
	a, b := c.up("a"), c.up("b")
	asked := asks(c.handle(&tiermsg.Lookup{Corr: 1, Keys: []messages.Key{key(1), key(2)}}))
	c.handle(hits(asked[a], "a", 10, true, false))
	deadline, _ := fxlog.Armed[*lookupDeadline](&c.Log)
	res := answered[*tiermsg.LookupResult](t, c, c.handle(deadline))
	require.Equal(t, []bool{true, false}, res.Found)
	out := c.handle(hits(asked[b], "b", 20, false, true))
	require.Equal(t, map[*actor.PID][]uint64{b: {20}}, releases(out), "too late to be wanted")
	require.Nil(t, c.s.held[key(2)])
	require.Empty(t, c.handle(deadline), "answered once")
}

func TestAPeerThatLeftIsNotAskedAndOneThatReturnsIsAskedAtItsNewSession(t *testing.T) {
	c := newCore(t)
	old := c.up("a")
	b := c.up("b")
	c.handle(&peer.Down{Node: "a", Session: old, Reason: "gone"})
	asked := asks(c.handle(&tiermsg.Lookup{Corr: 1, Keys: []messages.Key{key(1)}}))
	require.Len(t, asked, 1)
	require.NotNil(t, asked[b])
	fresh := c.up("a")
	asked = asks(c.handle(&tiermsg.Lookup{Corr: 2, Keys: []messages.Key{key(1)}}))
	require.Len(t, asked, 2)
	require.NotNil(t, asked[fresh])
	require.Nil(t, asked[old])
}

func TestAwaitPeersIsAnsweredOnceEveryNamedPeerIsUp(t *testing.T) {
	c := newCore(t)
	reply := messages.NewReply[struct{}]()
	c.handle(&peermsg.AwaitPeers{Nodes: []string{"a", "b"}, Reply: reply})
	c.up("a")
	require.Empty(t, reply.C())
	c.up("b")
	require.Len(t, reply.C(), 1)
}

func TestAProbeAnswersHitsAndGivesTheRoundBackAtOnce(t *testing.T) {
	c := newCore(t)
	missing := messages.NewReply[[]bool]()
	c.handle(&peermsg.Probe{Node: "x", Keys: []messages.Key{key(1)}, Reply: missing})
	got := <-missing.C()
	require.ErrorIs(t, got.Err, messages.ErrPeerUnavailable)

	a := c.up("a")
	reply := messages.NewReply[[]bool]()
	asked := asks(c.handle(&peermsg.Probe{Node: "a", Keys: []messages.Key{key(1), key(2)}, Reply: reply}))
	out := c.handle(hits(asked[a], "a", 3, false, true))
	require.Equal(t, map[*actor.PID][]uint64{a: {3}}, releases(out), "nothing is promoted by a probe")
	got = <-reply.C()
	require.NoError(t, got.Err)
	require.Equal(t, []bool{false, true}, got.Value)
	require.Empty(t, c.s.held)
}

func TestAFailedPeerAnswerHoldsNothing(t *testing.T) {
	c := newCore(t)
	a := c.up("a")
	asked := asks(c.handle(&tiermsg.Lookup{Corr: 1, Keys: []messages.Key{key(1)}}))
	r := hits(asked[a], "a", 4, true)
	r.Err = errors.Join(messages.ErrPeerRefused)
	out := c.handle(r)
	require.Equal(t, []bool{false}, answered[*tiermsg.LookupResult](t, c, out).Found)
	require.Empty(t, releases(out), "a failed round holds nothing at the producer")
	require.Empty(t, c.s.held)
}

// The directory's event watchers are the core's decisions, run by the
// shell: one per peer whose session is up and whose addresses are known,
// a fresh generation each time it is (re)started, the old one stopped and
// its late events ignored.
func TestAWatcherRunsOnlyWhileItsPeerIsUpAndAnOldGenerationIsIgnored(t *testing.T) {
	s := NewState(Config{Directory: true, Log: zerolog.Nop()}.WithDefaults())
	var o Out
	handle := func(msg any) {
		o.Reset()
		s.Handle(&o, fx.Ref{}, msg)
	}
	start := func(gen uint64, cfg events.SubscriberConfig) []watchStart {
		return []watchStart{{watchKey{"a", gen}, cfg}}
	}
	pub := events.SubscriberConfig{Endpoint: "tcp://a:1", ReplayFrom: -1}

	handle(&peer.EventsAt{Node: "a", Endpoint: pub.Endpoint})
	require.Empty(t, o.Watches, "a is not up")
	handle(&peer.Up{Node: "a", Session: actor.NewPID("core", "session-a")})
	require.Equal(t, start(1, pub), o.Watches)
	require.Empty(t, o.Unwatches)

	// New addresses restart the watcher: a new generation, the old one stopped.
	withReplay := events.SubscriberConfig{Endpoint: pub.Endpoint, Replay: "tcp://a:2", ReplayFrom: 0}
	handle(&peer.EventsAt{Node: "a", Endpoint: pub.Endpoint, Replay: withReplay.Replay})
	require.Equal(t, []watchKey{{"a", 1}}, o.Unwatches)
	require.Equal(t, start(2, withReplay), o.Watches)
	handle(&eventBatch{node: "a", gen: 1, batch: batch(stored(messages.MediumCPU, 1))})
	require.Empty(t, s.dir.peers["a"].keys, "the stopped generation's batch is ignored")
	handle(&eventBatch{node: "a", gen: 2, batch: batch(stored(messages.MediumCPU, 1))})
	require.Len(t, s.dir.peers["a"].keys, 1)

	// A failed stream is watched again after a back-off, with a fresh set.
	handle(&watchEnded{node: "a", gen: 2, err: errors.New("gone")})
	require.Empty(t, o.Unwatches, "it ended on its own")
	require.Len(t, o.Deadlines, 1)
	retry := o.Deadlines[0].Msg
	handle(retry)
	require.Equal(t, []watchKey{{"a", 2}}, o.Unwatches)
	require.Equal(t, start(3, withReplay), o.Watches)

	handle(&peer.Down{Node: "a", Reason: "gone"})
	require.Equal(t, []watchKey{{"a", 3}}, o.Unwatches, "no watcher while its session is down")
	require.Empty(t, o.Watches)
	handle(&rewatch{node: "a", gen: 3})
	require.Empty(t, o.Watches, "a late back-off of a peer that left")
	require.Empty(t, o.Unwatches)
}

// A watcher stopped in the Out that would start it is never started: the
// shell's stops all name watchers already running.
func TestAWatcherStoppedInTheOutThatStartsItIsNeverStarted(t *testing.T) {
	var o Out
	o.watch(watchKey{"a", 1}, events.SubscriberConfig{})
	o.watch(watchKey{"b", 2}, events.SubscriberConfig{})
	o.unwatch(watchKey{"a", 1})
	o.unwatch(watchKey{"c", 3})
	require.Equal(t, []watchStart{{watchKey: watchKey{"b", 2}}}, o.Watches)
	require.Equal(t, []watchKey{{"c", 3}}, o.Unwatches)
}

// A lookup's block lengths go into the fetch of those blocks, in the
// fetch's order; a round whose answer had none fetches whole slots (nil).
func TestAReadCarriesTheLookupsBlockSizes(t *testing.T) {
	c := newCore(t)
	a, b := c.up("a"), c.up("b")
	asked := asks(c.handle(&tiermsg.Lookup{Corr: 1, Keys: []messages.Key{key(1), key(2), key(3), key(4)}}))
	ra := hits(asked[a], "a", 10, true, true, false, true)
	ra.Sizes = []int{4096, 12288, 0, 4096}
	c.handle(ra)
	c.handle(hits(asked[b], "b", 20, false, false, true, false))

	out := c.handle(&tiermsg.ReadBatch{Corr: 2, Keys: []messages.Key{key(4), key(3), key(2), key(1)}, Slots: []int{0, 1, 2, 3}})
	fetches := map[*actor.PID]*peermsg.Fetch{}
	for _, s := range out {
		if f, ok := s.Msg.(*peermsg.Fetch); ok {
			fetches[s.To] = f
		}
	}
	require.Equal(t, []messages.Key{key(4), key(2), key(1)}, fetches[a].Keys)
	require.Equal(t, []int{4096, 12288, 4096}, fetches[a].Sizes)
	require.Nil(t, fetches[b].Sizes, "whole slots")
}

package scheduler

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
)

func okey(i int) messages.Key { return messages.Key{Namespace: "ns", Hash: fmt.Sprintf("k%d", i)} }

func oreq(id string) *messages.ReqContext { return &messages.ReqContext{RequestID: id} }

func TestCallOrderHoldsWhatWouldOvertakeACommit(t *testing.T) {
	var o callOrder
	load := &messages.PrepareLoad{Req: oreq("b"), Keys: []messages.Key{okey(1)}}
	require.True(t, o.admit(load), "nothing in flight: served at once")

	o.issued([]messages.Key{okey(1), okey(2)})
	other := &messages.Lookup{Req: oreq("c"), Keys: []messages.Key{okey(9)}}
	require.True(t, o.admit(other), "another request on other keys is not held")
	require.True(t, o.admit(&messages.JobDone{Job: 3}), "a worker's report is never held")

	load = &messages.PrepareLoad{Req: oreq("b"), Keys: []messages.Key{okey(2)}}
	require.False(t, o.admit(load), "a load of a key being committed waits")
	fin := &messages.RequestFinished{Req: oreq("b")}
	require.False(t, o.admit(fin), "its request's end waits behind it")
	require.True(t, o.admit(&messages.Lookup{Req: oreq("d"), Keys: []messages.Key{okey(7)}}), "other requests go on")
	events := &messages.TakeEvents{}
	require.False(t, o.admit(events), "a barrier waits for every held call")
	require.False(t, o.admit(&messages.Lookup{Req: oreq("d"), Keys: []messages.Key{okey(7)}}), "and everything waits behind a barrier")
	require.Equal(t, 4, o.waiting())

	o.landed([]messages.Key{okey(1), okey(2)})
	var served []any
	for _, m := range o.release() {
		if o.admit(m) {
			served = append(served, m)
		}
	}
	require.Len(t, served, 4, "once the commit landed every held call is served")
	require.Same(t, load, served[0])
	require.Same(t, fin, served[1], "in arrival order")
	require.Same(t, events, served[2])
	require.Zero(t, o.waiting())
}

func TestCallOrderCountsOverlappingCommits(t *testing.T) {
	var o callOrder
	o.issued([]messages.Key{okey(1)})
	o.issued([]messages.Key{okey(1)})
	o.landed([]messages.Key{okey(1)})
	require.False(t, o.admit(&messages.Touch{Req: oreq("a"), Keys: []messages.Key{okey(1)}}), "the second commit of the key is still pending")
	o.landed([]messages.Key{okey(1)})
	require.Len(t, o.release(), 1)
	require.True(t, o.admit(&messages.Touch{Req: oreq("a"), Keys: []messages.Key{okey(1)}}))
}

// TestCallOrderModel drives random arrivals, commits and landings (the
// bridge re-admits after each landing) and checks every served call
// against the order it arrived in: a request's calls in arrival order; no
// call served while a key it names is pending; a barrier after every call
// before it; nothing left held once no commit is pending; and a call of a
// request with nothing held, on no pending key, with no barrier held,
// served at once.
func TestCallOrderModel(t *testing.T) {
	for seed := range int64(300) {
		rng := rand.New(rand.NewSource(seed))
		var o callOrder
		pending := map[messages.Key]int{}
		var commits [][]messages.Key
		arrived := map[any]int{}
		var served []any
		n := 0
		serve := func(m any) {
			kind, _, keys := classify(m)
			for _, k := range keys {
				require.Zero(t, pending[k], "seed %d: served while its key %v is pending", seed, k)
			}
			if kind == kindBarrier {
				for prev, at := range arrived {
					if at < arrived[m] {
						require.Contains(t, served, prev, "seed %d: a barrier overtook an earlier call", seed)
					}
				}
			}
			served = append(served, m)
		}
		// land: a commit sent to the CPU tier; the bridge re-admits.
		land := func(keys []messages.Key) {
			o.landed(keys)
			for _, k := range keys {
				pending[k]--
			}
			for _, m := range o.release() {
				if o.admit(m) {
					serve(m)
				}
			}
		}
		for range 200 {
			switch r := rng.Intn(10); {
			case r < 6:
				req := oreq(fmt.Sprintf("r%d", rng.Intn(4)))
				keys := []messages.Key{okey(rng.Intn(8)), okey(rng.Intn(8))}
				var m any
				switch rng.Intn(6) {
				case 0:
					m = &messages.Lookup{Req: req, Keys: keys}
				case 1:
					m = &messages.PrepareLoad{Req: req, Keys: keys}
				case 2:
					m = &messages.CompleteStore{Req: req, Keys: keys}
				case 3:
					m = &messages.RequestFinished{Req: req}
				case 4:
					m = &messages.HasPendingWork{}
				default:
					m = &messages.JobDone{Job: messages.JobID(n)}
				}
				n++
				arrived[m] = n
				heldBefore := o.waiting()
				kind, id, _ := classify(m)
				quiet := o.barriers == 0 && o.reqs[id] == 0 && !o.names(keysOf(m))
				if o.admit(m) {
					serve(m)
				} else {
					require.NotEqual(t, kindFree, kind, "seed %d: a free call was held", seed)
					require.False(t, kind == kindRequest && quiet, "seed %d: a call with nothing to wait for was held", seed)
					require.False(t, kind == kindBarrier && heldBefore == 0, "seed %d: a barrier with nothing before it was held", seed)
				}
			case r < 8:
				keys := []messages.Key{okey(rng.Intn(8))}
				o.issued(keys)
				for _, k := range keys {
					pending[k]++
				}
				commits = append(commits, keys)
			default:
				if len(commits) == 0 {
					continue
				}
				keys := commits[0]
				commits = commits[1:]
				land(keys)
			}
		}
		for _, keys := range commits {
			land(keys)
		}
		require.Zero(t, o.waiting(), "seed %d: calls left held with no commit pending", seed)
		require.Len(t, served, len(arrived), "seed %d: every call served once", seed)
		last := map[string]int{}
		for _, m := range served {
			if kind, id, _ := classify(m); kind == kindRequest {
				require.Greater(t, arrived[m], last[id], "seed %d: request %s's calls out of order", seed, id)
				last[id] = arrived[m]
			}
		}
	}
}

func keysOf(m any) []messages.Key { _, _, k := classify(m); return k }

func TestFailCallAnswersEveryHeldKind(t *testing.T) {
	lookup := &messages.Lookup{Reply: messages.NewReply[[]messages.LookupStatus]()}
	load := &messages.PrepareLoad{Reply: messages.NewReply[messages.LoadJob]()}
	release := &messages.ReleaseSession{Reply: messages.NewReply[messages.SessionReleased]()}
	var out fx.Out
	for _, m := range []any{lookup, load, release} {
		failCall(&out, m, ErrRestarted)
	}
	require.Empty(t, lookup.Reply.C(), "answered through the Out, in its order")
	for _, s := range out.Sent {
		s.Reply.AnswerAny(s.Msg, s.Err)
	}
	require.ErrorIs(t, (<-lookup.Reply.C()).Err, ErrRestarted)
	require.ErrorIs(t, (<-load.Reply.C()).Err, ErrRestarted)
	require.ErrorIs(t, (<-release.Reply.C()).Err, ErrRestarted)
}

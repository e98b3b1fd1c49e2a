package peer

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer/wire"
	"github.com/kvtier/kvtier/rdma"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
)

// The producer's book driven one event at a time, as the Session does,
// with the CPU tier's answers written by hand.

// testNow is the producer books' clock; a test moves it by hand.
var testNow = time.Unix(1000, 0)

func testInbound(t *testing.T, ours, theirs []string) *inbound {
	t.Helper()
	h := &wire.Hello{Epoch: 7, Namespaces: theirs, Slots: 4, BlockBytes: 4096}
	return newInbound("b", h, &wire.Welcome{Epoch: 7, BlockBytes: 4096}, ours, time.Minute, func() time.Time { return testNow }, nil)
}

func wkeys(ns string, hashes ...string) []wire.Key {
	out := make([]wire.Key, len(hashes))
	for i, h := range hashes {
		out[i] = wire.Key{Namespace: ns, Hash: []byte(h)}
	}
	return out
}

// asked returns the one request a decision made of the CPU tier.
func asked[T any](t *testing.T, o served) (T, cpuCall) {
	t.Helper()
	var asks []cpuMsg
	for _, m := range o.cpu {
		if m.call != nil {
			asks = append(asks, m)
		}
	}
	if len(asks) != 1 {
		t.Fatalf("want one request to the CPU tier, got %d: %+v", len(asks), o.cpu)
	}
	msg, ok := asks[0].msg.(T)
	if !ok {
		t.Fatalf("asked %T, want %T", asks[0].msg, msg)
	}
	return msg, *asks[0].call
}

func released(o served) []messages.Holder {
	var out []messages.Holder
	for _, m := range o.cpu {
		if r, ok := m.msg.(*cpumsg.ReleaseHolder); ok {
			out = append(out, r.Holder)
		}
	}
	return out
}

func frameTypes(o served) []string {
	var out []string
	for _, f := range o.frames {
		out = append(out, reflect.TypeOf(f).Elem().Name())
	}
	return out
}

func lease(call cpuCall, lookup *cpumsg.LookupAndLease, hit ...bool) *cpumsg.LookupResult {
	m := &cpumsg.LookupResult{Holder: call.holder, Status: make([]messages.LookupStatus, len(lookup.Keys)),
		Checksums: make([]uint32, len(lookup.Keys))}
	for i, h := range hit {
		if h {
			m.Status[i], m.Checksums[i] = messages.Hit, uint32(100+i)
		}
	}
	return m
}

// leasedRound runs a Lookup of keys a..c whose first two hit.
func leasedRound(t *testing.T, in *inbound, round uint64) cpuCall {
	t.Helper()
	lk, call := asked[*cpumsg.LookupAndLease](t, in.lookup(&wire.Lookup{Epoch: 7, Round: round, Keys: wkeys("ns", "a", "b", "c")}, false))
	o := in.leased(call, lease(call, lk, true, true, false), false)
	if len(o.frames) != 1 || len(released(o)) != 0 {
		t.Fatalf("leased: %+v", o)
	}
	return call
}

func TestProducerServesARoundNumberOnce(t *testing.T) {
	in := testInbound(t, []string{"ns"}, []string{"ns"})
	lk, call := asked[*cpumsg.LookupAndLease](t, in.lookup(&wire.Lookup{Epoch: 7, Round: 5, Keys: wkeys("ns", "a")}, false))
	if call.round != 5 || lk.Holder != call.holder || !lk.WantChecksums || lk.TTL != time.Minute {
		t.Fatalf("lookup asked %+v for %+v", lk, call)
	}
	for _, replay := range []uint64{5, 4, 1} {
		o := in.lookup(&wire.Lookup{Epoch: 7, Round: replay, Keys: wkeys("ns", "a")}, false)
		if !reflect.DeepEqual(o.drops, []string{"replayed_round"}) || len(o.cpu)+len(o.frames) != 0 {
			t.Fatalf("round %d after 5: %+v, want a drop and nothing else", replay, o)
		}
	}
	if _, c := asked[*cpumsg.LookupAndLease](t, in.lookup(&wire.Lookup{Epoch: 7, Round: 6, Keys: wkeys("ns", "a")}, false)); c.holder == call.holder {
		t.Fatal("two rounds share a lease holder")
	}
}

func TestProducerAnswersPositionallyAndNeverLeasesForeignNamespaces(t *testing.T) {
	in := testInbound(t, []string{"ns", "mine"}, []string{"ns", "theirs"})
	o := in.lookup(&wire.Lookup{Epoch: 7, Round: 1, Keys: append(wkeys("theirs", "x"), wkeys("ns", "a", "b")...)}, false)
	if !reflect.DeepEqual(o.drops, []string{"foreign_namespace_keys"}) {
		t.Fatalf("drops %v", o.drops)
	}
	lk, call := asked[*cpumsg.LookupAndLease](t, o)
	if len(lk.Keys) != 3 || lk.Keys[0].Namespace != "" || lk.Keys[1].Namespace != "ns" {
		t.Fatalf("asked keys %+v: the foreign key must stay in place as an unhittable one", lk.Keys)
	}
	o = in.leased(call, lease(call, lk, false, false, true), false)
	resp := o.frames[0].(*wire.LookupResp)
	if !reflect.DeepEqual(resp.Hits, []bool{false, false, true}) || resp.Checksums[2] != 102 || resp.Round != 1 {
		t.Fatalf("answer %+v", resp)
	}
	if in.rounds[1] == nil || in.rounds[1].phase != roundLeased {
		t.Fatal("a round with a hit must stay leased for its Fetch")
	}
}

func TestProducerRoundThatHitNothingEndsWithoutARelease(t *testing.T) {
	in := testInbound(t, []string{"ns"}, []string{"ns"})
	lk, call := asked[*cpumsg.LookupAndLease](t, in.lookup(&wire.Lookup{Epoch: 7, Round: 1, Keys: wkeys("ns", "a")}, false))
	o := in.leased(call, lease(call, lk, false), false)
	if len(in.rounds) != 0 || len(released(o)) != 0 || len(o.frames) != 1 {
		t.Fatalf("%+v; rounds %v", o, in.rounds)
	}
}

func TestProducerDrainingAnswersMissesAndLeasesNothing(t *testing.T) {
	in := testInbound(t, []string{"ns"}, []string{"ns"})
	o := in.lookup(&wire.Lookup{Epoch: 7, Round: 1, Keys: wkeys("ns", "a", "b")}, true)
	if len(o.cpu) != 0 || len(o.frames) != 1 || o.frames[0].(*wire.LookupResp).Hits[0] {
		t.Fatalf("draining lookup: %+v", o)
	}
	// A lookup already at the CPU tier when the drain began: its leases go back.
	lk, call := asked[*cpumsg.LookupAndLease](t, in.lookup(&wire.Lookup{Epoch: 7, Round: 2, Keys: wkeys("ns", "a")}, false))
	o = in.leased(call, lease(call, lk, true), true)
	if !reflect.DeepEqual(released(o), []messages.Holder{call.holder}) || o.frames[0].(*wire.LookupResp).Hits[0] || len(in.rounds) != 0 {
		t.Fatalf("lease answered while draining: %+v", o)
	}
}

func TestProducerRefusesABadFetchOnceAndReleasesItsLeases(t *testing.T) {
	for _, tc := range []struct {
		name   string
		keys   []wire.Key
		dest   []int
		reason string
	}{
		{"a key the round did not lease", wkeys("ns", "a", "c"), []int{0, 1}, "not_leased"},
		{"a slot past the consumer's pool", wkeys("ns", "a"), []int{4}, "bad_slot"},
		{"a negative slot", wkeys("ns", "a"), []int{-1}, "bad_slot"},
		{"one slot named twice", wkeys("ns", "a", "b"), []int{2, 2}, "bad_slot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInbound(t, []string{"ns"}, []string{"ns"})
			call := leasedRound(t, in, 1)
			o := in.fetch(&wire.Fetch{Epoch: 7, TTLms: 1000, Round: 1, Keys: tc.keys, Dest: tc.dest}, messages.JobRef{ID: 1})
			done, ok := o.frames[0].(*wire.TransferDone)
			if len(o.frames) != 1 || !ok || done.OK || done.Reason != tc.reason {
				t.Fatalf("frames %+v, want one TransferDone{%s}", o.frames, tc.reason)
			}
			if !reflect.DeepEqual(released(o), []messages.Holder{call.holder}) || len(o.cpu) != 1 || o.write != nil {
				t.Fatalf("cpu %+v: want the round's leases released, nothing pinned", o.cpu)
			}
			if len(in.rounds) != 0 {
				t.Fatal("a refused round must end")
			}
			again := in.fetch(&wire.Fetch{Epoch: 7, TTLms: 1000, Round: 1, Keys: wkeys("ns", "a"), Dest: []int{0}}, messages.JobRef{ID: 2})
			if !reflect.DeepEqual(frameTypes(again), []string{"TransferDone"}) || len(again.cpu) != 0 {
				t.Fatalf("a second Fetch of the ended round: %+v", again)
			}
		})
	}
}

func TestProducerWriteHoldsItsLeasesUntilItReportsAndAcksALateAbortAfterIt(t *testing.T) {
	in := testInbound(t, []string{"ns"}, []string{"ns"})
	call := leasedRound(t, in, 1)
	job := messages.JobRef{Origin: messages.OriginPeer, ID: 9}
	tok := rdma.NewToken()
	pin, pinCall := asked[*cpumsg.LeaseToPin](t, in.fetch(&wire.Fetch{Epoch: 7, TTLms: 1000, Round: 1, Keys: wkeys("ns", "b", "a"), Dest: []int{3, 0}, Token: tok[:]}, job))
	if pin.Job != job || pin.Holder != call.holder || len(pin.Keys) != 2 || pinCall.job != job {
		t.Fatalf("pin %+v call %+v", pin, pinCall)
	}
	o := in.pinned(pinCall, &cpumsg.PinResult{Job: job, Slots: []int{10, 11}})
	if o.write == nil || !reflect.DeepEqual(o.write.src, []int{10, 11}) || o.write.round.token != tok || len(o.cpu)+len(o.frames) != 0 {
		t.Fatalf("pinned: %+v", o)
	}
	if !reflect.DeepEqual(o.write.round.dest, []int{3, 0}) {
		t.Fatalf("write into %v", o.write.round.dest)
	}
	// The consumer gives up mid-write: nothing is released under the transport's feet.
	if o := in.abort(&wire.Abort{Epoch: 7, Round: 1}); len(o.cpu)+len(o.frames) != 0 {
		t.Fatalf("abort during a write: %+v", o)
	}
	if o := in.releaseLeased(); len(o.cpu) != 0 {
		t.Fatalf("a drain released a writing round's leases: %+v", o)
	}
	if o := in.close(); len(o.cpu) != 0 {
		t.Fatalf("closing released a writing round's leases: %+v", o)
	}
	report := o.write.done
	report.c = rdma.Completion{Err: errors.New("peer gone")}
	o = writeDone(in, &report)
	unpin, ok := o.cpu[0].msg.(*cpumsg.UnpinKeys)
	if !ok || unpin.Job != job || len(unpin.Keys) != 2 || !reflect.DeepEqual(released(o), []messages.Holder{call.holder}) {
		t.Fatalf("write report: %+v", o.cpu)
	}
	if !reflect.DeepEqual(frameTypes(o), []string{"TransferDone", "AbortAck"}) || o.frames[0].(*wire.TransferDone).Reason != "transfer_failed" {
		t.Fatalf("frames %+v", o.frames)
	}
}

func TestProducerPostsNoWriteForAFetchPastItsTTL(t *testing.T) {
	in := testInbound(t, []string{"ns"}, []string{"ns"})
	call := leasedRound(t, in, 1)
	job := messages.JobRef{Origin: messages.OriginPeer, ID: 5}
	_, pinCall := asked[*cpumsg.LeaseToPin](t, in.fetch(&wire.Fetch{Epoch: 7, TTLms: 100, Round: 1, Keys: wkeys("ns", "a"), Dest: []int{0}}, job))
	was := testNow
	defer func() { testNow = was }()
	testNow = testNow.Add(100 * time.Millisecond) // the pin came back as the consumer gave up
	o := in.pinned(pinCall, &cpumsg.PinResult{Job: job, Slots: []int{1}})
	if o.write != nil {
		t.Fatal("a write was posted for a Fetch its consumer no longer waits for")
	}
	rj, ok := o.cpu[0].msg.(*cpumsg.ReleaseJob)
	if !ok || rj.Job != job || !reflect.DeepEqual(released(o), []messages.Holder{call.holder}) {
		t.Fatalf("cpu %+v: want the pins and the leases released", o.cpu)
	}
	if d, ok := o.frames[0].(*wire.TransferDone); !ok || d.OK || d.Reason != "expired" || !reflect.DeepEqual(o.drops, []string{"expired_fetch"}) {
		t.Fatalf("%+v", o)
	}
	if len(in.rounds) != 0 {
		t.Fatal("round kept")
	}
}

func TestProducerWriteReportAfterItsSessionEndedStillReleases(t *testing.T) {
	in := testInbound(t, []string{"ns"}, []string{"ns"})
	leasedRound(t, in, 1)
	_, pinCall := asked[*cpumsg.LeaseToPin](t, in.fetch(&wire.Fetch{Epoch: 7, TTLms: 1000, Round: 1, Keys: wkeys("ns", "a"), Dest: []int{0}}, messages.JobRef{ID: 3}))
	report := in.pinned(pinCall, &cpumsg.PinResult{Slots: []int{1}}).write.done
	for _, later := range []*inbound{nil, testInbound(t, nil, nil)} { // ended; replaced by a new epoch (7 again: a new book)
		if later != nil {
			later.epoch = 8
		}
		o := writeDone(later, &report)
		if len(o.cpu) != 2 || len(released(o)) != 1 || len(o.frames) != 0 {
			t.Fatalf("report to %+v: %+v", later, o)
		}
	}
}

func TestProducerAnswersToAnEndedSessionReleaseWhatTheyHold(t *testing.T) {
	in := testInbound(t, []string{"ns"}, []string{"ns"})
	lk, call := asked[*cpumsg.LookupAndLease](t, in.lookup(&wire.Lookup{Epoch: 7, Round: 1, Keys: wkeys("ns", "a")}, false))
	var gone *inbound
	if o := gone.leased(call, lease(call, lk, true), false); !reflect.DeepEqual(released(o), []messages.Holder{call.holder}) || len(o.frames) != 0 {
		t.Fatalf("lease answer after the session ended: %+v", o)
	}
	leasedRound(t, in, 2)
	_, pinCall := asked[*cpumsg.LeaseToPin](t, in.fetch(&wire.Fetch{Epoch: 7, TTLms: 1000, Round: 2, Keys: wkeys("ns", "a"), Dest: []int{0}}, messages.JobRef{ID: 4}))
	o := gone.pinned(pinCall, &cpumsg.PinResult{Slots: []int{1}})
	if rj, ok := o.cpu[0].msg.(*cpumsg.ReleaseJob); !ok || rj.Job.ID != 4 || len(released(o)) != 1 || o.write != nil {
		t.Fatalf("pin answer after the session ended: %+v", o)
	}
	if o := gone.pinned(pinCall, &cpumsg.PinResult{Err: messages.ErrLeaseLost}); len(o.cpu) != 1 || len(released(o)) != 1 {
		t.Fatalf("a failed pin owns no job to release: %+v", o)
	}
}

// TestProducerReleasesEveryLeaseExactlyOnce drives random interleavings of
// the peer's frames, the CPU tier's answers, write reports and the
// session's end, and checks the book's promises: a holder that got leases
// is released exactly once in the end (twice, idempotently, when its
// lookup was still at the CPU tier as its session ended), never while its
// write runs; a fetched round is answered at most once.
func TestProducerReleasesEveryLeaseExactlyOnce(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 1))
		in := testInbound(t, []string{"ns"}, []string{"ns"})
		live := in
		var (
			round     uint64
			lookups   []cpuCall
			lookupsOf = map[uint64]*cpumsg.LookupAndLease{}
			pins      []cpuCall
			writes    []written
			held      = map[messages.Holder]bool{} // got a lease from the CPU tier
			writing   = map[messages.Holder]bool{}
			releases  = map[messages.Holder]int{}
			answers   = map[uint64]int{}           // TransferDones per round
			twice     = map[messages.Holder]bool{} // still looking up when the session ended
		)
		apply := func(o served) {
			for _, h := range released(o) {
				if writing[h] {
					t.Fatalf("seed %d: %s released while its write runs", seed, h.ID)
				}
				releases[h]++
			}
			for _, f := range o.frames {
				if d, ok := f.(*wire.TransferDone); ok && d.Reason != "unknown_round" {
					answers[d.Round]++
				}
			}
			if o.write != nil {
				writing[o.write.done.holder] = true
				writes = append(writes, o.write.done)
			}
			for _, m := range o.cpu {
				if m.call == nil {
					continue
				}
				switch msg := m.msg.(type) {
				case *cpumsg.LookupAndLease:
					lookups = append(lookups, *m.call)
					lookupsOf[m.call.round] = msg
				case *cpumsg.LeaseToPin:
					pins = append(pins, *m.call)
				}
			}
		}
		end := func() {
			for _, r := range live.rounds {
				if r.phase == roundLooking {
					twice[r.holder] = true
				}
			}
			apply(live.close())
			live = nil
		}
		take := func(list *[]cpuCall) cpuCall {
			i := rng.IntN(len(*list))
			c := (*list)[i]
			*list = append((*list)[:i], (*list)[i+1:]...)
			return c
		}
		for step := 0; step < 60; step++ {
			switch k := rng.IntN(8); {
			case k == 0 && live != nil:
				round++
				apply(live.lookup(&wire.Lookup{Epoch: 7, Round: round, Keys: wkeys("ns", "a", "b")}, false))
			case k == 1 && len(lookups) > 0:
				c := take(&lookups)
				m := lease(c, lookupsOf[c.round], rng.IntN(2) == 0, rng.IntN(2) == 0)
				if m.Status[0] == messages.Hit || m.Status[1] == messages.Hit {
					held[c.holder] = true
				}
				apply(live.leased(c, m, false))
			case k == 2 && live != nil && round > 0:
				r := uint64(rng.IntN(int(round))) + 1
				apply(live.fetch(&wire.Fetch{Epoch: 7, TTLms: 1000, Round: r, Keys: wkeys("ns", "a"), Dest: []int{rng.IntN(5)}},
					messages.JobRef{Origin: messages.OriginPeer, ID: messages.JobID(step)}))
			case k == 3 && len(pins) > 0:
				c := take(&pins)
				var err error
				if rng.IntN(4) == 0 {
					err = messages.ErrLeaseLost
				}
				apply(live.pinned(c, &cpumsg.PinResult{Job: c.job, Slots: []int{1}, Err: err}))
			case k == 4 && len(writes) > 0:
				i := rng.IntN(len(writes))
				w := writes[i]
				writes = append(writes[:i], writes[i+1:]...)
				writing[w.holder] = false
				apply(writeDone(live, &w))
			case k == 5 && live != nil && round > 0:
				apply(live.abort(&wire.Abort{Epoch: 7, Round: uint64(rng.IntN(int(round))) + 1}))
			case k == 6 && live != nil && rng.IntN(8) == 0:
				end()
			case k == 7 && live != nil && rng.IntN(4) == 0:
				apply(live.releaseLeased()) // a drain began
			}
		}
		// Everything outstanding comes back; then the session ends.
		for len(lookups) > 0 || len(pins) > 0 || len(writes) > 0 {
			switch {
			case len(lookups) > 0:
				c := take(&lookups)
				held[c.holder] = true
				apply(live.leased(c, lease(c, lookupsOf[c.round], true, true), false))
			case len(pins) > 0:
				c := take(&pins)
				apply(live.pinned(c, &cpumsg.PinResult{Job: c.job, Slots: []int{1}}))
			default:
				w := writes[0]
				writes = writes[1:]
				writing[w.holder] = false
				apply(writeDone(live, &w))
			}
		}
		if live != nil {
			end()
		}
		for h := range held {
			if want := 1; releases[h] != want && !(twice[h] && releases[h] == 2) {
				t.Fatalf("seed %d: %s released %d times, want once", seed, h.ID, releases[h])
			}
		}
		for r, n := range answers {
			if n > 1 {
				t.Fatalf("seed %d: round %d answered %d times", seed, r, n)
			}
		}
	}
}

// sizedInbound is a producer with slots of ours bytes whose namespace
// "ns" holds blocks of nsBytes, serving a consumer with slots of theirs.
func sizedInbound(ours, nsBytes, theirs int) *inbound {
	h := &wire.Hello{Epoch: 7, Namespaces: []string{"ns"}, Slots: 4, BlockBytes: theirs}
	return newInbound("b", h, &wire.Welcome{Epoch: 7, BlockBytes: ours}, []string{"ns"}, time.Minute,
		func() time.Time { return testNow }, fixedBlocks{block: nsBytes, slot: ours})
}

// fixedBlocks is a pool whose blocks are all block bytes long, in slots of
// slot bytes.
type fixedBlocks struct{ block, slot int }

func (f fixedBlocks) blockLen(string, int) int { return f.block }
func (f fixedBlocks) slotBytes(int) int        { return f.slot }

// The LookupResp says each hit's length when it is not our slot size, and
// a Fetch must ask for every block at that length.
func TestProducerTellsBlockLengthsAndHoldsTheFetchToThem(t *testing.T) {
	in := sizedInbound(12288, 4096, 12288)
	lk, call := asked[*cpumsg.LookupAndLease](t, in.lookup(&wire.Lookup{Epoch: 7, Round: 1, Keys: wkeys("ns", "a", "b", "c")}, false))
	o := in.leased(call, lease(call, lk, true, false, true), false)
	resp := o.frames[0].(*wire.LookupResp)
	if !reflect.DeepEqual(resp.Sizes, []int{4096, 0, 4096}) {
		t.Fatalf("sizes %v, want each hit's length", resp.Sizes)
	}
	for name, sizes := range map[string][]int{"absent (the consumer's slots)": nil, "another length": {4096, 4095}} {
		in := sizedInbound(12288, 4096, 12288)
		call := leasedRound(t, in, 1)
		o := in.fetch(&wire.Fetch{Epoch: 7, TTLms: 1000, Round: 1, Keys: wkeys("ns", "a", "b"), Dest: []int{0, 1}, Sizes: sizes}, messages.JobRef{ID: 1})
		if done, ok := o.frames[0].(*wire.TransferDone); !ok || done.OK || done.Reason != "bad_size" ||
			!reflect.DeepEqual(released(o), []messages.Holder{call.holder}) {
			t.Fatalf("%s: %+v, want TransferDone{bad_size} and the leases released", name, o)
		}
	}
	in = sizedInbound(12288, 4096, 12288)
	leasedRound(t, in, 1)
	if _, pin := asked[*cpumsg.LeaseToPin](t, in.fetch(&wire.Fetch{Epoch: 7, TTLms: 1000, Round: 1, Keys: wkeys("ns", "a", "b"),
		Dest: []int{0, 1}, Sizes: []int{4096, 4096}}, messages.JobRef{ID: 1})); pin.round != 1 {
		t.Fatalf("pin call %+v", pin)
	}
}

// A pinned block longer than the slot of ours it is pinned in is never
// written: the round ends with TransferDone{block_too_large}, its pins and
// its leases released — nothing leaks. (One longer than the consumer's
// slot is the consumer's to refuse: its transport checks the slot it
// lands in, ours its largest slot.)
func TestProducerRefusesABlockTooLongForASlotAndReleasesItsPins(t *testing.T) {
	for name, in := range map[string]*inbound{
		"our slots": sizedInbound(4096, 8192, 12288), // a namespace's size beyond our slots: misconfigured
	} {
		t.Run(name, func(t *testing.T) {
			call := leasedRound(t, in, 1)
			size := in.length(messages.Key{Namespace: "ns"}, 2)
			job := messages.JobRef{Origin: messages.OriginPeer, ID: 3}
			_, pinCall := asked[*cpumsg.LeaseToPin](t, in.fetch(&wire.Fetch{Epoch: 7, TTLms: 1000, Round: 1, Keys: wkeys("ns", "a"),
				Dest: []int{0}, Sizes: []int{size}}, job))
			o := in.pinned(pinCall, &cpumsg.PinResult{Job: job, Slots: []int{2}})
			if o.write != nil {
				t.Fatal("a block too long for a slot was written")
			}
			done, ok := o.frames[0].(*wire.TransferDone)
			if !ok || done.OK || done.Reason != reasonBlockTooLarge {
				t.Fatalf("frames %+v, want TransferDone{%s}", o.frames, reasonBlockTooLarge)
			}
			rel, ok := o.cpu[0].msg.(*cpumsg.ReleaseJob)
			if !ok || rel.Job != job || !reflect.DeepEqual(released(o), []messages.Holder{call.holder}) || len(in.rounds) != 0 {
				t.Fatalf("cpu %+v: want the pins and the leases released, the round ended", o.cpu)
			}
			if !errors.Is(refusedFetch(done.Reason), ErrBlockTooLarge) || !errors.Is(refusedFetch(done.Reason), messages.ErrPeerRefused) {
				t.Fatalf("the consumer reads %q as %v", done.Reason, refusedFetch(done.Reason))
			}
		})
	}
}

// slotBlocks is a pool whose blocks fill their slots, slot 1 being one our
// data plane cannot move (a size nixl does not serve: 0 bytes to us).
type slotBlocks struct{}

func (slotBlocks) blockLen(_ string, slot int) int { return slotBlocks{}.slotBytes(slot) }
func (slotBlocks) slotBytes(slot int) int {
	if slot == 1 {
		return 0
	}
	return 4096
}

// A hit in a slot our data plane cannot move is answered as a miss, never
// as a block of 0 bytes (a malformed answer); a round all of whose hits
// are such ends at once and gives its leases back.
func TestProducerAnswersAHitItCannotMoveAsAMiss(t *testing.T) {
	newIn := func() *inbound {
		h := &wire.Hello{Epoch: 7, Namespaces: []string{"ns"}, Slots: 4, BlockBytes: 4096}
		return newInbound("b", h, &wire.Welcome{Epoch: 7, BlockBytes: 4096}, []string{"ns"}, time.Minute,
			func() time.Time { return testNow }, slotBlocks{})
	}
	in := newIn()
	lk, call := asked[*cpumsg.LookupAndLease](t, in.lookup(&wire.Lookup{Epoch: 7, Round: 1, Keys: wkeys("ns", "a", "b")}, false))
	if !lk.WantSlots {
		t.Fatal("a peer's lookup asks for the hits' slots: their sizes are the blocks'")
	}
	m := lease(call, lk, true, true)
	m.Slots = []int{0, 1}
	o := in.leased(call, m, false)
	resp := o.frames[0].(*wire.LookupResp)
	if !reflect.DeepEqual(resp.Hits, []bool{true, false}) || len(released(o)) != 0 || in.rounds[1] == nil {
		t.Fatalf("answer %+v, released %v: want the movable hit only, the round leased", resp, released(o))
	}

	in = newIn()
	lk, call = asked[*cpumsg.LookupAndLease](t, in.lookup(&wire.Lookup{Epoch: 7, Round: 1, Keys: wkeys("ns", "b")}, false))
	m = lease(call, lk, true)
	m.Slots = []int{1}
	o = in.leased(call, m, false)
	resp = o.frames[0].(*wire.LookupResp)
	if resp.Hits[0] || !reflect.DeepEqual(released(o), []messages.Holder{call.holder}) || len(in.rounds) != 0 {
		t.Fatalf("answer %+v, released %v: want a miss, the leases given back, the round ended", resp, released(o))
	}
}

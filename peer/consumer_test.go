package peer

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer/peermsg"
	"github.com/kvtier/kvtier/peer/wire"
	"github.com/kvtier/kvtier/rdma"
)

// The consumer's book driven one event at a time, as the Session does,
// with the producer's frames and the transport's completions written by
// hand. Blocks are half a chunk, so a fetch of three keys is two chunks:
// keys [0, 2) and [2, 3).

const halfChunk = ChunkBytes / 2

var (
	asker   = fx.RefOf(actor.NewPID("local", "p2p"))
	readyAt = linkNow{epoch: 7, ready: true, peerBlock: halfChunk}
)

func testConsumer() *consumer {
	now := time.Unix(1000, 0)
	return &consumer{node: "b", namespaces: []string{"ns"}, blockBytes: halfChunk, maxBlock: func() int { return halfChunk }, lookupTTL: time.Second,
		fetchTTL: 2 * time.Second, leaseTTL: time.Minute, now: func() time.Time { return now },
		pc: &peerCounters{}, rounds: map[uint64]*outRound{}}
}

func mkeys(ns string, hashes ...string) []messages.Key {
	out := make([]messages.Key, len(hashes))
	for i, h := range hashes {
		out[i] = messages.Key{Namespace: messages.Namespace(ns), Hash: h}
	}
	return out
}

// only returns the one answer a decision gave the P2P tier.
func only[T any](t *testing.T, o consumed) T {
	t.Helper()
	if len(o.answers) != 1 {
		t.Fatalf("want one answer, got %d: %+v", len(o.answers), o.answers)
	}
	m, ok := o.answers[0].msg.(T)
	if !ok {
		t.Fatalf("answered %T, want %T", o.answers[0].msg, m)
	}
	return m
}

func noAnswer(t *testing.T, o consumed, when string) {
	t.Helper()
	if len(o.answers) != 0 {
		t.Fatalf("%s: answered %+v, want no answer yet", when, o.answers[0].msg)
	}
}

// leased looks up keys a, b, c of which the producer holds all.
func leased(t *testing.T, c *consumer) *outRound {
	t.Helper()
	o := c.lookup(&peermsg.Lookup{Corr: 1, Keys: mkeys("ns", "a", "b", "c")}, asker, readyAt)
	lk := o.frames[0].(*wire.Lookup)
	res := only[*peermsg.LookupResult](t, c.lookupResp(&wire.LookupResp{Epoch: 7, Round: lk.Round,
		Hits: []bool{true, true, true}, Checksums: []uint32{1, 2, 3}}))
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	return c.rounds[lk.Round]
}

// fetchAll fetches the three leased keys into slots 10..12, both chunks announced.
func fetchAll(t *testing.T, c *consumer, r *outRound) *outFetch {
	t.Helper()
	m := &peermsg.Fetch{Corr: 2, Round: r.n, Keys: mkeys("ns", "a", "b", "c"), Slots: []int{10, 11, 12}, Checksums: []uint32{1, 2, 3}}
	r2, f, o := c.startFetch(m, asker, readyAt)
	if r2 != r || f == nil || len(o.answers) != 0 || f.chunks != 2 {
		t.Fatalf("startFetch: %v %+v %+v", r2, f, o)
	}
	o = c.fetching(r, f, m, asker, f.chunks, nil)
	if fr, ok := o.frames[0].(*wire.Fetch); !ok || !reflect.DeepEqual(fr.Dest, []int{10, 11, 12}) || fr.TTLms != 2000 || len(o.arm) != 1 || o.arm[0].wait != 2*time.Second {
		t.Fatalf("fetching: %+v", o)
	}
	return f
}

func TestConsumerAsksOnlySharedNamespacesAndAnswersPositionally(t *testing.T) {
	c := testConsumer()
	o := c.lookup(&peermsg.Lookup{Corr: 9, Keys: append(mkeys("other", "x"), mkeys("ns", "a", "b")...)}, asker, readyAt)
	lk := o.frames[0].(*wire.Lookup)
	if len(lk.Keys) != 2 || lk.Keys[0].Namespace != "ns" || lk.Epoch != 7 || !o.heartbeat || len(o.arm) != 1 || o.arm[0].wait != time.Second {
		t.Fatalf("lookup sent %+v, %+v", lk, o)
	}
	noAnswer(t, o, "lookup sent")
	res := only[*peermsg.LookupResult](t, c.lookupResp(&wire.LookupResp{Epoch: 7, Round: lk.Round,
		Hits: []bool{false, true}, Checksums: []uint32{0, 42}}))
	if res.Corr != 9 || !reflect.DeepEqual(res.Hits, []bool{false, false, true}) || res.Checksums[2] != 42 {
		t.Fatalf("answer %+v", res)
	}
	if r := c.rounds[lk.Round]; r == nil || r.phase != roundLeased {
		t.Fatal("a round with hits stays leased")
	}
	if o := c.lookupResp(&wire.LookupResp{Epoch: 7, Round: lk.Round, Hits: []bool{true, true}, Checksums: []uint32{1, 2}}); len(o.answers) != 0 ||
		!reflect.DeepEqual(o.drops, []string{"stale_round"}) {
		t.Fatalf("a second LookupResp: %+v", o)
	}
}

func TestConsumerAnswersAtOnceWhatItCannotAsk(t *testing.T) {
	for _, tc := range []struct {
		name string
		keys []messages.Key
		link linkNow
		err  error
	}{
		{"no ready session", mkeys("ns", "a"), linkNow{epoch: 7}, messages.ErrPeerUnavailable},
		{"a draining session", mkeys("ns", "a"), linkNow{epoch: 7, ready: true, draining: true}, messages.ErrPeerUnavailable},
		{"no namespace in common", mkeys("other", "a"), readyAt, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConsumer()
			o := c.lookup(&peermsg.Lookup{Corr: 3, Keys: tc.keys}, asker, tc.link)
			res := only[*peermsg.LookupResult](t, o)
			if !errors.Is(res.Err, tc.err) || res.Err == nil != (tc.err == nil) || len(res.Hits) != 1 || res.Hits[0] {
				t.Fatalf("answer %+v", res)
			}
			if len(o.frames) != 0 || len(c.rounds) != 0 || len(o.arm) != 0 {
				t.Fatalf("asked the peer anyway: %+v, rounds %v", o, c.rounds)
			}
		})
	}
}

func TestConsumerFailsAMalformedAnswerOnce(t *testing.T) {
	for _, resp := range []*wire.LookupResp{
		{Hits: []bool{true}, Checksums: []uint32{1}},                                             // one answer for two keys
		{Hits: []bool{true, true}, Checksums: []uint32{1}},                                       // checksums short
		{Hits: []bool{true, true}, Checksums: []uint32{1, 2}, Prov: make([]*wire.Provenance, 1)}, // provenances short
	} {
		c := testConsumer()
		lk := c.lookup(&peermsg.Lookup{Corr: 1, Keys: mkeys("ns", "a", "b")}, asker, readyAt).frames[0].(*wire.Lookup)
		resp.Epoch, resp.Round = 7, lk.Round
		o := c.lookupResp(resp)
		if res := only[*peermsg.LookupResult](t, o); !errors.Is(res.Err, messages.ErrPeerRefused) || res.Hits[0] {
			t.Fatalf("answer %+v", res)
		}
		if !reflect.DeepEqual(o.drops, []string{"malformed"}) || len(c.rounds) != 0 {
			t.Fatalf("%+v; rounds %v", o, c.rounds)
		}
	}
}

func TestConsumerAnswersAFetchOnlyWhenEveryChunkIsInVerifiedAndTheProducerIsDone(t *testing.T) {
	c := testConsumer()
	r := leased(t, c)
	f := fetchAll(t, c, r)
	o := c.arrived(&arrived{round: r.n, chunk: 1})
	if len(o.verify) != 1 || !reflect.DeepEqual(o.verify[0].slots, []int{12}) || !reflect.DeepEqual(o.verify[0].sums, []uint32{3}) {
		t.Fatalf("chunk 1 in: %+v", o)
	}
	noAnswer(t, c.verified(&verified{round: r.n, chunk: 1, ok: []bool{true}}), "chunk 1 verified, chunk 0 on the wire")
	o = c.arrived(&arrived{round: r.n, chunk: 0, last: true})
	noAnswer(t, o, "chunk 0 in, verifying")
	if !reflect.DeepEqual(o.verify[0].slots, []int{10, 11}) {
		t.Fatalf("verify %+v", o.verify)
	}
	noAnswer(t, c.transferDone(&wire.TransferDone{Epoch: 7, Round: r.n, OK: true}), "producer done, chunk 0 verifying")
	res := only[*peermsg.FetchResult](t, c.verified(&verified{round: r.n, chunk: 0, ok: []bool{true, false}}))
	if res.Err != nil || !reflect.DeepEqual(res.OK, []bool{true, false, true}) || res.Bytes != 2*halfChunk || res.Corr != 2 {
		t.Fatalf("fetch answer %+v", res)
	}
	if len(c.rounds) != 0 || f.waiting != 0 {
		t.Fatal("the round must end with its answer")
	}
	if o := c.transferDone(&wire.TransferDone{Epoch: 7, Round: r.n, OK: true}); len(o.answers) != 0 {
		t.Fatal("a late TransferDone answered again")
	}
}

func TestConsumerVerifiedBytesWithoutTheProducersReportEndAtTheDeadline(t *testing.T) {
	c := testConsumer()
	r := leased(t, c)
	fetchAll(t, c, r)
	for chunk, ok := range [][]bool{{true, true}, {true}} {
		c.arrived(&arrived{round: r.n, chunk: chunk})
		noAnswer(t, c.verified(&verified{round: r.n, chunk: chunk, ok: ok}), "verified, no TransferDone")
	}
	if r.phase != roundVerified {
		t.Fatalf("phase %d", r.phase)
	}
	if o := c.deadline(&roundTimer{round: r.n, seq: r.tseq - 1}, readyAt); len(o.answers) != 0 || len(c.rounds) != 1 {
		t.Fatal("a deadline armed for an earlier phase fired")
	}
	o := c.deadline(&roundTimer{round: r.n, seq: r.tseq}, readyAt)
	if res := only[*peermsg.FetchResult](t, o); res.Err != nil || !reflect.DeepEqual(res.OK, []bool{true, true, true}) {
		t.Fatalf("answer %+v", res)
	}
	if !reflect.DeepEqual(o.drops, []string{"transfer_done_missing"}) || o.reset != "" {
		t.Fatalf("%+v", o)
	}
}

func TestConsumerFailedFetchWaitsForItsCanceledChunks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fail  func(c *consumer, r *outRound) consumed
		cause error
	}{
		{"a chunk's transfer fails", func(c *consumer, r *outRound) consumed {
			return c.arrived(&arrived{round: r.n, chunk: 0, c: rdma.Completion{Err: errors.New("reset")}})
		}, messages.ErrPeerUnavailable},
		{"the producer refuses", func(c *consumer, r *outRound) consumed {
			return c.transferDone(&wire.TransferDone{Epoch: 7, Round: r.n, Reason: "lease_lost"})
		}, messages.ErrPeerRefused},
		{"the session is lost", func(c *consumer, r *outRound) consumed {
			return c.failAll(messages.ErrPeerUnavailable)
		}, messages.ErrPeerUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConsumer()
			r := leased(t, c)
			f := fetchAll(t, c, r)
			o := tc.fail(c, r)
			noAnswer(t, o, "chunks still on the wire")
			if len(o.cancel) == 0 || o.cancel[len(o.cancel)-1] != chunkToken(f.token, 1) {
				t.Fatalf("canceled %v, want chunk 1's token", o.cancel)
			}
			last := 1
			if !f.arrived[0] {
				noAnswer(t, c.arrived(&arrived{round: r.n, chunk: 0}), "chunk 0 in, chunk 1 canceled but not in")
			}
			res := only[*peermsg.FetchResult](t, c.arrived(&arrived{round: r.n, chunk: last, c: rdma.Completion{Err: rdma.ErrCanceled}}))
			if !errors.Is(res.Err, tc.cause) || res.OK[0] {
				t.Fatalf("answer %+v, want %v", res, tc.cause)
			}
			if len(c.rounds) != 0 {
				t.Fatal("round kept")
			}
		})
	}
}

func TestConsumerExpectRefusals(t *testing.T) {
	c := testConsumer()
	r := leased(t, c)
	m := &peermsg.Fetch{Corr: 2, Round: r.n, Keys: mkeys("ns", "a", "b", "c"), Slots: []int{10, 11, 12}, Checksums: []uint32{1, 2, 3}}
	_, f, _ := c.startFetch(m, asker, readyAt)
	o := c.fetching(r, f, m, asker, 0, errors.New("no route"))
	if res := only[*peermsg.FetchResult](t, o); !errors.Is(res.Err, messages.ErrPeerUnavailable) || len(o.frames) != 0 || len(c.rounds) != 0 {
		t.Fatalf("nothing announced: %+v, rounds %v", o, c.rounds)
	}

	c = testConsumer()
	r = leased(t, c)
	_, f, _ = c.startFetch(m, asker, readyAt)
	o = c.fetching(r, f, m, asker, 1, errors.New("no route"))
	noAnswer(t, o, "chunk 0 announced, chunk 1 refused")
	if !reflect.DeepEqual(o.cancel, []rdma.Token{chunkToken(f.token, 0)}) {
		t.Fatalf("canceled %v", o.cancel)
	}
	res := only[*peermsg.FetchResult](t, c.arrived(&arrived{round: r.n, chunk: 0, last: true, c: rdma.Completion{Err: rdma.ErrCanceled}}))
	if !errors.Is(res.Err, messages.ErrPeerUnavailable) {
		t.Fatalf("answer %+v", res)
	}
}

func TestConsumerFetchNeedsALeasedRoundOnTheLiveSession(t *testing.T) {
	fetch := func(c *consumer, r *outRound, keys int, l linkNow) *peermsg.FetchResult {
		m := &peermsg.Fetch{Corr: 5, Round: r.n, Keys: mkeys("ns", "a", "b", "c")[:keys], Slots: []int{1, 2, 3}[:keys], Checksums: []uint32{1, 2, 3}}
		got, _, o := c.startFetch(m, asker, l)
		if got != nil {
			t.Fatal("started")
		}
		return only[*peermsg.FetchResult](t, o)
	}
	c := testConsumer()
	r := leased(t, c)
	if res := fetch(c, r, 2, readyAt); !errors.Is(res.Err, messages.ErrBadRequest) || c.rounds[r.n] == nil {
		t.Fatalf("bad request %+v: it must not cost the lease", res)
	}
	if res := fetch(c, r, 3, linkNow{epoch: 8, ready: true}); !errors.Is(res.Err, messages.ErrPeerUnavailable) || c.rounds[r.n] != nil {
		t.Fatalf("another epoch: %+v", res)
	}
	if res := fetch(c, r, 3, readyAt); !errors.Is(res.Err, messages.ErrLeaseLost) {
		t.Fatalf("an ended round: %+v", res)
	}
	c = testConsumer()
	r = leased(t, c)
	if o := c.release(&peermsg.Release{Round: r.n}, readyAt); !reflect.DeepEqual(o.frames, []wire.Frame{&wire.Abort{Epoch: 7, Round: r.n}}) {
		t.Fatalf("release sent %+v", o.frames)
	}
	if res := fetch(c, r, 3, readyAt); !errors.Is(res.Err, messages.ErrLeaseLost) {
		t.Fatalf("a released round: %+v", res)
	}
}

func TestConsumerDeadlineOfAWaitingRoundResetsTheSession(t *testing.T) {
	c := testConsumer()
	lk := c.lookup(&peermsg.Lookup{Corr: 1, Keys: mkeys("ns", "a")}, asker, readyAt).frames[0].(*wire.Lookup)
	r := c.rounds[lk.Round]
	o := c.deadline(&roundTimer{round: r.n, seq: r.tseq}, readyAt)
	if res := only[*peermsg.LookupResult](t, o); !errors.Is(res.Err, messages.ErrPeerTimeout) || o.reset != "round_timeout" {
		t.Fatalf("%+v / %+v", res, o)
	}

	c = testConsumer()
	r = leased(t, c)
	f := fetchAll(t, c, r)
	o = c.deadline(&roundTimer{round: r.n, seq: r.tseq}, readyAt)
	noAnswer(t, o, "fetch deadline with chunks on the wire")
	if o.reset != "round_timeout" || !reflect.DeepEqual(o.frames, []wire.Frame{&wire.Abort{Epoch: 7, Round: r.n}}) || len(o.cancel) != 2 {
		t.Fatalf("%+v", o)
	}
	c.arrived(&arrived{round: r.n, chunk: 0, c: rdma.Completion{Err: rdma.ErrCanceled}})
	res := only[*peermsg.FetchResult](t, c.arrived(&arrived{round: r.n, chunk: 1, last: true, c: rdma.Completion{Err: rdma.ErrCanceled}}))
	if !errors.Is(res.Err, messages.ErrPeerTimeout) || f.waiting != 0 {
		t.Fatalf("%+v", res)
	}
}

func TestConsumerCloseLeavesAFetchOnTheWireToItsLastChunk(t *testing.T) {
	c := testConsumer()
	lookup := c.lookup(&peermsg.Lookup{Corr: 1, Keys: mkeys("ns", "z")}, asker, readyAt)
	_ = lookup
	r := leased(t, c)
	f := fetchAll(t, c, r)
	c.arrived(&arrived{round: r.n, chunk: 0})
	o := c.close()
	if res := only[*peermsg.LookupResult](t, o); !errors.Is(res.Err, messages.ErrPeerUnavailable) {
		t.Fatalf("the lookup: %+v", res)
	}
	if !reflect.DeepEqual(o.cancel, []rdma.Token{chunkToken(f.token, 1)}) {
		t.Fatalf("canceled %v", o.cancel)
	}
	// The next incarnation gets the last chunk's completion: it answers.
	next := testConsumer()
	res := only[*peermsg.FetchResult](t, next.arrived(&arrived{round: r.n, chunk: 1, last: true, corr: 2, asker: asker}))
	if res.Corr != 2 || !errors.Is(res.Err, messages.ErrPeerUnavailable) {
		t.Fatalf("%+v", res)
	}
	if o := next.arrived(&arrived{round: r.n, chunk: 0, corr: 2, asker: asker}); len(o.answers) != 0 {
		t.Fatal("a chunk that is not the last answered")
	}
}

// TestConsumerAnswersEveryAskExactlyOnce drives random interleavings of
// the P2P tier's asks, the producer's frames, the transport's completions,
// verifications, deadlines and session resets, then delivers everything
// still owed, and checks that each peermsg.Lookup and peermsg.Fetch got exactly
// one answer, and a fetch's only after every chunk it announced came in.
func TestConsumerAnswersEveryAskExactlyOnce(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 2))
		c := testConsumer()
		var (
			corr       uint64
			answers    = map[uint64]int{}
			asked      = map[uint64]bool{}
			onWire     = map[uint64]int{} // fetch corr → chunks not yet in
			arrivals   []*arrived
			verifies   []*verified
			leasedN    []uint64
			lookingN   []uint64
			completing = map[uint64]uint64{} // round → its fetch's corr
		)
		apply := func(o consumed) {
			for _, a := range o.answers {
				var ac uint64
				switch m := a.msg.(type) {
				case *peermsg.LookupResult:
					ac = m.Corr
					if m.Err == nil && slices.Contains(m.Hits, true) {
						leasedN = append(leasedN, m.Round)
					}
				case *peermsg.FetchResult:
					ac = m.Corr
					if onWire[ac] != 0 {
						t.Fatalf("seed %d: fetch %d answered with %d chunks on the wire", seed, ac, onWire[ac])
					}
				}
				answers[ac]++
			}
			for _, v := range o.verify {
				verifies = append(verifies, &verified{round: v.round, chunk: v.chunk, ok: make([]bool, len(v.slots))})
			}
			for _, f := range o.frames {
				if lk, ok := f.(*wire.Lookup); ok {
					lookingN = append(lookingN, lk.Round)
				}
			}
		}
		pick := func(list *[]uint64) (uint64, bool) {
			if len(*list) == 0 {
				return 0, false
			}
			i := rng.IntN(len(*list))
			n := (*list)[i]
			*list = append((*list)[:i], (*list)[i+1:]...)
			return n, true
		}
		for step := 0; step < 80; step++ {
			switch rng.IntN(9) {
			case 0:
				corr++
				asked[corr] = true
				apply(c.lookup(&peermsg.Lookup{Corr: corr, Keys: mkeys("ns", "a", "b", "c")}, asker, readyAt))
			case 1:
				if n, ok := pick(&lookingN); ok {
					apply(c.lookupResp(&wire.LookupResp{Epoch: 7, Round: n, Hits: []bool{rng.IntN(3) > 0, true, true}, Checksums: []uint32{1, 2, 3}}))
				}
			case 2:
				if n, ok := pick(&leasedN); ok {
					corr++
					asked[corr] = true
					m := &peermsg.Fetch{Corr: corr, Round: n, Keys: mkeys("ns", "a", "b", "c"), Slots: []int{1, 2, 3}, Checksums: []uint32{1, 2, 3}}
					r, f, o := c.startFetch(m, asker, readyAt)
					apply(o)
					if r != nil {
						announced := f.chunks
						var err error
						if rng.IntN(5) == 0 {
							announced, err = rng.IntN(f.chunks), errors.New("refused")
						}
						onWire[corr] = announced
						completing[n] = corr
						for i := range announced {
							arrivals = append(arrivals, &arrived{round: n, chunk: i, last: i == announced-1, corr: corr, asker: asker})
						}
						apply(c.fetching(r, f, m, asker, announced, err))
					}
				}
			case 3, 4:
				if len(arrivals) > 0 {
					i := rng.IntN(len(arrivals))
					a := arrivals[i]
					arrivals = append(arrivals[:i], arrivals[i+1:]...)
					if rng.IntN(6) == 0 {
						a.c.Err = errors.New("lost")
					}
					onWire[a.corr]--
					apply(c.arrived(a))
				}
			case 5:
				if len(verifies) > 0 {
					v := verifies[0]
					verifies = verifies[1:]
					apply(c.verified(v))
				}
			case 6:
				for n := range completing {
					apply(c.transferDone(&wire.TransferDone{Epoch: 7, Round: n, OK: rng.IntN(4) > 0}))
					break
				}
			case 7:
				for _, r := range c.rounds {
					apply(c.deadline(&roundTimer{round: r.n, seq: r.tseq}, readyAt))
					break
				}
			case 8:
				if rng.IntN(6) == 0 {
					apply(c.failAll(messages.ErrPeerUnavailable))
				}
			}
		}
		// Everything owed comes: completions, verifications, then deadlines.
		for len(arrivals) > 0 || len(verifies) > 0 {
			if len(arrivals) > 0 {
				a := arrivals[0]
				arrivals = arrivals[1:]
				onWire[a.corr]--
				apply(c.arrived(a))
				continue
			}
			v := verifies[0]
			verifies = verifies[1:]
			apply(c.verified(v))
		}
		for len(c.rounds) > 0 {
			for _, r := range c.rounds {
				apply(c.deadline(&roundTimer{round: r.n, seq: r.tseq}, readyAt))
			}
		}
		for a := range asked {
			if answers[a] != 1 {
				t.Fatalf("seed %d: ask %d answered %d times", seed, a, answers[a])
			}
		}
	}
}

// A LookupResp's sizes are each hit's length: passed on when not our slot
// size; a hit longer than our slots is answered as a miss; without sizes,
// every hit is the producer's slot size.
func TestConsumerReadsEachHitsLength(t *testing.T) {
	c := testConsumer()
	lookup := func(l linkNow, sizes []int) (*peermsg.LookupResult, consumed) {
		o := c.lookup(&peermsg.Lookup{Corr: 1, Keys: mkeys("ns", "a", "b", "c", "d")}, asker, l)
		lk := o.frames[0].(*wire.Lookup)
		o = c.lookupResp(&wire.LookupResp{Epoch: 7, Round: lk.Round, Hits: []bool{true, true, false, true},
			Checksums: []uint32{1, 2, 0, 4}, Sizes: sizes})
		return only[*peermsg.LookupResult](t, o), o
	}
	res, o := lookup(readyAt, []int{4096, halfChunk + 1, 0, halfChunk})
	if !reflect.DeepEqual(res.Hits, []bool{true, false, false, true}) || !reflect.DeepEqual(res.Sizes, []int{4096, 0, 0, halfChunk}) ||
		!reflect.DeepEqual(o.drops, []string{"block_too_large"}) {
		t.Fatalf("answer %+v, drops %v", res, o.drops)
	}
	if res, _ := lookup(readyAt, nil); res.Sizes != nil || !reflect.DeepEqual(res.Hits, []bool{true, true, false, true}) {
		t.Fatalf("a producer of our slot size without sizes: %+v", res)
	}
	small := readyAt
	small.peerBlock = 1024
	if res, _ := lookup(small, nil); !reflect.DeepEqual(res.Sizes, []int{1024, 1024, 0, 1024}) {
		t.Fatalf("a producer of smaller slots without sizes: %+v", res)
	}
	large := readyAt
	large.peerBlock = 2 * halfChunk
	if res, _ := lookup(large, nil); !reflect.DeepEqual(res.Hits, []bool{false, false, false, false}) {
		t.Fatalf("a producer of larger slots without sizes: %+v", res)
	}
}

// A fetch of blocks of several lengths: chunks cut by summed bytes, the
// Fetch says the lengths, each chunk is verified at them, and the answer
// counts the good blocks' bytes.
func TestConsumerFetchesBlocksAtTheirLengths(t *testing.T) {
	c := testConsumer()
	r := leased(t, c)
	m := &peermsg.Fetch{Corr: 2, Round: r.n, Keys: mkeys("ns", "a", "b", "c"), Slots: []int{10, 11, 12},
		Checksums: []uint32{1, 2, 3}, Sizes: []int{4096, halfChunk, 0}}
	_, f, _ := c.startFetch(m, asker, readyAt)
	if f == nil || f.chunks != 2 || !reflect.DeepEqual(f.sizes, []int{4096, halfChunk, halfChunk}) {
		t.Fatalf("fetch %+v", f)
	}
	o := c.fetching(r, f, m, asker, f.chunks, nil)
	if fr := o.frames[0].(*wire.Fetch); !reflect.DeepEqual(fr.Sizes, []int{4096, halfChunk, halfChunk}) {
		t.Fatalf("Fetch sizes %v", fr.Sizes)
	}
	o = c.arrived(&arrived{round: r.n, chunk: 0})
	if !reflect.DeepEqual(o.verify[0].sizes, []int{4096, halfChunk}) {
		t.Fatalf("verify %+v", o.verify)
	}
	c.verified(&verified{round: r.n, chunk: 0, ok: []bool{true, true}})
	c.arrived(&arrived{round: r.n, chunk: 1, last: true})
	c.verified(&verified{round: r.n, chunk: 1, ok: []bool{false}})
	res := only[*peermsg.FetchResult](t, c.transferDone(&wire.TransferDone{Epoch: 7, Round: r.n, OK: true}))
	if res.Err != nil || res.Bytes != 4096+halfChunk {
		t.Fatalf("answer %+v, want %d bytes", res, 4096+halfChunk)
	}

	for _, sizes := range [][]int{{4096}, {4096, halfChunk + 1, 1}, {-1, 1, 1}} {
		c := testConsumer()
		r := leased(t, c)
		m := &peermsg.Fetch{Corr: 3, Round: r.n, Keys: mkeys("ns", "a", "b", "c"), Slots: []int{10, 11, 12}, Checksums: []uint32{1, 2, 3}, Sizes: sizes}
		if _, f, o := c.startFetch(m, asker, readyAt); f != nil || !errors.Is(only[*peermsg.FetchResult](t, o).Err, messages.ErrBadRequest) {
			t.Fatalf("sizes %v: %+v", sizes, o)
		}
	}
	if err := refusedFetch("expired"); !errors.Is(err, messages.ErrPeerRefused) || errors.Is(err, ErrBlockTooLarge) {
		t.Fatalf("refusedFetch: %v", err)
	}
}

// A consumer whose pool serves blocks of two sizes (slot ids after its
// grid's are slots of the larger size, rdma.Region.Locate) takes a hit as
// long as its largest slot, and fetches each block into a slot it fits:
// a block longer than its destination slot, or a destination no slot of
// ours has, is refused before anything is expected or sent.
func TestConsumerOfAPoolOfTwoSizesFitsEachBlockToItsSlot(t *testing.T) {
	const grid, large, slots = 4096, 3 * 4096, 12
	region := rdma.Region{Base: make([]byte, grid*slots), SlotBytes: grid, Slots: slots, IDs: slots + slots*grid/large,
		MaxSlotBytes: large, Locate: func(i int) (int, int) {
			if j := i - slots; j >= 0 && j < slots*grid/large {
				return j * large, large
			}
			return 0, 0
		}}
	c := testConsumer()
	c.blockBytes, c.maxBlock, c.region = grid, region.MaxSlot, region
	keys := mkeys("ns", "a", "b", "c")
	lk := c.lookup(&peermsg.Lookup{Corr: 1, Keys: keys}, asker, readyAt).frames[0].(*wire.Lookup)
	if res := only[*peermsg.LookupResult](t, c.lookupResp(&wire.LookupResp{Epoch: 7, Round: lk.Round, Hits: []bool{true, true, true},
		Checksums: []uint32{1, 2, 3}, Sizes: []int{grid, large, large}})); res.Err != nil {
		t.Fatal(res.Err)
	}
	r := c.rounds[lk.Round]
	for name, tc := range map[string]struct {
		slots, sizes []int
		err          error
	}{
		"large blocks into grid slots":                     {[]int{0, 1, 2}, []int{large, large, large}, rdma.ErrBadLength},
		"a grid block in its slot, large blocks in theirs": {[]int{3, slots, slots + 2}, []int{0, large, large}, nil},
		"a slot id past the larger size":                   {[]int{3, slots, slots + 4}, []int{0, large, large}, rdma.ErrBadSlot},
	} {
		m := &peermsg.Fetch{Corr: 2, Round: r.n, Keys: keys, Slots: tc.slots, Checksums: []uint32{1, 2, 3}, Sizes: tc.sizes}
		_, f, o := c.startFetch(m, asker, readyAt)
		if tc.err != nil {
			if res := only[*peermsg.FetchResult](t, o); f != nil || !errors.Is(res.Err, messages.ErrBadRequest) || !errors.Is(res.Err, tc.err) {
				t.Fatalf("%s: %+v, want ErrBadRequest (%v)", name, res, tc.err)
			}
			continue
		}
		if f == nil || !reflect.DeepEqual(f.sizes, []int{grid, large, large}) {
			t.Fatalf("%s: fetch %+v", name, f)
		}
	}

	lk = c.lookup(&peermsg.Lookup{Corr: 5, Keys: keys}, asker, readyAt).frames[0].(*wire.Lookup)
	res := only[*peermsg.LookupResult](t, c.lookupResp(&wire.LookupResp{Epoch: 7, Round: lk.Round, Hits: []bool{true, true, true},
		Checksums: []uint32{1, 2, 3}, Sizes: []int{grid, large, large + 1}}))
	if !reflect.DeepEqual(res.Hits, []bool{true, true, false}) || !reflect.DeepEqual(res.Sizes, []int{grid, large, 0}) {
		t.Fatalf("a hit as long as our larger slots is taken, a longer one is a miss: %+v", res)
	}
}

// Chunks are cut by summed bytes, at least one block each, the same for
// equal sizes as before blocks could differ.
func TestPlanChunks(t *testing.T) {
	for _, tc := range []struct {
		sizes []int
		want  chunkPlan
	}{
		{[]int{halfChunk, halfChunk, halfChunk}, chunkPlan{0, 2, 3}},
		{[]int{ChunkBytes + 1, 1, ChunkBytes}, chunkPlan{0, 1, 2, 3}},
		{[]int{halfChunk, 4096, halfChunk, 4096}, chunkPlan{0, 2, 4}},
		{[]int{4096}, chunkPlan{0, 1}},
		{nil, chunkPlan{0, 0}},
	} {
		if got := planChunks(tc.sizes); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("planChunks(%v) = %v, want %v", tc.sizes, got, tc.want)
		}
	}
	eq := make([]int, 8192)
	for i := range eq {
		eq[i] = 1 << 20
	}
	if p := planChunks(eq); p.count() != 8192/8 {
		t.Errorf("8192 blocks of 1 MiB: %d chunks, want %d", p.count(), 8192/8)
	}
}

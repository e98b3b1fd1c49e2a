package peer

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer/peermsg"
	"github.com/kvtier/kvtier/peer/wire"
	"github.com/kvtier/kvtier/rdma"
	"github.com/kvtier/kvtier/supervision"
)

// consumer is the book of the rounds we started on the peer (we consume):
// a Lookup, then maybe a Fetch whose bytes arrive through the transport
// and are verified. Its methods decide and return a consumed: what the
// Session must do. They touch no actor context, socket or transport, so
// consumer_test.go drives them one event at a time.
//
// Invariants:
//   - a round number is used once in the session's life (across epochs);
//     a frame for an unknown round, or one in another phase, is dropped;
//   - every peermsg.Lookup and peermsg.Fetch is answered exactly once;
//   - a fetch is answered only when no chunk is in flight or verifying
//     (the P2P tier then frees or commits slots nobody writes any more),
//     and, when it succeeds, only after the producer's TransferDone too
//     (so a settled consumer implies a settled producer) or, the bytes
//     being verified, the round's deadline;
//   - a round's deadline is re-armed (its seq bumped) at each phase, so a
//     deadline armed for an earlier phase is ignored.
type consumer struct {
	node       string
	namespaces []string      // ours
	blockBytes int           // a slot of our grid: the length of a block a frame leaves out
	maxBlock   func() int    // the longest block a slot of ours takes now
	region     rdma.Region   // our pool: each fetched block must fit the slot it lands in
	lookupTTL  time.Duration // a Lookup's deadline
	fetchTTL   time.Duration // a Fetch's deadline
	leaseTTL   time.Duration // how long the producer holds a round's hits
	now        func() time.Time
	pc         *peerCounters
	rounds     map[uint64]*outRound
	round      uint64 // last round number used
}

func newConsumer(cfg *Config, node string, pc *peerCounters) *consumer {
	return &consumer{node: node, namespaces: cfg.Namespaces, blockBytes: cfg.BlockBytes, maxBlock: cfg.maxBlock(),
		region: cfg.Region, lookupTTL: cfg.LookupTimeout,
		fetchTTL: cfg.FetchTimeout, leaseTTL: cfg.LeaseTTL, now: cfg.Clock.Now, pc: pc, rounds: map[uint64]*outRound{}}
}

// outRound is one round we started.
type outRound struct {
	n      uint64
	epoch  uint64
	phase  roundPhase
	keys   []messages.Key // asked (namespaces we share)
	index  []int          // position of each asked key in the peermsg.Lookup
	total  int            // keys in the peermsg.Lookup
	corr   uint64         // the P2P tier's peermsg.Lookup / peermsg.Fetch
	asker  fx.Ref
	start  time.Time
	wait   time.Duration     // the deadline to arm
	timer  supervision.Timer // armed by the session
	tseq   uint64
	fetch  *outFetch
	reason error              // why a fetch in flight is failing (cancel requested)
	done   bool               // the producer's TransferDone{OK} came
	prov   []*wire.Provenance // the LookupResp's, per asked key
	// peerBlock is the producer's slot size, from its Welcome: the length
	// of every hit of a LookupResp without sizes.
	peerBlock int
}

type outFetch struct {
	keys      []messages.Key
	slots     []int
	sizes     []int // each block's length, at the start of its slot
	sums      []uint32
	plan      chunkPlan
	token     rdma.Token
	start     time.Time
	chunks    int
	waiting   int    // chunks whose transfer has not completed
	verifying int    // chunks being verified
	arrived   []bool // per chunk
	ok        []bool // per key, once its chunk is verified
}

type roundPhase uint8

const (
	roundLooking roundPhase = iota
	roundLeased
	roundFetching
	roundVerified // bytes verified; waiting for the producer's TransferDone
)

// linkNow is what a consumer decision needs to know of the outbound
// session it runs on.
type linkNow struct {
	epoch     uint64 // the outbound session's epoch
	ready     bool   // its handshake completed, and it is not lost
	draining  bool   // a peermsg.Shutdown: no new rounds
	peerBlock int    // the producer's slot size (its Welcome's block_bytes)
}

func (l linkNow) open() bool { return l.ready && !l.draining }

// consumed is what one consumer decision asks of its session, in this
// order: count the drops, answer the P2P tier, send the frames, cancel
// chunks, verify chunks, arm deadlines (and the heartbeat), log corrupt
// blocks, then end the outbound session when reset says why.
type consumed struct {
	drops     []string
	answers   []answer
	frames    []wire.Frame
	cancel    []rdma.Token
	verify    []verifyChunk
	arm       []*outRound // arm each round's deadline: r.wait, under r.tseq
	heartbeat bool
	corrupt   int // fetched blocks that failed their checksum
	reset     string
}

// answer is a reply to the P2P tier (its asker may be gone: the zero Ref).
type answer struct {
	to  fx.Ref
	msg any
}

// verifyChunk asks the session to check a chunk's slots against their
// checksums, off the mailbox, and report it as verified.
type verifyChunk struct {
	round uint64
	chunk int
	slots []int
	sizes []int
	sums  []uint32
}

func (o *consumed) drop(reason string) { o.drops = append(o.drops, reason) }
func (o *consumed) send(f wire.Frame)  { o.frames = append(o.frames, f) }
func (o *consumed) answer(to fx.Ref, m any) {
	o.answers = append(o.answers, answer{to: to, msg: m})
}

func (c *consumer) arm(o *consumed, r *outRound, d time.Duration) {
	r.tseq++
	r.wait = d
	o.arm = append(o.arm, r)
}

// lookup starts a Lookup round for the keys in namespaces we share.
func (c *consumer) lookup(m *peermsg.Lookup, asker fx.Ref, l linkNow) (o consumed) {
	if !l.open() {
		o.answer(asker, &peermsg.LookupResult{Corr: m.Corr, Node: c.node, Hits: make([]bool, len(m.Keys)),
			Checksums: make([]uint32, len(m.Keys)), Err: messages.ErrPeerUnavailable})
		return o
	}
	r := &outRound{epoch: l.epoch, phase: roundLooking, total: len(m.Keys), corr: m.Corr, asker: asker, start: c.now(), peerBlock: l.peerBlock}
	wk := make([]wire.Key, 0, len(m.Keys))
	for i, k := range m.Keys {
		if !sharedNamespace(c.namespaces, string(k.Namespace)) {
			continue
		}
		r.keys, r.index = append(r.keys, k), append(r.index, i)
		wk = append(wk, wireKey(k))
		if len(wk) == wire.MaxKeys {
			break // the rest count as misses: the next lookup asks again
		}
	}
	c.round++
	r.n = c.round
	c.rounds[r.n] = r
	c.pc.lookups.Add(uint64(len(r.keys)))
	if len(r.keys) == 0 {
		return c.answerLookup(o, r, nil, nil, nil, nil)
	}
	c.arm(&o, r, c.lookupTTL)
	o.heartbeat = true
	o.send(&wire.Lookup{Epoch: r.epoch, Round: r.n, Keys: wk})
	return o
}

// ttlMillis is a Fetch's ttl on the wire: the fetch deadline, in ms, within
// the wire's bounds.
func ttlMillis(d time.Duration) uint32 {
	return uint32(min(max(d.Milliseconds(), 1), wire.MaxFetchTTLms))
}

func wireKey(k messages.Key) wire.Key {
	return wire.Key{Namespace: string(k.Namespace), Hash: []byte(k.Hash), Group: k.Group}
}

// lookupResp: the producer's answer to a Lookup.
func (c *consumer) lookupResp(f *wire.LookupResp) (o consumed) {
	r := c.rounds[f.Round]
	switch {
	case r == nil || r.phase != roundLooking:
		o.drop("stale_round")
		return o
	case len(f.Hits) != len(r.keys) || len(f.Checksums) != len(r.keys):
		o.drop("malformed")
		return c.fail(o, r, fmt.Errorf("%w: lookup answer of %d keys for %d", messages.ErrPeerRefused, len(f.Hits), len(r.keys)))
	case len(f.Prov) != 0 && len(f.Prov) != len(r.keys):
		o.drop("malformed")
		return c.fail(o, r, fmt.Errorf("%w: %d provenances for %d keys", messages.ErrPeerRefused, len(f.Prov), len(r.keys)))
	}
	r.prov = f.Prov
	return c.answerLookup(o, r, f.Hits, f.Checksums, f.Sizes, nil)
}

// answerLookup answers the round's peermsg.Lookup; a round with hits stays
// leased (until a fetch, a release or the lease TTL), others end. A hit is
// sizes[i] bytes long (no sizes: the producer's slot size); one longer than
// any slot of ours cannot be taken and is answered as a miss (the
// producer's lease on it ends with the round).
func (c *consumer) answerLookup(o consumed, r *outRound, hits []bool, sums []uint32, sizes []int, err error) consumed {
	res := &peermsg.LookupResult{Corr: r.corr, Node: c.node, Round: r.n, Hits: make([]bool, r.total),
		Checksums: make([]uint32, r.total), Err: err, RTT: c.now().Sub(r.start)}
	n, tooLarge, uniform, largest := 0, false, true, c.maxBlock()
	got := make([]int, r.total)
	for i, hit := range hits {
		if !hit {
			continue
		}
		size := r.peerBlock
		if len(sizes) != 0 {
			size = sizes[i]
		}
		if size > largest {
			tooLarge = true
			continue
		}
		uniform = uniform && size == c.blockBytes
		got[r.index[i]] = size
		res.Hits[r.index[i]], res.Checksums[r.index[i]] = true, sums[i]
		n++
		if i < len(r.prov) && r.prov[i] != nil {
			if res.Prov == nil {
				res.Prov = make([]*messages.Provenance, r.total)
			}
			res.Prov[r.index[i]] = fromWireProv(r.prov[i])
		}
	}
	if !uniform {
		res.Sizes = got
	}
	if tooLarge {
		o.drop("block_too_large") // NB: once per round, never per block
	}
	c.pc.hits.Add(uint64(n))
	o.answer(r.asker, res)
	if n == 0 {
		c.end(r)
		return o
	}
	r.phase = roundLeased
	// The producer's lease ends at its LeaseTTL: so does our memory of it.
	c.arm(&o, r, c.leaseTTL)
	return o
}

func (c *consumer) end(r *outRound) {
	if r.timer != nil {
		r.timer.Stop()
	}
	delete(c.rounds, r.n)
}

// startFetch checks a peermsg.Fetch of a leased round. It returns the round and
// its fetch to announce to the transport, or nil and the peermsg.Fetch's answer.
func (c *consumer) startFetch(m *peermsg.Fetch, asker fx.Ref, l linkNow) (*outRound, *outFetch, consumed) {
	var o consumed
	fail := func(err error) (*outRound, *outFetch, consumed) {
		o.answer(asker, &peermsg.FetchResult{Corr: m.Corr, Node: c.node, Round: m.Round, OK: make([]bool, len(m.Keys)), Err: err})
		return nil, nil, o
	}
	r := c.rounds[m.Round]
	switch {
	case r == nil || r.phase != roundLeased:
		return fail(fmt.Errorf("%w: round %d not leased", messages.ErrLeaseLost, m.Round))
	case !l.open() || r.epoch != l.epoch:
		c.end(r)
		return fail(messages.ErrPeerUnavailable)
	case len(m.Keys) != len(m.Slots) || len(m.Keys) != len(m.Checksums) || len(m.Keys) > wire.MaxKeys ||
		(m.Sizes != nil && len(m.Sizes) != len(m.Keys)):
		return fail(fmt.Errorf("%w: fetch of %d keys, %d slots, %d checksums, %d sizes", messages.ErrBadRequest,
			len(m.Keys), len(m.Slots), len(m.Checksums), len(m.Sizes)))
	}
	sizes, err := c.lengths(m.Slots, m.Sizes)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", messages.ErrBadRequest, err))
	}
	plan := planChunks(sizes)
	n := plan.count()
	return r, &outFetch{keys: m.Keys, slots: m.Slots, sizes: sizes, sums: m.Checksums, plan: plan, token: rdma.NewToken(),
		start: c.now(), chunks: n, arrived: make([]bool, n), ok: make([]bool, len(m.Keys))}, o
}

// lengths resolves a peermsg.Fetch's block lengths (none, or 0: a slot of
// our grid) and checks each fits the slot of ours it lands in.
func (c *consumer) lengths(slots, sizes []int) ([]int, error) {
	if c.region.Slots == 0 {
		return rdma.Lengths(wholeAsSlot(sizes, c.blockBytes), len(slots), c.blockBytes, c.blockBytes)
	}
	if !c.region.Valid(slots) {
		return nil, fmt.Errorf("fetch into slots %v: not all slots of our pool: %w", slots, rdma.ErrBadSlot)
	}
	if sizes == nil {
		sizes = make([]int, len(slots))
	}
	return c.region.Lengths(slots, wholeAsSlot(sizes, c.blockBytes), 0)
}

// wholeAsSlot reads a peermsg.Fetch's sizes: 0 is a whole slot.
func wholeAsSlot(sizes []int, slot int) []int {
	if sizes == nil {
		return nil
	}
	out := make([]int, len(sizes))
	for i, n := range sizes {
		out[i] = n
		if n == 0 {
			out[i] = slot
		}
	}
	return out
}

// wireSizes is what a Fetch says of its blocks' lengths: nothing when every
// one is our slot size (the producer reads an absent list so).
func wireSizes(sizes []int, ours int) []int {
	for _, n := range sizes {
		if n != ours {
			return sizes
		}
	}
	return nil
}

// fetching: the transport was told to expect the first announced chunks of
// f (all of them unless err says why the next was refused). With none
// announced the fetch fails now; otherwise the Fetch goes out, and a
// refusal fails it once the announced chunks are in (they still complete,
// once, as canceled).
func (c *consumer) fetching(r *outRound, f *outFetch, m *peermsg.Fetch, asker fx.Ref, announced int, err error) (o consumed) {
	if err != nil && announced == 0 {
		c.end(r)
		o.answer(asker, &peermsg.FetchResult{Corr: m.Corr, Node: c.node, Round: m.Round, OK: make([]bool, len(m.Keys)),
			Err: fmt.Errorf("%w: %w", messages.ErrPeerUnavailable, err)})
		return o
	}
	if err != nil {
		r.reason = fmt.Errorf("%w: %w", messages.ErrPeerUnavailable, err)
		for i := range announced {
			o.cancel = append(o.cancel, chunkToken(f.token, i))
		}
	}
	f.waiting = announced
	r.phase, r.corr, r.asker, r.fetch = roundFetching, m.Corr, asker, f
	wk := make([]wire.Key, len(m.Keys))
	for i, k := range m.Keys {
		wk[i] = wireKey(k)
	}
	c.arm(&o, r, c.fetchTTL)
	o.heartbeat = true
	o.send(&wire.Fetch{Epoch: r.epoch, Round: r.n, Keys: wk, Dest: m.Slots, Sizes: wireSizes(f.sizes, c.blockBytes),
		Token: f.token[:], TTLms: ttlMillis(c.fetchTTL)})
	return o
}

// transferDone: the producer's end of a fetch. The consumer answers once
// the bytes are verified AND the producer said done: by then the producer
// has released the round's pins and leases (its release went to its CPU
// tier before the TransferDone).
func (c *consumer) transferDone(f *wire.TransferDone) (o consumed) {
	r := c.rounds[f.Round]
	if r == nil || r.phase < roundFetching {
		o.drop("stale_round")
		return o
	}
	if !f.OK {
		return c.abortFetch(o, r, refusedFetch(f.Reason))
	}
	r.done = true
	return c.checkFetch(o, r)
}

// abortFetch fails a fetch in flight: chunks not yet in are canceled; the
// round is answered once none is outstanding.
func (c *consumer) abortFetch(o consumed, r *outRound, err error) consumed {
	if r.reason == nil {
		r.reason = err
	}
	if r.fetch != nil {
		for i, in := range r.fetch.arrived {
			if !in {
				o.cancel = append(o.cancel, chunkToken(r.fetch.token, i))
			}
		}
	}
	return c.checkFetch(o, r)
}

// checkFetch finishes a fetch once no chunk is in flight or verifying:
// failed, or verified and confirmed by the producer's TransferDone (else it
// waits for it, until the round's deadline).
func (c *consumer) checkFetch(o consumed, r *outRound) consumed {
	f := r.fetch
	if f == nil || f.waiting > 0 || f.verifying > 0 {
		return o
	}
	switch {
	case r.reason != nil:
		return c.finishFetch(o, r, nil, r.reason)
	case r.done:
		return c.finishFetch(o, r, f.ok, nil)
	}
	r.phase = roundVerified
	return o
}

// arrived: the transport no longer touches a chunk's slots.
func (c *consumer) arrived(m *arrived) (o consumed) {
	r := c.rounds[m.round]
	if r == nil || r.phase != roundFetching || r.fetch.arrived[m.chunk] {
		// A previous incarnation's fetch: once its last chunk is in, its
		// slots are free; answer so they get released.
		if m.last {
			o.answer(m.asker, &peermsg.FetchResult{Corr: m.corr, Node: c.node, Round: m.round, Err: messages.ErrPeerUnavailable})
		}
		return o
	}
	f := r.fetch
	f.arrived[m.chunk] = true
	f.waiting--
	switch {
	case m.c.Err != nil:
		return c.abortFetch(o, r, fmt.Errorf("%w: %w", messages.ErrPeerUnavailable, m.c.Err))
	case r.reason != nil:
		return c.checkFetch(o, r)
	}
	f.verifying++
	lo, hi := f.plan.span(m.chunk)
	o.verify = append(o.verify, verifyChunk{round: r.n, chunk: m.chunk, slots: f.slots[lo:hi], sizes: f.sizes[lo:hi], sums: f.sums[lo:hi]})
	return o
}

// verified: a chunk's slots were checked against their checksums.
func (c *consumer) verified(m *verified) (o consumed) {
	r := c.rounds[m.round]
	if r == nil || r.fetch == nil || r.phase != roundFetching {
		return o
	}
	f := r.fetch
	f.verifying--
	lo, _ := f.plan.span(m.chunk)
	copy(f.ok[lo:], m.ok)
	return c.checkFetch(o, r)
}

// finishFetch answers the peermsg.Fetch and ends the round.
func (c *consumer) finishFetch(o consumed, r *outRound, ok []bool, err error) consumed {
	f := r.fetch
	res := &peermsg.FetchResult{Corr: r.corr, Node: c.node, Round: r.n, OK: make([]bool, len(f.keys)), Err: err,
		Duration: c.now().Sub(f.start)}
	good := 0
	for i := range ok {
		if ok[i] {
			res.OK[i] = true
			res.Bytes += int64(f.sizes[i])
			good++
		}
	}
	if bad := len(ok) - good; bad > 0 {
		c.pc.corrupt.Add(uint64(bad))
		o.corrupt += bad
	}
	if err != nil {
		c.pc.failures.Add(1)
	} else {
		c.pc.fetched.Add(uint64(good))
		c.pc.fetchBytes.Add(uint64(res.Bytes))
		c.pc.fetches.Add(1)
		c.pc.fetchNanos.Add(uint64(res.Duration))
	}
	o.answer(r.asker, res)
	c.end(r)
	return o
}

// release: the P2P tier will not fetch a leased round; the producer's
// leases are freed now (an Abort) when the session it was leased on runs.
func (c *consumer) release(m *peermsg.Release, l linkNow) (o consumed) {
	r := c.rounds[m.Round]
	if r == nil || r.phase != roundLeased {
		return o
	}
	if r.epoch == l.epoch && l.ready {
		o.send(&wire.Abort{Epoch: r.epoch, Round: r.n})
	}
	c.end(r)
	return o
}

// releaseLeased releases every leased round (a drain: no fetch will follow).
func (c *consumer) releaseLeased(l linkNow) (o consumed) {
	for _, r := range c.rounds {
		if r.phase == roundLeased {
			p := c.release(&peermsg.Release{Round: r.n}, l)
			o.frames = append(o.frames, p.frames...)
		}
	}
	return o
}

// deadline: a round's deadline passed (seq: the arming it was for). A
// lookup or fetch still waiting on the peer fails, and the outbound session
// is reset: a peer that cannot answer in time is not trusted with the next
// round.
func (c *consumer) deadline(m *roundTimer, l linkNow) (o consumed) {
	r := c.rounds[m.round]
	if r == nil || r.tseq != m.seq {
		return o
	}
	switch r.phase {
	case roundLeased:
		c.end(r) // the producer's lease expired too
	case roundVerified:
		// The bytes are here and verified; only the producer's report is
		// missing (lost, or the producer died after writing).
		o.drop("transfer_done_missing")
		return c.finishFetch(o, r, r.fetch.ok, nil)
	case roundLooking, roundFetching:
		c.pc.failures.Add(1)
		if r.phase == roundFetching && r.epoch == l.epoch {
			o.send(&wire.Abort{Epoch: r.epoch, Round: r.n})
		}
		o = c.fail(o, r, messages.ErrPeerTimeout)
		o.reset = "round_timeout"
	}
	return o
}

// fail fails a round: a lookup is answered at once; a fetch in flight once
// its transfer is canceled (arrived answers).
func (c *consumer) fail(o consumed, r *outRound, err error) consumed {
	switch r.phase {
	case roundLooking:
		return c.answerLookup(o, r, nil, nil, nil, err)
	case roundLeased:
		c.end(r)
	case roundFetching:
		return c.abortFetch(o, r, err)
	case roundVerified:
		return c.finishFetch(o, r, nil, err)
	}
	return o
}

// failAll fails every round (the outbound session ended, or a drain's
// deadline passed).
func (c *consumer) failAll(err error) (o consumed) {
	for _, r := range c.rounds {
		o = c.fail(o, r, err)
	}
	return o
}

// close answers what the session's end leaves unanswered (it stops or
// restarts): lookups fail; a fetch whose chunks are all in, or verified,
// fails now; a fetch with chunks in flight is canceled and answered by the
// last chunk's completion, in the next incarnation (or nobody, when
// stopping), once the transport lets go of its slots.
func (c *consumer) close() (o consumed) {
	for _, r := range c.rounds {
		switch r.phase {
		case roundLooking:
			o = c.answerLookup(o, r, nil, nil, nil, messages.ErrPeerUnavailable)
		case roundFetching:
			if r.fetch.waiting == 0 {
				// Every chunk is in: nothing touches the slots but a
				// verification, whose answer is moot now.
				o.answer(r.asker, &peermsg.FetchResult{Corr: r.corr, Node: c.node, Round: r.n, Err: messages.ErrPeerUnavailable})
				continue
			}
			for i, in := range r.fetch.arrived {
				if !in {
					o.cancel = append(o.cancel, chunkToken(r.fetch.token, i))
				}
			}
		case roundVerified:
			o.answer(r.asker, &peermsg.FetchResult{Corr: r.corr, Node: c.node, Round: r.n, Err: messages.ErrPeerUnavailable})
		}
	}
	return o
}

// waitingOnPeer reports whether a round of ours waits on the peer (the
// heartbeat runs only then).
func (c *consumer) waitingOnPeer() bool {
	for _, r := range c.rounds {
		if r.phase != roundLeased {
			return true
		}
	}
	return false
}

// inFlight counts the rounds that are not merely leased.
func (c *consumer) inFlight() int {
	n := 0
	for _, r := range c.rounds {
		if r.phase != roundLeased {
			n++
		}
	}
	return n
}

// ErrBlockTooLarge: the producer refused a fetch because one of its blocks
// is longer than a slot of ours or its own (TransferDone reason
// "block_too_large"). Wrapped with messages.ErrPeerRefused.
var ErrBlockTooLarge = errors.New("peer: block longer than a slot")

// reasonBlockTooLarge is the TransferDone reason of ErrBlockTooLarge.
const reasonBlockTooLarge = "block_too_large"

// refusedFetch is the error of a TransferDone{ok: false, reason}.
func refusedFetch(reason string) error {
	if reason == reasonBlockTooLarge {
		return fmt.Errorf("%w: %w", messages.ErrPeerRefused, ErrBlockTooLarge)
	}
	return fmt.Errorf("%w: %s", messages.ErrPeerRefused, reason)
}

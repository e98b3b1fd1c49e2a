package peer

import (
	"fmt"
	"time"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer/wire"
	"github.com/kvtier/kvtier/rdma"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
)

// inbound is the session a peer dialed into our ROUTER, and the book of
// its rounds we serve (we are the producer). Its round methods decide and
// return a served: what the Session must do. They touch nothing else — no
// actor context, socket or transport — so producer_test.go drives them one
// event at a time.
//
// Invariants:
//   - a round number is served at most once: a Lookup whose round is not
//     above every earlier one is a replay, dropped;
//   - a round's lease holder is released exactly once (one whose lookup
//     hit nothing holds no lease): when its Fetch is refused, its pin fails, its Abort comes before
//     its write, the session ends or drains with it leased, or its write
//     reports (released with the write's pins, by whichever incarnation of
//     the session gets the report) — never while its write runs. (A round
//     still looking up when its session ends is released then, in case no
//     incarnation gets the answer, and again by the answer: the CPU tier's
//     release is idempotent and holders are never reused);
//   - a fetched round gets exactly one TransferDone; an Abort that comes
//     during the write is acked after it.
type inbound struct {
	node     string // the peer
	epoch    uint64
	hello    *wire.Hello
	welcome  *wire.Welcome
	ready    bool
	shared   map[string]bool // namespaces both sides serve; nil = any
	leaseTTL time.Duration
	now      func() time.Time
	blocks   ourBlocks    // our blocks' lengths and slots' bytes (nil: every block a whole slot of welcome.BlockBytes)
	seal     *wire.Sealer // seals what we send, from our Ready on
	open     *wire.Opener // checks what the peer sends after its Auth
	maxRound uint64
	rounds   map[uint64]*inRound
}

// inRound is one of the peer's rounds we serve.
type inRound struct {
	n       uint64
	holder  messages.Holder
	hits    map[messages.Key]int // leased hits and their lengths, as the LookupResp told
	phase   roundPhase           // looking, leased, fetching (pinning or writing)
	job     messages.JobRef
	keys    []messages.Key // looked-up keys, then the fetched ones
	dest    []int
	sizes   []int // the fetched blocks' lengths
	token   rdma.Token
	expires time.Time // a Fetch's arrival plus its ttl: no write is posted later
	abort   bool      // an Abort came while looking up (end at the answer) or writing (AbortAck when done)
}

// served is what one producer decision asks of its session, in this
// order: count the drops, send the CPU tier its messages (in order), send
// the frames to the peer, start the write.
type served struct {
	drops  []string
	cpu    []cpuMsg
	frames []wire.Frame
	write  *startWrite
}

// cpuMsg is one message to the CPU tier. One with a call is a request
// whose answer comes back to the round (the session numbers it); the rest
// need no answer.
type cpuMsg struct {
	msg  any
	call *cpuCall
}

// cpuCall is what a CPU-tier answer belongs to.
type cpuCall struct {
	epoch  uint64
	round  uint64
	holder messages.Holder // the round's lease holder
	job    messages.JobRef // the pin job, for LeaseToPin
}

// startWrite asks the session to write the round's pinned slots (src) into
// the consumer's; done is the report its last completion sends.
type startWrite struct {
	round *inRound
	src   []int
	done  written
}

func newInbound(node string, h *wire.Hello, w *wire.Welcome, ours []string, leaseTTL time.Duration, now func() time.Time,
	blocks ourBlocks) *inbound {
	return &inbound{node: node, epoch: h.Epoch, hello: h, welcome: w, shared: sharedSet(ours, h.Namespaces),
		leaseTTL: leaseTTL, now: now, blocks: blocks, rounds: map[uint64]*inRound{}}
}

// ourBlocks is what a producer knows of the blocks in our pool.
type ourBlocks interface {
	// blockLen is the length of the block of namespace ns held in slot.
	blockLen(ns string, slot int) int
	// slotBytes is slot's bytes; 0 for an id no slot has.
	slotBytes(slot int) int
}

// length is the length of our block k, held in slot (a slot id of the
// CPU tier: a pool of several block sizes holds each size's blocks in
// slots of that size).
func (in *inbound) length(k messages.Key, slot int) int {
	if in.blocks == nil {
		return in.welcome.BlockBytes
	}
	return in.blocks.blockLen(string(k.Namespace), slot)
}

// slotBytes is the bytes of our slot.
func (in *inbound) slotBytes(slot int) int {
	if in.blocks == nil {
		return in.welcome.BlockBytes
	}
	return in.blocks.slotBytes(slot)
}

func (o *served) drop(reason string)        { o.drops = append(o.drops, reason) }
func (o *served) tell(msg any)              { o.cpu = append(o.cpu, cpuMsg{msg: msg}) }
func (o *served) ask(c cpuCall, msg any)    { o.cpu = append(o.cpu, cpuMsg{msg: msg, call: &c}) }
func (o *served) send(f wire.Frame)         { o.frames = append(o.frames, f) }
func (o *served) release(h messages.Holder) { o.tell(&cpumsg.ReleaseHolder{Holder: h}) }

// lookup serves the peer's Lookup: its keys are leased to the round at
// the CPU tier (the answer comes back to leased). While draining every key
// is a miss, at once, and nothing is leased.
func (in *inbound) lookup(f *wire.Lookup, draining bool) (o served) {
	if f.Round <= in.maxRound {
		o.drop("replayed_round")
		return o
	}
	in.maxRound = f.Round
	if draining {
		o.send(in.allMiss(f.Round, len(f.Keys)))
		return o
	}
	keys := make([]messages.Key, len(f.Keys))
	foreign := false
	for i, k := range f.Keys {
		keys[i] = messages.Key{Namespace: messages.Namespace(k.Namespace), Hash: string(k.Hash), Group: k.Group}
		if in.shared != nil && !in.shared[k.Namespace] {
			// NB: kept in place, as a key no namespace of ours can hit, so
			// that the answer stays positional.
			keys[i].Namespace = ""
			foreign = true
		}
	}
	if foreign {
		o.drop("foreign_namespace_keys")
	}
	r := &inRound{n: f.Round, phase: roundLooking, keys: keys,
		holder: messages.Holder{Origin: messages.OriginPeer, ID: fmt.Sprintf("peer:%s:%x:%d", in.node, in.epoch, f.Round)}}
	in.rounds[r.n] = r
	o.ask(cpuCall{epoch: in.epoch, round: r.n, holder: r.holder},
		&cpumsg.LookupAndLease{Holder: r.holder, Keys: keys, TTL: in.leaseTTL, WantChecksums: true, WantProv: true, WantSlots: true})
	return o
}

func (in *inbound) allMiss(round uint64, n int) *wire.LookupResp {
	return &wire.LookupResp{Epoch: in.epoch, Round: round, Hits: make([]bool, n), Checksums: make([]uint32, n)}
}

// leased answers the peer's Lookup from the CPU tier's answer. A round
// with hits stays leased for the peer's Fetch; one without ends.
func (in *inbound) leased(call cpuCall, m *cpumsg.LookupResult, draining bool) (o served) {
	r := in.roundOf(call)
	switch {
	case r == nil || r.phase != roundLooking:
		// The session ended meanwhile: nothing will fetch.
		o.release(call.holder)
		return o
	case r.abort:
		// The peer gave the round up while we looked (its AbortAck is sent).
		o.release(call.holder)
		delete(in.rounds, r.n)
		return o
	case draining:
		// Stopping: nothing is leased out any more; every key a miss.
		o.release(call.holder)
		delete(in.rounds, r.n)
		o.send(in.allMiss(r.n, len(r.keys)))
		return o
	}
	resp := in.allMiss(r.n, len(r.keys))
	r.hits = map[messages.Key]int{}
	sizes, uniform, leased := make([]int, len(r.keys)), true, false
	for i, st := range m.Status {
		if st != messages.Hit || i >= len(r.keys) || i >= len(m.Checksums) {
			continue
		}
		leased = true
		size := in.length(r.keys[i], slotAt(m.Slots, i))
		if size <= 0 {
			continue // NB: a slot our data plane cannot move (of a size nixl does not serve): a miss, its lease ends with the round
		}
		resp.Hits[i], resp.Checksums[i] = true, m.Checksums[i]
		sizes[i] = size
		uniform = uniform && sizes[i] == in.welcome.BlockBytes
		r.hits[r.keys[i]] = sizes[i]
		if i < len(m.Prov) && m.Prov[i] != nil {
			if resp.Prov == nil {
				resp.Prov = make([]*wire.Provenance, len(r.keys))
			}
			resp.Prov[i] = toWireProv(m.Prov[i])
		}
	}
	if !uniform {
		resp.Sizes = sizes // NB: absent, the consumer reads every hit as our BlockBytes long
	}
	r.keys, r.phase = nil, roundLeased
	if len(r.hits) == 0 {
		delete(in.rounds, r.n) // nothing will be fetched
		if leased {
			o.release(call.holder) // hits it could not serve
		}
	}
	o.send(resp)
	return o
}

// roundOf is the round a CPU answer belongs to, if it still exists.
func (in *inbound) roundOf(c cpuCall) *inRound {
	if in == nil || in.epoch != c.epoch {
		return nil
	}
	return in.rounds[c.round]
}

// fetch serves the peer's Fetch of leased hits into its slots: the leases
// become pins of job (the answer comes back to pinned). A Fetch of a key
// not leased to the round, at another length than the LookupResp said
// (absent sizes: the consumer's BlockBytes each), or into a slot out of
// range or named twice, is refused and ends the round.
func (in *inbound) fetch(f *wire.Fetch, job messages.JobRef) (o served) {
	r := in.rounds[f.Round]
	if r == nil || r.phase != roundLeased {
		o.drop("unknown_round")
		o.send(&wire.TransferDone{Epoch: in.epoch, Round: f.Round, Reason: "unknown_round"})
		return o
	}
	keys := make([]messages.Key, len(f.Keys))
	sizes := make([]int, len(f.Keys))
	seen := make(map[int]bool, len(f.Dest))
	bad := ""
	for i, k := range f.Keys {
		keys[i] = messages.Key{Namespace: messages.Namespace(k.Namespace), Hash: string(k.Hash), Group: k.Group}
		sizes[i] = in.hello.BlockBytes
		if len(f.Sizes) != 0 {
			sizes[i] = f.Sizes[i]
		}
		leased, ok := r.hits[keys[i]]
		switch {
		case !ok:
			bad = "not_leased"
		case f.Dest[i] < 0 || f.Dest[i] >= in.hello.Slots || seen[f.Dest[i]]:
			bad = "bad_slot"
		case sizes[i] != leased:
			bad = "bad_size"
		}
		seen[f.Dest[i]] = true
	}
	if bad != "" {
		o.drop(bad)
		return in.end(o, r, false, bad)
	}
	r.phase, r.keys, r.dest, r.sizes, r.job = roundFetching, keys, f.Dest, sizes, job
	r.expires = in.now().Add(time.Duration(f.TTLms) * time.Millisecond)
	copy(r.token[:], f.Token)
	o.ask(cpuCall{epoch: in.epoch, round: r.n, holder: r.holder, job: job},
		&cpumsg.LeaseToPin{Holder: r.holder, Job: job, Keys: keys})
	return o
}

// pinned starts the write of the pinned slots, or ends the round when its
// leases were lost, its Fetch's ttl has passed, or a pinned block is longer
// than a slot of ours or the consumer's (its pins are released then). in
// is nil when the session ended meanwhile.
func (in *inbound) pinned(call cpuCall, m *cpumsg.PinResult) (o served) {
	r := in.roundOf(call)
	if r == nil || r.phase != roundFetching {
		// Nothing will write these pins: release them and the leases.
		if m.Err == nil {
			o.tell(&cpumsg.ReleaseJob{Job: call.job})
		}
		o.release(call.holder)
		return o
	}
	switch {
	case m.Err != nil:
		return in.end(o, r, false, "lease_lost")
	case !in.now().Before(r.expires):
		// The consumer has given up on this Fetch: a write posted now could
		// land in slots it reused (a one-sided RDMA write cannot be recalled).
		o.drop("expired_fetch")
		o.tell(&cpumsg.ReleaseJob{Job: r.job})
		return in.end(o, r, false, "expired")
	case !in.fits(r, m.Slots):
		// Nothing is written: a block cut to a slot would be a corrupt one.
		o.drop(reasonBlockTooLarge)
		o.tell(&cpumsg.ReleaseJob{Job: r.job})
		return in.end(o, r, false, reasonBlockTooLarge)
	}
	o.write = &startWrite{round: r, src: m.Slots,
		done: written{epoch: in.epoch, round: r.n, job: r.job, holder: r.holder, keys: r.keys}}
	return o
}

// fits reports whether every pinned block of r, at its length in the slot
// it is pinned in, fits that slot and is as long as the Fetch said. (The
// consumer's slots are the consumer's to check: its transport refuses a
// block longer than the slot it lands in, and our transport one longer
// than the consumer's largest slot.)
func (in *inbound) fits(r *inRound, slots []int) bool {
	if len(slots) != len(r.keys) {
		return false
	}
	for i, k := range r.keys {
		if n := in.length(k, slots[i]); n > in.slotBytes(slots[i]) || n != r.sizes[i] {
			return false
		}
	}
	return true
}

// slotAt is slots[i], or -1 where the answer has no slots.
func slotAt(slots []int, i int) int {
	if i < len(slots) {
		return slots[i]
	}
	return -1
}

// writeDone is a write's report: its pins and lease are released whatever
// became of its session (in may be nil or another epoch's); the round, if
// its session still runs, is answered.
func writeDone(in *inbound, m *written) (o served) {
	o.tell(&cpumsg.UnpinKeys{Job: m.job, Keys: m.keys})
	o.release(m.holder)
	if in == nil || in.epoch != m.epoch {
		return o
	}
	r := in.rounds[m.round]
	if r == nil {
		return o
	}
	delete(in.rounds, r.n)
	reason := ""
	if m.c.Err != nil {
		reason = "transfer_failed"
	}
	o.send(&wire.TransferDone{Epoch: m.epoch, Round: r.n, OK: m.c.Err == nil, Reason: reason})
	if r.abort {
		o.send(&wire.AbortAck{Epoch: m.epoch, Round: r.n})
	}
	return o
}

// abort serves the peer's Abort: a leased round ends now; a lookup ends
// at the CPU tier's answer (which holds the leases to release); a write
// ends on its own (the consumer canceled it) and is acked then.
func (in *inbound) abort(f *wire.Abort) (o served) {
	r := in.rounds[f.Round]
	switch {
	case r == nil:
	case r.phase == roundLooking:
		r.abort = true
	case r.phase == roundFetching:
		r.abort = true
		return o
	default:
		o.release(r.holder)
		delete(in.rounds, r.n)
	}
	o.send(&wire.AbortAck{Epoch: f.Epoch, Round: f.Round})
	return o
}

// end ends a round that holds no pins: its leases released, answered.
func (in *inbound) end(o served, r *inRound, ok bool, reason string) served {
	o.release(r.holder)
	delete(in.rounds, r.n)
	o.send(&wire.TransferDone{Epoch: in.epoch, Round: r.n, OK: ok, Reason: reason})
	return o
}

// releaseLeased ends the rounds the peer leased but has not fetched (a
// drain does not wait for a consumer that may be dead: a Fetch that still
// comes is refused as an unknown round).
func (in *inbound) releaseLeased() (o served) {
	for _, r := range in.rounds {
		if r.phase == roundLeased {
			o.release(r.holder)
			delete(in.rounds, r.n)
		}
	}
	return o
}

// close ends the session: the leases of its rounds are released now; the
// pins and leases of writes in flight when their write reports.
func (in *inbound) close() (o served) {
	for _, r := range in.rounds {
		if r.phase != roundFetching {
			o.release(r.holder)
		}
	}
	return o
}

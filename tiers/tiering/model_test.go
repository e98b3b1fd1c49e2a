package tiering

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/supervision/modeltime"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
	"github.com/kvtier/kvtier/tiers/tiering/tieringmsg"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// The tiering core driven through a seeded world: a CPU tier that answers
// in order (one mailbox) and holds a small pool of slots, two secondary
// tiers (one read key by key like fs, one batched like the peers) whose
// answers come back in any order, late, or with every error they can give,
// and deadlines that fire at random (stopped ones too: a timer can fire as
// it is stopped). After every message the world checks what the actor
// promises, and at the end, with every answer delivered, that nothing is
// left held or in flight.
//
// The promises checked:
//   - every tieringmsg.AsyncLookup is answered at once, exactly once, one status per key;
//   - a job is released at most once, and never while a tier read or write
//     into or out of one of its slots is unanswered (a worker still touches
//     it); no tier I/O is sent for a slot its job no longer holds;
//   - a commit covers only slots whose reads have all returned;
//   - a key is never both looked up and promoted; the read budget and the
//     cascade bounds hold per tier;
//   - settled, the core holds nothing: no batch, job, pending answer or
//     budget, every slot back in the pool, every stats and idle query
//     answered.
func TestModelSeeded(t *testing.T) {
	modeltime.Run(t, 150, 400, newWorld, (*world).step, (*world).settle)
}

const (
	modelSlots    = 12
	modelUniverse = 14 // distinct keys the engine asks about
)

// heldSlot is a slot a job holds for a key (a cascade can pin one key
// twice: it was committed twice).
type heldSlot struct {
	key  messages.Key
	slot int
}

// tierIO is a tier request not yet answered, and the slots it touches.
type tierIO struct {
	tier  int
	msg   any
	slots []int
}

type world struct {
	t     *testing.T
	rng   *rand.Rand
	clock *supervision.ManualClock
	core  *State
	cpu   *actor.PID
	tiers []*actor.PID

	slotBytes [][]byte
	slotOf    map[*byte]int
	free      []int
	holder    map[int]messages.JobID        // slot → job holding it (reserved or pinned)
	jobSlots  map[messages.JobID][]heldSlot // job → the slots it holds
	released  map[messages.JobID]int
	touching  map[int]int // slot → tier I/O in flight on it

	cpuQueue []any // CPU-tier requests, processed in order
	tierIO   []tierIO
	timers   modeltime.Timers
	out      fx.Out // what the core decided, carried out by timers.Carry

	responses  []any
	lookupCorr uint64
	stats      []messages.Reply[messages.TieringStats]
	idle       []messages.Reply[struct{}]
}

func newWorld(t *testing.T, seed uint64) *world {
	w := &world{t: t, rng: rand.New(rand.NewPCG(seed, 0x7117)),
		clock:  supervision.NewManualClock(time.Unix(1_700_000_000, 0)),
		cpu:    actor.NewPID("model", "cpu"),
		tiers:  []*actor.PID{actor.NewPID("model", "fs"), actor.NewPID("model", "peers")},
		slotOf: map[*byte]int{}, holder: map[int]messages.JobID{},
		jobSlots: map[messages.JobID][]heldSlot{}, released: map[messages.JobID]int{},
		touching: map[int]int{}}
	for i := range modelSlots {
		b := make([]byte, 8)
		w.slotBytes = append(w.slotBytes, b)
		w.slotOf[&b[0]] = i
		w.free = append(w.free, i)
	}
	w.core = NewState(Config{
		CPU: fx.RefOf(w.cpu),
		Tiers: []Tier{{Name: "fs", Kind: "fs", Ref: fx.RefOf(w.tiers[0])},
			{Name: "peers", Kind: "p2p", Ref: fx.RefOf(w.tiers[1]), Batched: true, NoCascade: true}},
		Slot: func(i int) []byte { return w.slotBytes[i] }, Clock: w.clock,
		CascadeQueue: 6, CascadeInFlight: 3, Log: zerolog.Nop(),
	}.WithDefaults())
	return w
}

func (w *world) Request(to *actor.PID, msg any) {
	if to == w.cpu {
		w.emittedToCPU(msg)
		w.cpuQueue = append(w.cpuQueue, msg)
		return
	}
	tier := w.tierIndex(to)
	io := tierIO{tier: tier, msg: msg}
	switch m := msg.(type) {
	case *tiermsg.Read:
		io.slots = []int{w.heldSlot(m.Dest, "a read")}
	case *tiermsg.ReadBatch:
		for _, d := range m.Dests {
			io.slots = append(io.slots, w.heldSlot(d, "a batched read"))
		}
	case *tiermsg.Write:
		io.slots = []int{w.heldSlot(m.Src, "a cascade write")}
	case *tiermsg.Lookup, *tiermsg.StatsQuery:
	default:
		w.t.Fatalf("unexpected request %T to a tier", msg)
	}
	for _, s := range io.slots {
		w.touching[s]++
	}
	w.tierIO = append(w.tierIO, io)
}

func (w *world) Send(to *actor.PID, msg any) {
	if _, ok := msg.(*tiermsg.Delete); !ok || to == w.cpu {
		w.t.Fatalf("unexpected send %T", msg)
	}
}

func (w *world) Respond(msg any) { w.responses = append(w.responses, msg) }

func (w *world) tierIndex(pid *actor.PID) int {
	for i, p := range w.tiers {
		if p == pid {
			return i
		}
	}
	w.t.Fatalf("request to an unknown actor %v", pid)
	return -1
}

// heldSlot is the slot b is, which a job must hold while tier I/O uses it.
func (w *world) heldSlot(b []byte, what string) int {
	require.NotEmpty(w.t, b, what+" without slot memory")
	s, ok := w.slotOf[&b[0]]
	require.True(w.t, ok, what+" into memory that is no slot")
	_, held := w.holder[s]
	require.True(w.t, held, "%s for slot %d, which no job holds", what, s)
	return s
}

// emittedToCPU checks a CPU-tier request as the core decides to send it.
func (w *world) emittedToCPU(msg any) {
	switch m := msg.(type) {
	case *cpumsg.ReleaseJob:
		w.released[m.Job.ID]++
		require.LessOrEqual(w.t, w.released[m.Job.ID], 1, "job %d released twice", m.Job.ID)
		w.requireUntouched(m.Job.ID, nil, "released")
	case *cpumsg.CommitSlots:
		require.Zero(w.t, w.released[m.Job.ID], "job %d committed after its release", m.Job.ID)
		w.requireUntouched(m.Job.ID, m.Keys, "committed")
	}
}

// requireUntouched: no tier I/O runs on job's slots (those of keys, or all).
func (w *world) requireUntouched(job messages.JobID, keys []messages.Key, what string) {
	for _, h := range w.jobSlots[job] {
		if keys != nil && !containsKey(keys, h.key) {
			continue
		}
		require.Zero(w.t, w.touching[h.slot], "job %d %s while tier I/O still touches slot %d", job, what, h.slot)
	}
}

func containsKey(keys []messages.Key, k messages.Key) bool {
	for _, x := range keys {
		if x == k {
			return true
		}
	}
	return false
}

// handle gives the core one message and checks the state it leaves.
func (w *world) handle(msg any) {
	w.responses = w.responses[:0]
	w.core.Handle(&w.out, msg)
	w.timers.Carry(&w.out, w) // checked message by message, in the order the core decided it
	if m, ok := msg.(*tieringmsg.AsyncLookup); ok {
		require.Len(w.t, w.responses, 1, "an AsyncLookup is answered at once, once")
		r, ok := w.responses[0].(*tieringmsg.AsyncLookupResult)
		require.True(w.t, ok, "answered with %T", w.responses[0])
		require.Equal(w.t, m.Corr, r.Corr)
		require.Len(w.t, r.Status, len(m.Keys))
	} else {
		require.Empty(w.t, w.responses, "only an AsyncLookup is answered in place")
	}
	w.checkState()
}

func (w *world) checkState() {
	s := w.core
	for k := range s.looking {
		p, promoting := s.promoting[k]
		require.False(w.t, promoting && !p.reaped, "key %v both looked up and promoted", k)
	}
	for t := range s.cfg.Tiers {
		require.GreaterOrEqual(w.t, s.reading[t], 0, "read budget of tier %d", t)
		require.LessOrEqual(w.t, s.reading[t], maxReadsPerTier)
		require.GreaterOrEqual(w.t, s.queued[t], 0, "cascade writes of tier %d", t)
		require.LessOrEqual(w.t, s.queued[t], s.cfg.CascadeInFlight)
		require.LessOrEqual(w.t, s.queued[t]+len(s.waiting[t]), s.cfg.CascadeQueue)
	}
}

// step does one random thing: an engine or node input, a CPU answer, a
// tier answer, a deadline, or time passing.
func (w *world) step() {
	switch r := w.rng.IntN(100); {
	case r < 18:
		w.lookup()
	case r < 28:
		w.cascade()
	case r < 48:
		w.answerCPU()
	case r < 78:
		w.answerTier(w.rng.IntN(max(len(w.tierIO), 1)))
	case r < 90:
		w.fireTimer(false)
	case r < 93:
		w.handle(&tieringmsg.TierRefreshed{Tier: w.core.cfg.Tiers[w.rng.IntN(2)].Name})
	case r < 95:
		reply := messages.NewReply[messages.TieringStats]()
		w.stats = append(w.stats, reply)
		w.handle(&tieringmsg.GetStats{Reply: reply})
	case r < 96:
		reply := messages.NewReply[struct{}]()
		w.idle = append(w.idle, reply)
		w.handle(&tieringmsg.Idle{Reply: reply})
	default:
		w.clock.Advance(time.Duration(w.rng.IntN(4)) * time.Second)
	}
}

func (w *world) key() messages.Key { return k(byte(1 + w.rng.IntN(modelUniverse))) }

func (w *world) keys(n int) []messages.Key {
	keys := make([]messages.Key, n)
	for i := range keys {
		keys[i] = w.key()
	}
	return keys
}

func (w *world) lookup() {
	w.lookupCorr++
	var req *messages.ReqContext
	if w.rng.IntN(8) == 0 {
		req = &messages.ReqContext{TierFilter: []string{[]string{"fs", "peers", "none"}[w.rng.IntN(3)]}}
	}
	// NB: distinct keys, as an engine's prefix has.
	first := 1 + w.rng.IntN(modelUniverse)
	n := 1 + w.rng.IntN(5)
	keys := make([]messages.Key, 0, n)
	for i := range n {
		keys = append(keys, k(byte(1+(first+i)%modelUniverse)))
	}
	w.handle(&tieringmsg.AsyncLookup{Corr: w.lookupCorr, Req: req, Keys: keys, Prefix: w.rng.IntN(2) == 0})
}

func (w *world) cascade() {
	keys := w.keys(1 + w.rng.IntN(4))
	sums := make([]uint32, len(keys))
	if w.rng.IntN(20) == 0 {
		sums = sums[1:] // malformed: ignored
	}
	w.handle(&tieringmsg.Cascade{Keys: keys, Checksums: sums})
}

// answerCPU processes the CPU tier's oldest request and hands its answer
// back, as the CPU actor's mailbox would.
func (w *world) answerCPU() {
	if len(w.cpuQueue) == 0 {
		return
	}
	msg := w.cpuQueue[0]
	w.cpuQueue = w.cpuQueue[1:]
	switch m := msg.(type) {
	case *cpumsg.ReserveSlots:
		w.handle(w.reserve(m))
	case *cpumsg.LeaseToPin:
		w.handle(w.pin(m))
	case *cpumsg.CommitSlots:
		w.freeSlots(m.Job.ID, func(h heldSlot) bool { return containsKey(m.Keys, h.key) })
		w.handle(&messages.Ack{Corr: m.Corr})
	case *cpumsg.ReleaseJob:
		w.freeSlots(m.Job.ID, func(h heldSlot) bool {
			require.Zero(w.t, w.touching[h.slot], "slot %d freed under tier I/O", h.slot)
			return true
		})
		w.handle(&messages.Ack{Corr: m.Corr})
	default:
		w.t.Fatalf("unexpected CPU request %T", msg)
	}
}

func (w *world) take(job messages.JobID, keys []messages.Key) ([]int, bool) {
	if len(keys) > len(w.free) {
		return nil, false
	}
	slots := make([]int, len(keys))
	for i, key := range keys {
		s := w.free[len(w.free)-1]
		w.free = w.free[:len(w.free)-1]
		slots[i] = s
		w.holder[s] = job
		w.jobSlots[job] = append(w.jobSlots[job], heldSlot{key: key, slot: s})
	}
	return slots, true
}

// freeSlots gives back job's slots that match.
func (w *world) freeSlots(job messages.JobID, match func(heldSlot) bool) {
	var kept []heldSlot
	for _, h := range w.jobSlots[job] {
		if !match(h) {
			kept = append(kept, h)
			continue
		}
		delete(w.holder, h.slot)
		w.free = append(w.free, h.slot)
	}
	if len(kept) == 0 {
		delete(w.jobSlots, job)
		return
	}
	w.jobSlots[job] = kept
}

func (w *world) reserve(m *cpumsg.ReserveSlots) *cpumsg.ReserveResult {
	if w.released[m.Job.ID] > 0 {
		w.t.Fatalf("job %d reserves after its release", m.Job.ID)
	}
	var toStore []messages.Key
	for _, key := range m.Keys {
		if w.rng.IntN(8) != 0 { // NB: the rest are resident already
			toStore = append(toStore, key)
		}
	}
	slots, ok := w.take(m.Job.ID, toStore)
	if !ok || w.rng.IntN(10) == 0 {
		w.release(m.Job.ID, slots)
		return &cpumsg.ReserveResult{Corr: m.Corr, Err: messages.ErrFull}
	}
	return &cpumsg.ReserveResult{Corr: m.Corr, ToStore: toStore, Slots: slots}
}

func (w *world) pin(m *cpumsg.LeaseToPin) *cpumsg.PinResult {
	slots, ok := w.take(m.Job.ID, m.Keys)
	if !ok || w.rng.IntN(5) == 0 {
		w.release(m.Job.ID, slots)
		return &cpumsg.PinResult{Corr: m.Corr, Job: m.Job, Err: messages.ErrUnknownKey}
	}
	return &cpumsg.PinResult{Corr: m.Corr, Job: m.Job, Slots: slots}
}

// release undoes take's slots (an all-or-nothing request that failed).
func (w *world) release(job messages.JobID, slots []int) {
	w.freeSlots(job, func(h heldSlot) bool {
		for _, s := range slots {
			if s == h.slot {
				return true
			}
		}
		return false
	})
}

var errDisk = errors.New("model: disk error")

// answerTier hands back the answer to the i-th unanswered tier request.
func (w *world) answerTier(i int) {
	if len(w.tierIO) == 0 {
		return
	}
	io := modeltime.Take(&w.tierIO, i)
	for _, s := range io.slots {
		w.touching[s]--
	}
	switch m := io.msg.(type) {
	case *tiermsg.Lookup:
		r := &tiermsg.LookupResult{Corr: m.Corr, Found: make([]bool, len(m.Keys))}
		if w.rng.IntN(10) == 0 {
			r.Err = messages.ErrTierUnavailable
		} else {
			for j := range r.Found {
				r.Found[j] = w.rng.IntN(3) != 0
			}
		}
		w.handle(r)
	case *tiermsg.Read:
		w.handle(&tiermsg.ReadResult{Corr: m.Corr, Key: m.Key, Checksum: 7, Err: w.readErr()})
	case *tiermsg.ReadBatch:
		r := &tiermsg.ReadBatchResult{Corr: m.Corr}
		n := len(m.Keys)
		if w.rng.IntN(10) == 0 {
			n = w.rng.IntN(n + 1) // a short answer: the missing keys fail
		}
		for range n {
			r.Checksums, r.Errs = append(r.Checksums, 7), append(r.Errs, w.readErr())
		}
		w.handle(r)
	case *tiermsg.Write:
		errs := []error{nil, nil, nil, messages.ErrTierFull, messages.ErrTierUnavailable, errDisk}
		w.handle(&tiermsg.WriteResult{Corr: m.Corr, Key: m.Key, Err: errs[w.rng.IntN(len(errs))]})
	case *tiermsg.StatsQuery:
		w.handle(&tiermsg.StatsReply{Corr: m.Corr, Stats: messages.SecondaryStats{Healthy: true}})
	}
}

func (w *world) readErr() error {
	errs := []error{nil, nil, nil, nil, messages.ErrNotFound, messages.ErrTierBusy, messages.ErrChecksum, errDisk}
	return errs[w.rng.IntN(len(errs))]
}

// fireTimer delivers a random deadline that has not fired (modeltime),
// some time later.
func (w *world) fireTimer(settling bool) bool {
	msg, ok := w.timers.Fire(w.rng, settling)
	if ok {
		w.clock.Advance(time.Duration(w.rng.IntN(3)) * time.Second)
		w.handle(msg)
	}
	return ok
}

// settle delivers every answer and every deadline until nothing is in
// flight, then checks that the core holds nothing.
func (w *world) settle() {
	for progress := true; progress; {
		progress = false
		for len(w.cpuQueue) > 0 || len(w.tierIO) > 0 {
			if len(w.cpuQueue) > 0 {
				w.answerCPU()
			}
			if len(w.tierIO) > 0 {
				w.answerTier(w.rng.IntN(len(w.tierIO)))
			}
			progress = true
		}
		if w.fireTimer(true) {
			progress = true
		}
	}
	s := w.core
	require.False(w.t, s.busy(), "settled, yet busy")
	require.Empty(w.t, s.pending, "answers still awaited")
	require.Empty(w.t, s.looking)
	require.Empty(w.t, s.promoting)
	require.Empty(w.t, s.proms)
	require.Empty(w.t, s.cascades)
	for t := range s.cfg.Tiers {
		require.Zero(w.t, s.reading[t], "read budget of tier %d not given back", t)
		require.Zero(w.t, s.queued[t], "cascade writes of tier %d not given back", t)
		require.Empty(w.t, s.readQueue[t])
	}
	require.Empty(w.t, w.jobSlots, "jobs still hold slots")
	require.Len(w.t, w.free, modelSlots, "every slot back in the pool")
	for _, r := range w.stats {
		select {
		case got := <-r.C():
			require.NoError(w.t, got.Err)
			require.Len(w.t, got.Value.Tiers, 2)
		default:
			w.t.Fatal("a stats query was never answered")
		}
	}
	for _, r := range w.idle {
		require.Len(w.t, r.C(), 1, "an idle query was never answered")
	}
}

package tiering

import (
	"errors"
	"fmt"
	"math/bits"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
)

// Tier is one configured secondary tier.
type Tier struct {
	Name string     // in stats, metrics and TierFilter
	Kind string     // tiers.KindFS, tiers.KindObj or p2p.Kind
	PID  *actor.PID // its actor
	// Batched tiers get a promotion as one TierReadBatch (the P2P tier: one
	// fetch round per peer); the others one TierRead per key.
	Batched bool
	// NoCascade: never a cascade target (peers hold their own blocks).
	NoCascade bool
}

// Config is what the tiering actor needs from the node.
type Config struct {
	CPU   *actor.PID       // the CPU tier
	Tiers []Tier           // secondary tiers, in lookup order (at most 63)
	Slot  func(int) []byte // slot bytes, handed to tier workers
	Clock supervision.Clock

	// LookupDeadline bounds a secondary lookup: tiers that have not
	// answered by then count as not holding the key, and the key is a MISS.
	LookupDeadline time.Duration
	// NegativeTTL is how long a key known absent (or whose promotion failed
	// or found no CPU room) answers MISS without a new lookup.
	NegativeTTL time.Duration
	// PromotionTimeout and CascadeTimeout are job deadlines; a job past its
	// deadline is reaped (counted, logged). A job whose tier I/O is still
	// running keeps its slots until that I/O returns: a worker may still
	// touch them.
	PromotionTimeout time.Duration
	CascadeTimeout   time.Duration
	// CascadeQueue bounds, per tier, the blocks waiting to be cascaded
	// (unpinned: a block evicted before its turn is dropped) plus those in
	// flight; blocks beyond it are shed and counted.
	CascadeQueue int
	// CascadeInFlight bounds, per tier, the cascade writes in flight, each
	// holding a pinned slot: the most of the CPU pool a slow tier can pin.
	CascadeInFlight int
	Log             zerolog.Logger
}

// Defaults for Config's zero fields.
const (
	DefaultLookupDeadline   = 2 * time.Second
	DefaultNegativeTTL      = 10 * time.Second
	DefaultPromotionTimeout = 30 * time.Second
	DefaultCascadeTimeout   = 60 * time.Second
	DefaultCascadeQueue     = 4096
	DefaultCascadeInFlight  = 64
)

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	if c.LookupDeadline <= 0 {
		c.LookupDeadline = DefaultLookupDeadline
	}
	if c.NegativeTTL <= 0 {
		c.NegativeTTL = DefaultNegativeTTL
	}
	if c.PromotionTimeout <= 0 {
		c.PromotionTimeout = DefaultPromotionTimeout
	}
	if c.CascadeTimeout <= 0 {
		c.CascadeTimeout = DefaultCascadeTimeout
	}
	if c.CascadeQueue <= 0 {
		c.CascadeQueue = DefaultCascadeQueue
	}
	if c.CascadeInFlight <= 0 {
		c.CascadeInFlight = DefaultCascadeInFlight
	}
	if c.Clock == nil {
		c.Clock = supervision.RealClock{}
	}
	return c
}

// jobBase keeps the tiering actor's job ids apart from every other
// OriginTier job id (messages.JobID documents the ranges).
const jobBase = messages.TieringJobBase

// Actor is the tiering actor.
//
// Invariants:
//   - a key is in at most one of: looking (a lookup batch resolves it),
//     promoting (a promotion job holds its CPU reservation).
//   - every promotion and cascade job ends exactly once, with one
//     ReleaseJob to the CPU tier, sent only when no tier I/O of the job is
//     outstanding (a worker never touches a slot after it was released).
//   - the deadline of each lookup batch and job is a timer message to self;
//     a stale timer (its batch or job gone) is ignored. Reaping is O(that
//     batch or job).
//   - per tier: cascade writes in flight (pinned) ≤ CascadeInFlight, and
//     those plus the blocks waiting (unpinned) ≤ CascadeQueue.
//   - answers to the bridge never wait for a tier.
type Actor struct {
	cfg  Config
	log  zerolog.Logger
	corr uint64
	seq  messages.JobID

	looking   map[messages.Key]*batch
	batches   map[uint64]*batch
	negative  map[messages.Key]negEntry
	promoting map[messages.Key]*promotion
	reading   []int        // per tier: promotion reads in flight (≤ maxReadsPerTier)
	readQueue [][]readTask // per tier: promotion reads waiting for budget, in order
	proms     map[messages.JobID]*promotion
	cascades  map[messages.JobID]*cascade
	queued    []int           // per tier: cascade writes in flight (pinned or being pinned)
	waiting   [][]cascadeItem // per tier: blocks waiting for a cascade slot, oldest first

	pending map[uint64]pendingReply // corr → what the answer belongs to
	waiters []messages.Reply[struct{}]
	stats   messages.TieringStats
}

type negEntry struct {
	absent uint64 // tiers known not to hold the key
	until  time.Time
}

// batch is one lookup started by an AsyncLookup: keys looked up in every
// tier of mask, each tier answering once for the whole batch.
type batch struct {
	id      uint64
	req     *messages.ReqContext
	keys    []messages.Key
	prefix  bool
	mask    uint64 // tiers asked
	waiting uint64 // tiers yet to answer
	found   []uint64
	corrs   map[int]uint64 // tier → corr of its TierLookup, until it answers
	timer   supervision.Timer
}

type promotion struct {
	id          messages.JobID
	tier        int
	req         *messages.ReqContext
	keys        []messages.Key // reserved (ToStore) once the reservation answered
	slots       []int
	sums        []uint32
	ok          []bool
	prov        []*messages.Provenance // per key once a read brought one: its stored provenance
	outstanding int
	issued      int // reads sent to the tier and not yet answered (they hold read budget)
	reserved    bool
	reaped      bool
	timer       supervision.Timer
}

// readTask is one key of a promotion waiting for its tier's read budget.
type readTask struct {
	prom *promotion
	idx  int
}

// maxReadsPerTier bounds the promotion reads in flight to one per-key tier
// (fs, obj): the rest wait here, in order, so a prefix longer than the
// tier's I/O queue is promoted whole instead of overflowing it (reads the
// tier sheds would read as absent). Below the tiers' queue (256), with room
// for cascades (maxInFlight) and lookups.
const maxReadsPerTier = 64

type cascadeItem struct {
	key messages.Key
	sum uint32
}

type cascade struct {
	id          messages.JobID
	tier        int
	keys        []messages.Key
	sums        map[messages.Key]uint32
	pinning     int // LeaseToPin answers awaited
	outstanding int // tier writes awaited
	reaped      bool
	timer       supervision.Timer
}

type replyKind uint8

const (
	replyLookup replyKind = iota + 1
	replyReserve
	replyRead
	replyReadBatch
	replyCommit
	replyPin
	replyWrite
	replyStats
)

type pendingReply struct {
	kind  replyKind
	batch *batch
	tier  int
	prom  *promotion
	idx   int // key index within the promotion, or the pinned key
	cas   *cascade
	key   messages.Key
	stats *statsGather
}

type statsGather struct {
	reply   messages.Reply[messages.TieringStats]
	out     messages.TieringStats
	waiting int
}

// Messages the actor sends itself.
type (
	lookupDeadline    struct{ batch uint64 }
	promotionDeadline struct{ job messages.JobID }
	cascadeDeadline   struct{ job messages.JobID }
)

// Props builds the tiering actor. Its state outlives a supervisor restart
// (the producer hands back the same instance): tier I/O of its jobs may
// still be running into or out of slots, so the jobs that hold those slots
// must survive to release them when the I/O returns.
func Props(cfg Config) *actor.Props {
	a := newActor(cfg.WithDefaults())
	return actor.PropsFromProducer(func() actor.Actor { return a },
		actor.WithReceiverMiddleware(supervision.Faults))
}

func newActor(cfg Config) *Actor {
	n := len(cfg.Tiers)
	a := &Actor{cfg: cfg, log: cfg.Log,
		looking: map[messages.Key]*batch{}, batches: map[uint64]*batch{},
		negative: map[messages.Key]negEntry{}, promoting: map[messages.Key]*promotion{},
		proms: map[messages.JobID]*promotion{}, cascades: map[messages.JobID]*cascade{},
		queued: make([]int, n), waiting: make([][]cascadeItem, n), pending: map[uint64]pendingReply{},
		reading: make([]int, n), readQueue: make([][]readTask, n)}
	a.stats.Promoted, a.stats.PromotionsFailed = map[string]uint64{}, map[string]uint64{}
	a.stats.CascadeWritten, a.stats.CascadeDropped, a.stats.CascadeFailed = map[string]uint64{}, map[string]uint64{}, map[string]uint64{}
	return a
}

// Receive handles one message.
func (a *Actor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *messages.AsyncLookup:
		a.asyncLookup(ctx, m)
	case *messages.Cascade:
		a.cascade(ctx, m)
	case *messages.TierLookupResult:
		a.onTierLookup(ctx, m)
	case *messages.ReserveResult:
		a.onReserve(ctx, m)
	case *messages.TierReadResult:
		a.onRead(ctx, m)
	case *messages.TierReadBatchResult:
		a.onReadBatch(ctx, m)
	case *messages.PinResult:
		a.onPin(ctx, m)
	case *messages.TierWriteResult:
		a.onWrite(ctx, m)
	case *messages.Ack:
		a.onAck(m)
	case *messages.TierStatsReply:
		a.onTierStats(m)
	case *lookupDeadline:
		if b := a.batches[m.batch]; b != nil {
			a.stats.LookupsTimedOut += uint64(len(b.keys))
			a.log.Warn().Int("keys", len(b.keys)).Str("tiers", a.tierNames(b.waiting)).Msg("tiering: secondary lookup deadline passed; missing answers count as absent")
			b.waiting = 0
			a.resolve(ctx, b)
		}
	case *promotionDeadline:
		a.reapPromotion(ctx, m.job)
	case *cascadeDeadline:
		a.reapCascade(ctx, m.job)
	case *messages.TieringIdle:
		a.waiters = append(a.waiters, m.Reply)
	case *messages.GetTieringStats:
		a.gatherStats(ctx, m)
	case *actor.Started, *actor.Restarting, *actor.Stopping, *actor.Stopped, *actor.Restart:
		return
	default:
		a.log.Warn().Str("type", fmt.Sprintf("%T", m)).Msg("tiering: unknown message dropped")
		return
	}
	a.wakeIdle()
}

func (a *Actor) busy() bool {
	if len(a.batches) > 0 || len(a.proms) > 0 || len(a.cascades) > 0 {
		return true
	}
	for _, w := range a.waiting {
		if len(w) > 0 {
			return true
		}
	}
	return false
}

func (a *Actor) wakeIdle() {
	if len(a.waiters) == 0 || a.busy() {
		return
	}
	for _, w := range a.waiters {
		w.Answer(struct{}{}, nil)
	}
	a.waiters = nil
}

// request sends msg built with a fresh corr to pid, remembering what its
// answer belongs to.
func (a *Actor) request(ctx actor.Context, pid *actor.PID, p pendingReply, build func(corr uint64) any) {
	a.corr++
	a.pending[a.corr] = p
	ctx.Request(pid, build(a.corr))
}

func (a *Actor) take(corr uint64, kind replyKind) (pendingReply, bool) {
	p, ok := a.pending[corr]
	if !ok || p.kind != kind {
		return pendingReply{}, false
	}
	delete(a.pending, corr)
	return p, true
}

func (a *Actor) nextJob() messages.JobRef {
	a.seq++
	return messages.JobRef{Origin: messages.OriginTier, ID: jobBase + a.seq}
}

// allowed is the mask of tiers req may load from.
func (a *Actor) allowed(req *messages.ReqContext) uint64 {
	all := uint64(1)<<len(a.cfg.Tiers) - 1
	if req == nil || len(req.TierFilter) == 0 {
		return all
	}
	var mask uint64
	for i, t := range a.cfg.Tiers {
		for _, name := range req.TierFilter {
			if name == t.Name || name == t.Kind {
				mask |= 1 << i
			}
		}
	}
	return mask
}

func (a *Actor) tierNames(mask uint64) string {
	s := ""
	for i, t := range a.cfg.Tiers {
		if mask&(1<<i) != 0 {
			if s != "" {
				s += ","
			}
			s += t.Name
		}
	}
	return s
}

// --- async lookup ---------------------------------------------------------

// asyncLookup answers at once and starts a lookup for the keys nothing is
// known about yet. With Prefix the keys are the tail of a prefix scan: the
// scan stops at the first key known absent, and only the first key's
// status matters to the engine (the rest answer MISS).
func (a *Actor) asyncLookup(ctx actor.Context, m *messages.AsyncLookup) {
	status := make([]messages.LookupStatus, len(m.Keys))
	allowed := a.allowed(m.Req)
	now := a.cfg.Clock.Now()
	var start []messages.Key
	var startMask uint64
	for i, k := range m.Keys {
		st, ask := a.keyStatus(k, allowed, now)
		if st == messages.Miss && m.Prefix {
			break
		}
		if ask != 0 {
			start = append(start, k)
			startMask |= ask
		}
		if !m.Prefix || i == 0 {
			status[i] = st
		}
	}
	if len(start) > 0 {
		a.startBatch(ctx, m.Req, start, m.Prefix, startMask)
	}
	for _, st := range status {
		if st == messages.Retry {
			a.stats.Retries++
		}
	}
	ctx.Respond(&messages.AsyncLookupResult{Corr: m.Corr, Status: status})
}

// keyStatus is k's answer for a request allowed to load from allowed, and
// the tiers to ask when a lookup must start (0: none).
func (a *Actor) keyStatus(k messages.Key, allowed uint64, now time.Time) (messages.LookupStatus, uint64) {
	if allowed == 0 {
		return messages.Miss, 0
	}
	if p, ok := a.promoting[k]; ok && !p.reaped {
		return messages.Retry, 0
	}
	if _, ok := a.looking[k]; ok {
		return messages.Retry, 0
	}
	ask := allowed
	if n, ok := a.negative[k]; ok {
		if now.Before(n.until) {
			ask &^= n.absent
		} else {
			delete(a.negative, k)
		}
	}
	if ask == 0 {
		a.stats.NegativeHits++
		return messages.Miss, 0
	}
	return messages.Retry, ask
}

func (a *Actor) startBatch(ctx actor.Context, req *messages.ReqContext, keys []messages.Key, prefix bool, mask uint64) {
	a.corr++
	b := &batch{id: a.corr, req: req, keys: keys, prefix: prefix, mask: mask, waiting: mask,
		found: make([]uint64, len(keys)), corrs: map[int]uint64{}}
	a.batches[b.id] = b
	for _, k := range keys {
		a.looking[k] = b
	}
	a.stats.LookupsStarted += uint64(len(keys))
	self, root, id := ctx.Self(), ctx.ActorSystem().Root, b.id
	b.timer = a.cfg.Clock.AfterFunc(a.cfg.LookupDeadline, func() { root.Send(self, &lookupDeadline{batch: id}) })
	for i, t := range a.cfg.Tiers {
		if mask&(1<<i) == 0 {
			continue
		}
		a.request(ctx, t.PID, pendingReply{kind: replyLookup, batch: b, tier: i}, func(corr uint64) any {
			b.corrs[i] = corr
			return &messages.TierLookup{Corr: corr, Keys: keys, Req: req}
		})
	}
}

func (a *Actor) onTierLookup(ctx actor.Context, m *messages.TierLookupResult) {
	p, ok := a.take(m.Corr, replyLookup)
	if !ok {
		return
	}
	b := p.batch
	if a.batches[b.id] != b || b.waiting&(1<<p.tier) == 0 {
		return // resolved at its deadline already
	}
	b.waiting &^= 1 << p.tier
	delete(b.corrs, p.tier)
	if m.Err != nil {
		// NB: an unhealthy tier could not tell, and it answers at once, so
		// "ask again" would be RETRY on every engine step, forever. It counts
		// as absent for NegativeTTL: the engine gets MISS on its next step and
		// the tier is asked again once the entry expires.
		a.stats.LookupsUnavailable++
	} else {
		for i := range b.keys {
			if i < len(m.Found) && m.Found[i] {
				b.found[i] |= 1 << p.tier
			}
		}
	}
	if b.waiting == 0 {
		a.resolve(ctx, b)
	}
}

// resolve ends a batch: each key found is promoted from the first tier (in
// configured order) that has it; the rest are cached as absent from the
// tiers that answered. With prefix, promotion stops at the first key no
// tier has.
func (a *Actor) resolve(ctx actor.Context, b *batch) {
	b.timer.Stop()
	delete(a.batches, b.id)
	for _, corr := range b.corrs {
		delete(a.pending, corr) // a tier that never answered: forget the question
	}
	until := a.cfg.Clock.Now().Add(a.cfg.NegativeTTL)
	byTier := map[int][]messages.Key{}
	stopped := false
	for i, k := range b.keys {
		delete(a.looking, k)
		if b.found[i] == 0 {
			a.markAbsent(k, b.mask, until)
			stopped = stopped || b.prefix
			continue
		}
		if stopped {
			continue // beyond a gap of a prefix: not worth a slot now
		}
		t := bits.TrailingZeros64(b.found[i])
		byTier[t] = append(byTier[t], k)
	}
	for t := range a.cfg.Tiers {
		if keys := byTier[t]; len(keys) > 0 {
			a.promote(ctx, b.req, t, keys)
		}
	}
}

func (a *Actor) markAbsent(k messages.Key, tiers uint64, until time.Time) {
	if tiers == 0 {
		return
	}
	n := a.negative[k]
	if a.cfg.Clock.Now().After(n.until) {
		n.absent = 0
	}
	n.absent |= tiers
	n.until = until
	a.negative[k] = n
}

// --- promotion ------------------------------------------------------------

func (a *Actor) promote(ctx actor.Context, req *messages.ReqContext, tier int, keys []messages.Key) {
	ref := a.nextJob()
	p := &promotion{id: ref.ID, tier: tier, req: req, keys: keys}
	a.proms[p.id] = p
	for _, k := range keys {
		a.promoting[k] = p
	}
	self, root := ctx.Self(), ctx.ActorSystem().Root
	p.timer = a.cfg.Clock.AfterFunc(a.cfg.PromotionTimeout, func() { root.Send(self, &promotionDeadline{job: ref.ID}) })
	a.request(ctx, a.cfg.CPU, pendingReply{kind: replyReserve, prom: p}, func(corr uint64) any {
		return &messages.ReserveSlots{Corr: corr, Job: ref, Keys: keys}
	})
}

func (a *Actor) onReserve(ctx actor.Context, m *messages.ReserveResult) {
	p, ok := a.take(m.Corr, replyReserve)
	if !ok {
		return
	}
	prom := p.prom
	ref := messages.JobRef{Origin: messages.OriginTier, ID: prom.id}
	if prom.reaped {
		// Reaped while waiting: whatever was reserved is freed at once.
		ctx.Request(a.cfg.CPU, &messages.ReleaseJob{Job: ref})
		return
	}
	if m.Err != nil {
		a.stats.PromotionsFull += uint64(len(prom.keys))
		until := a.cfg.Clock.Now().Add(a.cfg.NegativeTTL)
		for _, k := range prom.keys {
			a.markAbsent(k, 1<<prom.tier, until)
		}
		a.endPromotion(prom)
		return
	}
	for _, k := range prom.keys {
		delete(a.promoting, k) // keys already present: nothing to do for them
	}
	prom.keys, prom.slots, prom.reserved = m.ToStore, m.Slots, true
	prom.sums, prom.ok = make([]uint32, len(m.ToStore)), make([]bool, len(m.ToStore))
	if len(m.ToStore) == 0 {
		a.endPromotion(prom)
		return
	}
	tier := a.cfg.Tiers[prom.tier]
	if tier.Batched {
		a.readBatch(ctx, prom)
		return
	}
	for i, k := range prom.keys {
		a.promoting[k] = prom
		prom.outstanding++
		a.readQueue[prom.tier] = append(a.readQueue[prom.tier], readTask{prom: prom, idx: i})
	}
	a.pumpReads(ctx, prom.tier)
}

// pumpReads sends waiting promotion reads while tier t has read budget;
// a waiting read of a reaped promotion is dropped, not sent.
func (a *Actor) pumpReads(ctx actor.Context, t int) {
	for a.reading[t] < maxReadsPerTier && len(a.readQueue[t]) > 0 {
		task := a.readQueue[t][0]
		a.readQueue[t] = a.readQueue[t][1:]
		prom := task.prom
		if prom.reaped {
			prom.outstanding--
			a.finishReaped(ctx, prom)
			continue
		}
		a.reading[t]++
		prom.issued++
		k, dest := prom.keys[task.idx], a.cfg.Slot(prom.slots[task.idx])
		a.request(ctx, a.cfg.Tiers[t].PID, pendingReply{kind: replyRead, prom: prom, idx: task.idx}, func(corr uint64) any {
			return &messages.TierRead{Corr: corr, Key: k, Dest: dest}
		})
	}
	if len(a.readQueue[t]) == 0 {
		a.readQueue[t] = nil // let the backing array go
	}
}

// finishReaped ends a reaped promotion once nothing can write its slots.
func (a *Actor) finishReaped(ctx actor.Context, prom *promotion) {
	if prom.outstanding == 0 {
		a.release(ctx, prom.id)
		a.endPromotion(prom)
	}
}

// readBatch asks a batched tier for the whole promotion at once.
func (a *Actor) readBatch(ctx actor.Context, prom *promotion) {
	dests := make([][]byte, len(prom.keys))
	for i, k := range prom.keys {
		a.promoting[k] = prom
		dests[i] = a.cfg.Slot(prom.slots[i])
	}
	prom.outstanding = len(prom.keys)
	keys, slots := prom.keys, prom.slots
	a.request(ctx, a.cfg.Tiers[prom.tier].PID, pendingReply{kind: replyReadBatch, prom: prom}, func(corr uint64) any {
		return &messages.TierReadBatch{Corr: corr, Keys: keys, Slots: slots, Dests: dests}
	})
}

// onReadBatch applies a batched tier's answer key by key, as onRead does.
func (a *Actor) onReadBatch(ctx actor.Context, m *messages.TierReadBatchResult) {
	p, ok := a.take(m.Corr, replyReadBatch)
	if !ok {
		return
	}
	prom := p.prom
	for i, k := range prom.keys {
		res := &messages.TierReadResult{Key: k, Err: fmt.Errorf("%w: no answer for the key", messages.ErrTierUnavailable)}
		if i < len(m.Errs) && i < len(m.Checksums) {
			res.Err, res.Checksum = m.Errs[i], m.Checksums[i]
		}
		if i < len(m.Prov) {
			res.Prov = m.Prov[i]
		}
		a.readDone(ctx, prom, i, res)
	}
}

func (a *Actor) onRead(ctx actor.Context, m *messages.TierReadResult) {
	p, ok := a.take(m.Corr, replyRead)
	if !ok {
		return
	}
	prom := p.prom
	prom.issued--
	if !prom.reaped { // a reaped promotion gave its budget back when reaped
		a.reading[prom.tier]--
	}
	a.readDone(ctx, prom, p.idx, m)
	a.pumpReads(ctx, prom.tier)
}

// readDone records one key's read of a promotion; the last one commits it.
func (a *Actor) readDone(ctx actor.Context, prom *promotion, idx int, m *messages.TierReadResult) {
	prom.outstanding--
	tier := a.cfg.Tiers[prom.tier]
	if m.Err == nil {
		prom.sums[idx], prom.ok[idx] = m.Checksum, true
		if m.Prov != nil {
			if prom.prov == nil {
				prom.prov = make([]*messages.Provenance, len(prom.keys))
			}
			prom.prov[idx] = m.Prov
		}
	} else if errors.Is(m.Err, messages.ErrTierBusy) {
		// Back-pressure, not absence: the slot is freed with the promotion's
		// failed keys and the key is asked for again on the next lookup.
		a.stats.PromotionsBusy++
	} else {
		// No livelock: a failed copy is a miss for this tier until the
		// negative entry expires, and a bad copy is deleted.
		a.stats.PromotionsFailed[tier.Name]++
		a.markAbsent(m.Key, 1<<prom.tier, a.cfg.Clock.Now().Add(a.cfg.NegativeTTL))
		if errors.Is(m.Err, messages.ErrInvalidBlock) || errors.Is(m.Err, messages.ErrChecksum) {
			ctx.Send(tier.PID, &messages.TierDelete{Key: m.Key})
		}
		a.log.Warn().Err(m.Err).Str("tier", tier.Name).Msg("tiering: promotion read failed; key is a miss for this tier")
	}
	if prom.outstanding > 0 {
		return
	}
	if prom.reaped {
		a.release(ctx, prom.id)
		a.endPromotion(prom)
		return
	}
	a.commitPromotion(ctx, prom)
}

// commitPromotion makes the verified blocks readable and frees the slots of
// the rest.
func (a *Actor) commitPromotion(ctx actor.Context, prom *promotion) {
	ref := messages.JobRef{Origin: messages.OriginTier, ID: prom.id}
	var keys []messages.Key
	var sums []uint32
	var prov []*messages.Provenance // the stored provenance, for the stored event: nil when none came
	for i, k := range prom.keys {
		if prom.ok[i] {
			keys, sums = append(keys, k), append(sums, prom.sums[i])
			if prom.prov != nil {
				prov = append(prov, prom.prov[i])
			}
		}
	}
	if len(keys) > 0 {
		tier := a.cfg.Tiers[prom.tier].Name
		n := uint64(len(keys))
		a.request(ctx, a.cfg.CPU, pendingReply{kind: replyCommit, prom: prom}, func(corr uint64) any {
			return &messages.CommitSlots{Corr: corr, Job: ref, Keys: keys, OK: true, Checksums: sums, Ctx: prom.req, Prov: prov}
		})
		a.stats.Promoted[tier] += n
	}
	if len(keys) < len(prom.keys) {
		a.release(ctx, prom.id) // FIFO after the commit: frees only the failed keys
	}
	a.endPromotion(prom)
}

func (a *Actor) endPromotion(prom *promotion) {
	prom.timer.Stop()
	delete(a.proms, prom.id)
	for _, k := range prom.keys {
		if a.promoting[k] == prom {
			delete(a.promoting, k)
		}
	}
}

func (a *Actor) release(ctx actor.Context, id messages.JobID) {
	ctx.Request(a.cfg.CPU, &messages.ReleaseJob{Job: messages.JobRef{Origin: messages.OriginTier, ID: id}})
}

func (a *Actor) reapPromotion(ctx actor.Context, id messages.JobID) {
	prom := a.proms[id]
	if prom == nil || prom.reaped {
		return
	}
	prom.reaped = true
	a.stats.PromotionsReaped++
	a.log.Warn().Uint64("job", uint64(id)).Str("tier", a.cfg.Tiers[prom.tier].Name).Int("keys", len(prom.keys)).
		Int("reads_outstanding", prom.outstanding).Msg("tiering: stalled promotion reaped")
	until := a.cfg.Clock.Now().Add(a.cfg.NegativeTTL)
	for _, k := range prom.keys {
		a.markAbsent(k, 1<<prom.tier, until)
	}
	// Reads sent and unanswered give their budget back now: a tier that
	// never answers them must not starve later promotions.
	a.reading[prom.tier] -= prom.issued
	switch {
	case !prom.reserved:
		// The reservation answer is still to come; onReserve frees it.
		a.endPromotion(prom)
	case prom.outstanding == 0:
		a.release(ctx, id)
		a.endPromotion(prom)
	}
	// Otherwise reads are still running into the reserved slots: the job
	// stays (its keys answer MISS here, HIT_PENDING at the CPU tier) and is
	// released by onRead when the last one returns.
	// Its reads still waiting for budget are dropped (and it ends) here, and
	// the budget it gave back goes to the promotions behind it.
	a.pumpReads(ctx, prom.tier)
}

// --- cascade --------------------------------------------------------------

// cascade queues the newly committed keys for every tier, within each
// tier's queue bound (the rest are shed and counted), and starts what the
// in-flight bound allows.
func (a *Actor) cascade(ctx actor.Context, m *messages.Cascade) {
	if len(m.Keys) == 0 || len(m.Checksums) != len(m.Keys) {
		return
	}
	for t, tier := range a.cfg.Tiers {
		if tier.NoCascade {
			continue
		}
		room := max(a.cfg.CascadeQueue-a.queued[t]-len(a.waiting[t]), 0)
		n := min(room, len(m.Keys))
		if n < len(m.Keys) {
			a.stats.CascadeDropped[tier.Name] += uint64(len(m.Keys) - n)
		}
		for i := range n {
			a.waiting[t] = append(a.waiting[t], cascadeItem{key: m.Keys[i], sum: m.Checksums[i]})
		}
		a.dispatch(ctx, t)
	}
}

// dispatch starts one cascade job for tier t with as many waiting blocks as
// its in-flight bound allows: one pin request for all of them.
func (a *Actor) dispatch(ctx actor.Context, t int) {
	n := min(a.cfg.CascadeInFlight-a.queued[t], len(a.waiting[t]))
	if n <= 0 {
		return
	}
	items := a.waiting[t][:n]
	a.waiting[t] = a.waiting[t][n:]
	if len(a.waiting[t]) == 0 {
		a.waiting[t] = nil // let the backing array go
	}
	ref := a.nextJob()
	c := &cascade{id: ref.ID, tier: t, keys: make([]messages.Key, n), sums: make(map[messages.Key]uint32, n), pinning: 1}
	for i, it := range items {
		c.keys[i], c.sums[it.key] = it.key, it.sum
	}
	a.cascades[c.id] = c
	a.queued[t] += n
	self, root := ctx.Self(), ctx.ActorSystem().Root
	c.timer = a.cfg.Clock.AfterFunc(a.cfg.CascadeTimeout, func() { root.Send(self, &cascadeDeadline{job: ref.ID}) })
	keys := c.keys
	a.request(ctx, a.cfg.CPU, pendingReply{kind: replyPin, cas: c, idx: -1}, func(corr uint64) any {
		return &messages.LeaseToPin{Corr: corr, Job: ref, Keys: keys, WantProv: true}
	})
}

func (a *Actor) onPin(ctx actor.Context, m *messages.PinResult) {
	p, ok := a.take(m.Corr, replyPin)
	if !ok {
		return
	}
	c := p.cas
	c.pinning--
	ref := messages.JobRef{Origin: messages.OriginTier, ID: c.id}
	switch {
	case c.reaped:
		// Pins granted after the reap are dropped by the final release;
		// nothing is written.
		n := 1
		if p.idx < 0 {
			n = len(c.keys)
		}
		a.queued[c.tier] -= n
	case m.Err != nil && p.idx < 0 && len(c.keys) > 1:
		// Some key was evicted before the cascade got to it: pin the others
		// one by one (all-or-nothing pins, so no pin was taken).
		for i, k := range c.keys {
			c.pinning++
			a.request(ctx, a.cfg.CPU, pendingReply{kind: replyPin, cas: c, idx: i}, func(corr uint64) any {
				return &messages.LeaseToPin{Corr: corr, Job: ref, Keys: []messages.Key{k}, WantProv: true}
			})
		}
	case m.Err != nil:
		n := 1
		if p.idx < 0 {
			n = len(c.keys)
		}
		a.stats.CascadeDropped[a.cfg.Tiers[c.tier].Name] += uint64(n)
		a.queued[c.tier] -= n
	default:
		keys := c.keys
		if p.idx >= 0 {
			keys = c.keys[p.idx : p.idx+1]
		}
		a.write(ctx, c, keys, m.Slots, m.Prov)
	}
	a.maybeEndCascade(ctx, c)
}

// write sends the tier one TierWrite per pinned key, with the provenance
// the CPU tier retained for it (prov: per key, or nil), stored in the
// block's header so a promotion announces it in full.
func (a *Actor) write(ctx actor.Context, c *cascade, keys []messages.Key, slots []int, prov []*messages.Provenance) {
	tier := a.cfg.Tiers[c.tier]
	for i, k := range keys {
		c.outstanding++
		src, sum := a.cfg.Slot(slots[i]), c.sums[k]
		var p *messages.Provenance
		if i < len(prov) {
			p = prov[i]
		}
		a.request(ctx, tier.PID, pendingReply{kind: replyWrite, cas: c, key: k}, func(corr uint64) any {
			return &messages.TierWrite{Corr: corr, Key: k, Src: src, Checksum: sum, Prov: p}
		})
	}
}

func (a *Actor) onWrite(ctx actor.Context, m *messages.TierWriteResult) {
	p, ok := a.take(m.Corr, replyWrite)
	if !ok {
		return
	}
	c := p.cas
	c.outstanding--
	a.queued[c.tier]--
	name := a.cfg.Tiers[c.tier].Name
	switch {
	case m.Err == nil:
		a.stats.CascadeWritten[name]++
		if n, ok := a.negative[m.Key]; ok {
			n.absent &^= 1 << c.tier
			a.negative[m.Key] = n
		}
	case errors.Is(m.Err, messages.ErrTierUnavailable), errors.Is(m.Err, messages.ErrTierFull):
		a.stats.CascadeDropped[name]++
	default:
		a.stats.CascadeFailed[name]++
	}
	a.maybeEndCascade(ctx, c)
}

// maybeEndCascade releases the job's pins once nothing of it is awaited.
func (a *Actor) maybeEndCascade(ctx actor.Context, c *cascade) {
	if c.pinning > 0 || c.outstanding > 0 || a.cascades[c.id] != c {
		return
	}
	c.timer.Stop()
	delete(a.cascades, c.id)
	a.release(ctx, c.id)
	a.dispatch(ctx, c.tier)
}

func (a *Actor) reapCascade(ctx actor.Context, id messages.JobID) {
	c := a.cascades[id]
	if c == nil || c.reaped {
		return
	}
	c.reaped = true
	a.stats.CascadesReaped++
	a.log.Warn().Uint64("job", uint64(id)).Str("tier", a.cfg.Tiers[c.tier].Name).Int("keys", len(c.keys)).
		Int("writes_outstanding", c.outstanding).Msg("tiering: stalled cascade reaped")
	// Writes still running keep their pins until they return (a worker is
	// reading those slots); pins still being granted are dropped then too.
}

// --- stats ----------------------------------------------------------------

func (a *Actor) gatherStats(ctx actor.Context, m *messages.GetTieringStats) {
	out := a.stats
	out.Promoted, out.PromotionsFailed = cloneMap(a.stats.Promoted), cloneMap(a.stats.PromotionsFailed)
	out.CascadeWritten, out.CascadeDropped, out.CascadeFailed = cloneMap(a.stats.CascadeWritten), cloneMap(a.stats.CascadeDropped), cloneMap(a.stats.CascadeFailed)
	out.InFlightLookups, out.InFlightPromotions, out.NegativeEntries = len(a.looking), len(a.promoting), len(a.negative)
	for t, q := range a.queued {
		out.InFlightCascades += q + len(a.waiting[t])
	}
	out.LookupDeadline, out.CascadeQueuePerTier = a.cfg.LookupDeadline, a.cfg.CascadeQueue
	out.Tiers = make([]messages.SecondaryStats, len(a.cfg.Tiers))
	g := &statsGather{reply: m.Reply, out: out, waiting: len(a.cfg.Tiers)}
	if g.waiting == 0 {
		m.Reply.Answer(out, nil)
		return
	}
	for i, t := range a.cfg.Tiers {
		g.out.Tiers[i] = messages.SecondaryStats{Name: t.Name, Kind: t.Kind}
		a.request(ctx, t.PID, pendingReply{kind: replyStats, stats: g, tier: i}, func(corr uint64) any {
			return &messages.TierStatsQuery{Corr: corr}
		})
	}
}

func (a *Actor) onTierStats(m *messages.TierStatsReply) {
	p, ok := a.take(m.Corr, replyStats)
	if !ok {
		return
	}
	p.stats.out.Tiers[p.tier] = m.Stats
	if p.stats.waiting--; p.stats.waiting == 0 {
		p.stats.reply.Answer(p.stats.out, nil)
	}
}

func (a *Actor) onAck(m *messages.Ack) {
	if m.Corr == 0 {
		return
	}
	p, ok := a.take(m.Corr, replyCommit)
	if ok && m.Err != nil {
		a.log.Error().Err(m.Err).Uint64("job", uint64(p.prom.id)).Msg("tiering: promotion commit refused")
	}
}

func cloneMap(m map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

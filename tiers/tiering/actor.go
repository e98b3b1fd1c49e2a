package tiering

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
)

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

// jobBase keeps the tiering actor's job ids apart from every other
// OriginTier job id (messages.JobID documents the ranges).
const jobBase = messages.TieringJobBase

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
	case *messages.TierRefreshed:
		a.refreshed(m.Tier)
	case *messages.Cascade:
		a.cascade(ctx, m)
	case *messages.TierLookupResult:
		answer(a, ctx, m.Corr, replyLookup, m, a.onTierLookup)
	case *cpumsg.ReserveResult:
		answer(a, ctx, m.Corr, replyReserve, m, a.onReserve)
	case *messages.TierReadResult:
		answer(a, ctx, m.Corr, replyRead, m, a.onRead)
	case *messages.TierReadBatchResult:
		answer(a, ctx, m.Corr, replyReadBatch, m, a.onReadBatch)
	case *cpumsg.PinResult:
		answer(a, ctx, m.Corr, replyPin, m, a.onPin)
	case *messages.TierWriteResult:
		answer(a, ctx, m.Corr, replyWrite, m, a.onWrite)
	case *messages.Ack:
		answer(a, ctx, m.Corr, replyCommit, m, a.onCommitAck) // corr 0 (a release's ack) is never pending
	case *messages.TierStatsReply:
		answer(a, ctx, m.Corr, replyStats, m, a.onTierStats)
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

// job is what a promotion and a cascade share: tier I/O into or out of CPU
// slots held under one JobID until it ends or its deadline reaps it.
type job struct {
	id          messages.JobID
	tier        int
	keys        []messages.Key
	outstanding int // tier I/O of the job not yet done
	reaped      bool
	timer       supervision.Timer
}

// stalled marks j reaped at its deadline, counts it in reaped and logs it
// with its tier I/O still outstanding (named io); false if it already was.
func (a *Actor) stalled(j *job, reaped *uint64, kind, io string) bool {
	if j.reaped {
		return false
	}
	j.reaped = true
	*reaped++
	a.log.Warn().Uint64("job", uint64(j.id)).Str("tier", a.cfg.Tiers[j.tier].Name).Int("keys", len(j.keys)).
		Int(io, j.outstanding).Msg("tiering: stalled " + kind + " reaped")
	return true
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

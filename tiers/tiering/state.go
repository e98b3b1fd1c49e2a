package tiering

import (
	"fmt"

	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
	"github.com/kvtier/kvtier/tiers/tiering/tieringmsg"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// State is the tiering actor's core: every decision it makes, driven one
// message at a time through Handle, which writes what it decided
// (requests, answers, deadlines) into an fx.Out. The actor is a shell
// that carries the Out out; tests drive the core directly and read its
// Outs.
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
type State struct {
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

// NewState is the core for cfg (defaults already filled).
func NewState(cfg Config) *State {
	n := len(cfg.Tiers)
	s := &State{cfg: cfg, log: cfg.Log,
		looking: map[messages.Key]*batch{}, batches: map[uint64]*batch{},
		negative: map[messages.Key]negEntry{}, promoting: map[messages.Key]*promotion{},
		proms: map[messages.JobID]*promotion{}, cascades: map[messages.JobID]*cascade{},
		queued: make([]int, n), waiting: make([][]cascadeItem, n), pending: map[uint64]pendingReply{},
		reading: make([]int, n), readQueue: make([][]readTask, n)}
	s.stats.Promoted, s.stats.PromotionsFailed = map[string]uint64{}, map[string]uint64{}
	s.stats.CascadeWritten, s.stats.CascadeDropped, s.stats.CascadeFailed = map[string]uint64{}, map[string]uint64{}, map[string]uint64{}
	return s
}

// Handle handles one message.
func (s *State) Handle(o *fx.Out, msg any) {
	switch m := msg.(type) {
	case *tieringmsg.AsyncLookup:
		s.asyncLookup(o, m)
	case *tieringmsg.TierRefreshed:
		s.refreshed(m.Tier)
	case *tieringmsg.Cascade:
		s.cascade(o, m)
	case *tiermsg.LookupResult:
		answer(s, o, m.Corr, replyLookup, m, s.onTierLookup)
	case *cpumsg.ReserveResult:
		answer(s, o, m.Corr, replyReserve, m, s.onReserve)
	case *tiermsg.ReadResult:
		answer(s, o, m.Corr, replyRead, m, s.onRead)
	case *tiermsg.ReadBatchResult:
		answer(s, o, m.Corr, replyReadBatch, m, s.onReadBatch)
	case *cpumsg.PinResult:
		answer(s, o, m.Corr, replyPin, m, s.onPin)
	case *tiermsg.WriteResult:
		answer(s, o, m.Corr, replyWrite, m, s.onWrite)
	case *messages.Ack:
		answer(s, o, m.Corr, replyCommit, m, s.onCommitAck) // corr 0 (a release's ack) is never pending
	case *tiermsg.StatsReply:
		answer(s, o, m.Corr, replyStats, m, s.onTierStats)
	case *lookupDeadline:
		if b := s.batches[m.batch]; b != nil {
			s.stats.LookupsTimedOut += uint64(len(b.keys))
			s.log.Warn().Int("keys", len(b.keys)).Str("tiers", s.tierNames(b.waiting)).Msg("tiering: secondary lookup deadline passed; missing answers count as absent")
			b.waiting = 0
			s.resolve(o, b)
		}
	case *promotionDeadline:
		s.reapPromotion(o, m.job)
	case *cascadeDeadline:
		s.reapCascade(o, m.job)
	case *tieringmsg.Idle:
		s.waiters = append(s.waiters, m.Reply)
	case *tieringmsg.GetStats:
		s.gatherStats(o, m)
	default:
		s.log.Warn().Str("type", fmt.Sprintf("%T", m)).Msg("tiering: unknown message dropped")
		return
	}
	s.wakeIdle(o)
}

func (s *State) busy() bool {
	if len(s.batches) > 0 || len(s.proms) > 0 || len(s.cascades) > 0 {
		return true
	}
	for _, w := range s.waiting {
		if len(w) > 0 {
			return true
		}
	}
	return false
}

func (s *State) wakeIdle(o *fx.Out) {
	if len(s.waiters) == 0 || s.busy() {
		return
	}
	for _, w := range s.waiters {
		reply(o, w, struct{}{}, nil)
	}
	s.waiters = nil
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
func (s *State) stalled(j *job, reaped *uint64, kind, io string) bool {
	if j.reaped {
		return false
	}
	j.reaped = true
	*reaped++
	s.log.Warn().Uint64("job", uint64(j.id)).Str("tier", s.cfg.Tiers[j.tier].Name).Int("keys", len(j.keys)).
		Int(io, j.outstanding).Msg("tiering: stalled " + kind + " reaped")
	return true
}

func (s *State) nextJob() messages.JobRef {
	s.seq++
	return messages.JobRef{Origin: messages.OriginTier, ID: jobBase + s.seq}
}

// allowed is the mask of tiers req may load from.
func (s *State) allowed(req *messages.ReqContext) uint64 {
	all := uint64(1)<<len(s.cfg.Tiers) - 1
	if req == nil || len(req.TierFilter) == 0 {
		return all
	}
	var mask uint64
	for i, t := range s.cfg.Tiers {
		for _, name := range req.TierFilter {
			if name == t.Name || name == t.Kind {
				mask |= 1 << i
			}
		}
	}
	return mask
}

func (s *State) tierNames(mask uint64) string {
	names := ""
	for i, t := range s.cfg.Tiers {
		if mask&(1<<i) != 0 {
			if names != "" {
				names += ","
			}
			names += t.Name
		}
	}
	return names
}

package tiering

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/messages"
)

type statsGather struct {
	reply   messages.Reply[messages.TieringStats]
	out     messages.TieringStats
	waiting int
}

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

func (a *Actor) onTierStats(_ actor.Context, p pendingReply, m *messages.TierStatsReply) {
	p.stats.out.Tiers[p.tier] = m.Stats
	if p.stats.waiting--; p.stats.waiting == 0 {
		p.stats.reply.Answer(p.stats.out, nil)
	}
}

func cloneMap(m map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

package tiering

import (
	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/tiering/tieringmsg"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

type statsGather struct {
	reply   messages.Reply[messages.TieringStats]
	out     messages.TieringStats
	waiting int
}

func (s *State) gatherStats(o *fx.Out, m *tieringmsg.GetStats) {
	out := s.stats
	out.Promoted, out.PromotionsFailed = cloneMap(s.stats.Promoted), cloneMap(s.stats.PromotionsFailed)
	out.CascadeWritten, out.CascadeDropped, out.CascadeFailed = cloneMap(s.stats.CascadeWritten), cloneMap(s.stats.CascadeDropped), cloneMap(s.stats.CascadeFailed)
	out.InFlightLookups, out.InFlightPromotions, out.NegativeEntries = len(s.looking), len(s.promoting), len(s.negative)
	for t, q := range s.queued {
		out.InFlightCascades += q + len(s.waiting[t])
	}
	out.LookupDeadline, out.CascadeQueuePerTier = s.cfg.LookupDeadline, s.cfg.CascadeQueue
	out.Tiers = make([]messages.SecondaryStats, len(s.cfg.Tiers))
	g := &statsGather{reply: m.Reply, out: out, waiting: len(s.cfg.Tiers)}
	if g.waiting == 0 {
		reply(o, m.Reply, out, nil)
		return
	}
	for i, t := range s.cfg.Tiers {
		g.out.Tiers[i] = messages.SecondaryStats{Name: t.Name, Kind: t.Kind}
		s.request(o, t.Ref, pendingReply{kind: replyStats, stats: g, tier: i}, func(corr uint64) any {
			return &tiermsg.StatsQuery{Corr: corr}
		})
	}
}

func (s *State) onTierStats(o *fx.Out, p pendingReply, m *tiermsg.StatsReply) {
	p.stats.out.Tiers[p.tier] = m.Stats
	if p.stats.waiting--; p.stats.waiting == 0 {
		reply(o, p.stats.reply, p.stats.out, nil)
	}
}

func cloneMap(m map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

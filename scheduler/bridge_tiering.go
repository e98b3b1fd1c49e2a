package scheduler

import (
	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/tiering/tieringmsg"
)

// The bridge's side of the secondary tiers: a CPU MISS is put to the
// tiering actor (RETRY while it looks or promotes, MISS once it knows), and
// a successful store commit is cascaded to it. Both are messages; the
// bridge never waits on a tier, and neither counts as pending engine work.

// answerLookup answers an engine Lookup from the CPU tier's statuses,
// first asking the tiering actor about the MISS keys when there is one. A
// prefix scan keeps its semantics: the CPU stopped at its first non-HIT; if
// that is a MISS, the tiering actor gets the tail and its answer for the
// first key (RETRY or MISS) is the scan's stop, the rest stay MISS.
func (b *Bridge) answerLookup(o *fx.Out, m *messages.Lookup, st []messages.LookupStatus) {
	if b.cfg.Tiering.IsZero() {
		reply(o, m.Reply, st, nil)
		return
	}
	var idx []int
	if m.Prefix {
		i := 0
		for i < len(st) && st[i] == messages.Hit {
			i++
		}
		if i < len(st) && st[i] == messages.Miss {
			for j := i; j < len(st); j++ {
				idx = append(idx, j)
			}
		}
	} else {
		for i, s := range st {
			if s == messages.Miss {
				idx = append(idx, i)
			}
		}
	}
	if len(idx) == 0 {
		reply(o, m.Reply, st, nil)
		return
	}
	keys := make([]messages.Key, len(idx))
	for j, i := range idx {
		keys[j] = m.Keys[i]
	}
	b.ask(o, b.cfg.Tiering, pendingCall{kind: waitTiering, lookup: m, tiering: &tieringAsk{st: st, idx: idx}}, func(corr uint64) any {
		return &tieringmsg.AsyncLookup{Corr: corr, Req: m.Req, Keys: keys, Prefix: m.Prefix}
	})
}

// onTiering answers the Lookup with the tiering actor's statuses in place
// of its MISS keys'.
func (b *Bridge) onTiering(o *fx.Out, m *messages.Lookup, t *tieringAsk, res *tieringmsg.AsyncLookupResult) {
	for j, i := range t.idx {
		if j < len(res.Status) {
			t.st[i] = res.Status[j]
		}
	}
	reply(o, m.Reply, t.st, nil)
}

// cascade tells the tiering actor that keys became readable (fire and
// forget).
func (b *Bridge) cascade(o *fx.Out, keys []messages.Key, sums []uint32, req *messages.ReqContext) {
	if b.cfg.Tiering.IsZero() || len(keys) == 0 || len(sums) != len(keys) {
		return
	}
	o.Send(b.cfg.Tiering, &tieringmsg.Cascade{Keys: keys, Checksums: sums, Ctx: req})
}

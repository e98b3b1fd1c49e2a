package scheduler

import (
	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
)

// Slot credit (standalone engines): a session's slots granted ahead of its
// stores, and store jobs opened over them after the engine began copying.
// The CPU tier owns the credit (OriginCredit, the session's number); the
// bridge only issues the store jobs, as for PrepareStore.

func creditOwner(session uint64) messages.JobRef {
	return messages.JobRef{Origin: messages.OriginCredit, ID: messages.JobID(session)}
}

func (b *Bridge) grant(o *fx.Out, m *messages.Grant) {
	if err := b.intakeErr(); err != nil {
		reply(o, m.Reply, messages.CreditGrant{}, err)
		return
	}
	b.ask(o, b.cfg.CPU, pendingCall{kind: waitGrant, grant: m}, func(corr uint64) any {
		return &cpumsg.GrantCredit{Corr: corr, Owner: creditOwner(m.Session), N: m.N, BlockBytes: m.BlockBytes}
	})
}

// storeCredited binds the credited slots to the keys the node does not hold
// yet and opens one store job for those; its completion is the usual
// CompleteStore (or JobDone).
func (b *Bridge) storeCredited(o *fx.Out, m *messages.StoreCredited) {
	err := b.askStoreSlots(o, m.Keys, pendingCall{kind: waitBind, bind: m}, func(corr uint64, job messages.JobRef) any {
		return &cpumsg.BindCredit{Corr: corr, Owner: creditOwner(m.Session), Job: job, Keys: m.Keys, Slots: m.Slots}
	})
	if err != nil {
		reply(o, m.Reply, messages.StoreBound{}, err)
	}
}

func (b *Bridge) onBound(o *fx.Out, p pendingCall, r *cpumsg.CreditBound) {
	m := p.bind
	delete(b.opening, p.id)
	defer b.drained(o)
	if r.Err != nil {
		reply(o, m.Reply, messages.StoreBound{}, r.Err)
		return
	}
	var keys []messages.Key
	var slots []int
	for i, ok := range r.Bound {
		if ok {
			keys, slots = append(keys, m.Keys[i]), append(slots, m.Slots[i])
		}
	}
	res := messages.StoreBound{Bound: r.Bound}
	res.Job, res.Workers = b.openStore(o, p.id, m.Req, m.Keys, keys, slots)
	reply(o, m.Reply, res, nil)
}

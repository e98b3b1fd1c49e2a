package scheduler

import (
	"github.com/asynkron/protoactor-go/actor"

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

func (b *Bridge) grant(ctx actor.Context, m *messages.Grant) {
	fail := func(err error) { m.Reply.Answer(messages.CreditGrant{}, err) }
	if err := b.intakeErr(); err != nil {
		fail(err)
		return
	}
	askCPU(b, ctx, func(corr uint64) any {
		return &cpumsg.GrantCredit{Corr: corr, Owner: creditOwner(m.Session), N: m.N}
	}, func(r *cpumsg.CreditGranted) {
		m.Reply.Answer(messages.CreditGrant{Slots: r.Slots, Evicted: r.Evicted}, nil)
	}, fail)
}

// storeCredited binds the credited slots to the keys the node does not hold
// yet and opens one store job for those; its completion is the usual
// CompleteStore (or JobDone).
func (b *Bridge) storeCredited(ctx actor.Context, m *messages.StoreCredited) {
	fail := func(err error) { m.Reply.Answer(messages.StoreBound{}, err) }
	id, err := b.admit(m.Keys)
	if err != nil {
		fail(err)
		return
	}
	ref := messages.JobRef{Origin: messages.OriginEngine, ID: id}
	askCPU(b, ctx, func(corr uint64) any {
		return &cpumsg.BindCredit{Corr: corr, Owner: creditOwner(m.Session), Job: ref, Keys: m.Keys, Slots: m.Slots}
	}, func(r *cpumsg.CreditBound) {
		if r.Err != nil {
			fail(r.Err)
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
		if len(keys) > 0 {
			j := b.openStore(ctx, id, m.Req, m.Keys, keys, slots)
			res.Job, res.Workers = id, len(j.reported)
		}
		m.Reply.Answer(res, nil)
	}, fail)
}

package cpu

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
)

// releaseCredit frees a credit once its quarantine has passed.
type releaseCredit struct{ owner messages.JobRef }

func (a *Actor) grant(ctx actor.Context, m *cpumsg.GrantCredit) {
	gi, err := a.geometryFor(m.BlockBytes, nil)
	if err != nil {
		a.log.Warn().Err(err).Int("block_bytes", m.BlockBytes).Msg("cpu tier: no credit for a geometry the pool cannot serve")
		ctx.Respond(&cpumsg.CreditGranted{Corr: m.Corr, Owner: m.Owner})
		return
	}
	slots, evicted := a.state.GrantIn(gi, m.Owner, m.N)
	if len(evicted) > 0 {
		a.announce(ctx, messages.Event{Kind: messages.BlockRemoved, Keys: evicted})
	}
	ctx.Respond(&cpumsg.CreditGranted{Corr: m.Corr, Owner: m.Owner, Slots: slots, Evicted: evicted})
}

func (a *Actor) bind(ctx actor.Context, m *cpumsg.BindCredit) {
	bound, err := a.state.Bind(m.Owner, m.Job, m.Keys, m.Slots)
	if err == nil {
		writing := make([]messages.Key, 0, len(m.Keys))
		for i, k := range m.Keys {
			if bound[i] {
				writing = append(writing, k)
			}
		}
		a.note(ctx, messages.BlockWriting, writing)
	}
	ctx.Respond(&cpumsg.CreditBound{Corr: m.Corr, Bound: bound, Err: err})
}

// releaseCreditAfter keeps an ended session's credit out of use for the
// quarantine (a worker may still be copying into a credited slot), then
// frees it.
func (a *Actor) releaseCreditAfter(ctx actor.Context, m *cpumsg.ReleaseCredit) {
	if m.Quarantine <= 0 {
		a.state.ReleaseCredit(m.Owner)
		return
	}
	self, root, msg := ctx.Self(), ctx.ActorSystem().Root, &releaseCredit{owner: m.Owner}
	clock := a.clock
	if clock == nil {
		clock = supervision.RealClock{}
	}
	clock.AfterFunc(m.Quarantine, func() { root.Send(self, msg) })
}

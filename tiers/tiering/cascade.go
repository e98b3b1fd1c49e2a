package tiering

import (
	"errors"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
)

type cascadeItem struct {
	key messages.Key
	sum uint32
}

type cascade struct {
	job     // outstanding: tier writes awaited
	sums    map[messages.Key]uint32
	pinning int // LeaseToPin answers awaited
}

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
	c := &cascade{job: job{id: ref.ID, tier: t, keys: make([]messages.Key, n)}, sums: make(map[messages.Key]uint32, n), pinning: 1}
	for i, it := range items {
		c.keys[i], c.sums[it.key] = it.key, it.sum
	}
	a.cascades[c.id] = c
	a.queued[t] += n
	c.timer = a.after(ctx, a.cfg.CascadeTimeout, &cascadeDeadline{job: ref.ID})
	keys := c.keys
	a.request(ctx, a.cfg.CPU, pendingReply{kind: replyPin, cas: c, idx: -1}, func(corr uint64) any {
		return &cpumsg.LeaseToPin{Corr: corr, Job: ref, Keys: keys, WantProv: true}
	})
}

func (a *Actor) onPin(ctx actor.Context, p pendingReply, m *cpumsg.PinResult) {
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
				return &cpumsg.LeaseToPin{Corr: corr, Job: ref, Keys: []messages.Key{k}, WantProv: true}
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

func (a *Actor) onWrite(ctx actor.Context, p pendingReply, m *messages.TierWriteResult) {
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
	if c := a.cascades[id]; c != nil {
		a.stalled(&c.job, &a.stats.CascadesReaped, "cascade", "writes_outstanding")
	}
	// Writes still running keep their pins until they return (a worker is
	// reading those slots); pins still being granted are dropped then too.
}

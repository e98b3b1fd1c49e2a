package tiering

import (
	"math/bits"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
)

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
	b.timer = a.after(ctx, a.cfg.LookupDeadline, &lookupDeadline{batch: b.id})
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

func (a *Actor) onTierLookup(ctx actor.Context, p pendingReply, m *messages.TierLookupResult) {
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

// refreshed drops the absences cached for the named tier: it may hold
// more now. O(negative entries), for an event as rare as a peer coming up.
func (a *Actor) refreshed(name string) {
	for i, t := range a.cfg.Tiers {
		if t.Name != name {
			continue
		}
		bit := uint64(1) << i
		for k, n := range a.negative {
			if n.absent&bit != 0 {
				if n.absent &^= bit; n.absent == 0 {
					delete(a.negative, k)
				} else {
					a.negative[k] = n
				}
			}
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

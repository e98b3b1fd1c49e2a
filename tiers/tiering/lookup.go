package tiering

import (
	"math/bits"
	"time"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/tiering/tieringmsg"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// negEntry is what the negative cache remembers of one key: two marks,
// each with its own expiry, so that a short no-room mark neither shortens
// nor is lengthened by a tier's absence.
type negEntry struct {
	absent negMark // tiers known not to hold the key (or whose promotion failed)
	noRoom negMark // tiers whose promotion of the key found no CPU room
}

// negMark is a set of tiers not to ask, until a time.
type negMark struct {
	tiers uint64
	until time.Time
}

// add marks tiers until then; a mark already expired at now is forgotten
// first.
func (m *negMark) add(tiers uint64, until, now time.Time) {
	if now.After(m.until) {
		m.tiers = 0
	}
	m.tiers |= tiers
	m.until = until
}

// skip is the tiers not to ask at now, and whether anything of the entry
// is still in force.
func (n negEntry) skip(now time.Time) (tiers uint64, live bool) {
	for _, m := range [...]negMark{n.absent, n.noRoom} {
		if now.Before(m.until) {
			tiers |= m.tiers
			live = true
		}
	}
	return tiers, live
}

// batch is one lookup started by an tieringmsg.AsyncLookup: keys looked up in every
// tier of mask, each tier answering once for the whole batch.
type batch struct {
	id      uint64
	req     *messages.ReqContext
	keys    []messages.Key
	prefix  bool
	mask    uint64 // tiers asked
	waiting uint64 // tiers yet to answer
	found   []uint64
	corrs   map[int]uint64 // tier → corr of its tiermsg.Lookup, until it answers
	timer   supervision.Timer
}

// asyncLookup answers at once and starts a lookup for the keys nothing is
// known about yet. With Prefix the keys are the tail of a prefix scan: the
// scan stops at the first key known absent, and only the first key's
// status matters to the engine (the rest answer MISS).
func (s *State) asyncLookup(o *fx.Out, m *tieringmsg.AsyncLookup) {
	status := make([]messages.LookupStatus, len(m.Keys))
	allowed := s.allowed(m.Req)
	now := s.cfg.Clock.Now()
	var start []messages.Key
	var startMask uint64
	for i, k := range m.Keys {
		st, ask := s.keyStatus(k, allowed, now)
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
		s.startBatch(o, m.Req, start, m.Prefix, startMask)
	}
	for _, st := range status {
		if st == messages.Retry {
			s.stats.Retries++
		}
	}
	o.Respond(&tieringmsg.AsyncLookupResult{Corr: m.Corr, Status: status})
}

// keyStatus is k's answer for a request allowed to load from allowed, and
// the tiers to ask when a lookup must start (0: none).
func (s *State) keyStatus(k messages.Key, allowed uint64, now time.Time) (messages.LookupStatus, uint64) {
	if allowed == 0 {
		return messages.Miss, 0
	}
	if p, ok := s.promoting[k]; ok && !p.reaped {
		return messages.Retry, 0
	}
	if _, ok := s.looking[k]; ok {
		return messages.Retry, 0
	}
	ask := allowed
	if n, ok := s.negative[k]; ok {
		if skip, live := n.skip(now); live {
			ask &^= skip
		} else {
			delete(s.negative, k)
		}
	}
	if ask == 0 {
		s.stats.NegativeHits++
		return messages.Miss, 0
	}
	return messages.Retry, ask
}

func (s *State) startBatch(o *fx.Out, req *messages.ReqContext, keys []messages.Key, prefix bool, mask uint64) {
	s.corr++
	b := &batch{id: s.corr, req: req, keys: keys, prefix: prefix, mask: mask, waiting: mask,
		found: make([]uint64, len(keys)), corrs: map[int]uint64{}}
	s.batches[b.id] = b
	for _, k := range keys {
		s.looking[k] = b
	}
	s.stats.LookupsStarted += uint64(len(keys))
	b.timer = o.After(s.cfg.LookupDeadline, &lookupDeadline{batch: b.id})
	for i, t := range s.cfg.Tiers {
		if mask&(1<<i) == 0 {
			continue
		}
		s.request(o, t.Ref, pendingReply{kind: replyLookup, batch: b, tier: i}, func(corr uint64) any {
			b.corrs[i] = corr
			return &tiermsg.Lookup{Corr: corr, Keys: keys, Req: req}
		})
	}
}

func (s *State) onTierLookup(o *fx.Out, p pendingReply, m *tiermsg.LookupResult) {
	b := p.batch
	if s.batches[b.id] != b || b.waiting&(1<<p.tier) == 0 {
		return // resolved at its deadline already
	}
	b.waiting &^= 1 << p.tier
	delete(b.corrs, p.tier)
	if m.Err != nil {
		// NB: an unhealthy tier could not tell, and it answers at once, so
		// "ask again" would be RETRY on every engine step, forever. It counts
		// as absent for NegativeTTL: the engine gets MISS on its next step and
		// the tier is asked again once the entry expires.
		s.stats.LookupsUnavailable++
	} else {
		for i := range b.keys {
			if i < len(m.Found) && m.Found[i] {
				b.found[i] |= 1 << p.tier
			}
		}
	}
	if b.waiting == 0 {
		s.resolve(o, b)
	}
}

// resolve ends a batch: each key found is promoted from the first tier (in
// configured order) that has it; the rest are cached as absent from the
// tiers that answered. With prefix, promotion stops at the first key no
// tier has.
func (s *State) resolve(o *fx.Out, b *batch) {
	b.timer.Stop()
	delete(s.batches, b.id)
	for _, corr := range b.corrs {
		delete(s.pending, corr) // a tier that never answered: forget the question
	}
	until := s.cfg.Clock.Now().Add(s.cfg.NegativeTTL)
	byTier := map[int][]messages.Key{}
	stopped := false
	for i, k := range b.keys {
		delete(s.looking, k)
		if b.found[i] == 0 {
			s.markAbsent(k, b.mask, until)
			stopped = stopped || b.prefix
			continue
		}
		if stopped {
			continue // beyond a gap of a prefix: not worth a slot now
		}
		t := bits.TrailingZeros64(b.found[i])
		byTier[t] = append(byTier[t], k)
	}
	for t := range s.cfg.Tiers {
		if keys := byTier[t]; len(keys) > 0 {
			s.promote(o, b.req, t, keys)
		}
	}
}

// refreshed drops the absences cached for the named tier: it may hold
// more now. O(negative entries), for an event as rare as a peer coming up.
func (s *State) refreshed(name string) {
	for i, t := range s.cfg.Tiers {
		if t.Name != name {
			continue
		}
		bit := uint64(1) << i
		for k, n := range s.negative {
			if n.absent.tiers&bit != 0 {
				if n.absent.tiers &^= bit; n.absent.tiers|n.noRoom.tiers == 0 {
					delete(s.negative, k)
				} else {
					s.negative[k] = n
				}
			}
		}
	}
}

// markAbsent caches that tiers do not hold k (or could not give it) until
// then.
func (s *State) markAbsent(k messages.Key, tiers uint64, until time.Time) {
	s.mark(k, false, tiers, until)
}

// mark caches tiers as not to be asked about k until then: absent, or, with
// noRoom, holding k but with no CPU room to promote it into.
func (s *State) mark(k messages.Key, noRoom bool, tiers uint64, until time.Time) {
	if tiers == 0 {
		return
	}
	n := s.negative[k]
	m := &n.absent
	if noRoom {
		m = &n.noRoom
	}
	m.add(tiers, until, s.cfg.Clock.Now())
	s.negative[k] = n
}

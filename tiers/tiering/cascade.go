package tiering

import (
	"errors"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
	"github.com/kvtier/kvtier/tiers/tiering/tieringmsg"
	"github.com/kvtier/kvtier/tiers/tiermsg"
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
func (s *State) cascade(o *fx.Out, m *tieringmsg.Cascade) {
	if len(m.Keys) == 0 || len(m.Checksums) != len(m.Keys) {
		return
	}
	for t, tier := range s.cfg.Tiers {
		if tier.NoCascade {
			continue
		}
		room := max(s.cfg.CascadeQueue-s.queued[t]-len(s.waiting[t]), 0)
		n := min(room, len(m.Keys))
		if n < len(m.Keys) {
			s.stats.CascadeDropped[tier.Name] += uint64(len(m.Keys) - n)
		}
		for i := range n {
			s.waiting[t] = append(s.waiting[t], cascadeItem{key: m.Keys[i], sum: m.Checksums[i]})
		}
		s.dispatch(o, t)
	}
}

// dispatch starts one cascade job for tier t with as many waiting blocks as
// its in-flight bound allows: one pin request for all of them.
func (s *State) dispatch(o *fx.Out, t int) {
	n := min(s.cfg.CascadeInFlight-s.queued[t], len(s.waiting[t]))
	if n <= 0 {
		return
	}
	items := s.waiting[t][:n]
	s.waiting[t] = s.waiting[t][n:]
	if len(s.waiting[t]) == 0 {
		s.waiting[t] = nil // let the backing array go
	}
	ref := s.nextJob()
	c := &cascade{job: job{id: ref.ID, tier: t, keys: make([]messages.Key, n)}, sums: make(map[messages.Key]uint32, n), pinning: 1}
	for i, it := range items {
		c.keys[i], c.sums[it.key] = it.key, it.sum
	}
	s.cascades[c.id] = c
	s.queued[t] += n
	c.timer = o.After(s.cfg.CascadeTimeout, &cascadeDeadline{job: ref.ID})
	keys := c.keys
	s.request(o, s.cfg.CPU, pendingReply{kind: replyPin, cas: c, idx: -1}, func(corr uint64) any {
		return &cpumsg.LeaseToPin{Corr: corr, Job: ref, Keys: keys, WantProv: true}
	})
}

func (s *State) onPin(o *fx.Out, p pendingReply, m *cpumsg.PinResult) {
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
		s.queued[c.tier] -= n
	case m.Err != nil && p.idx < 0 && len(c.keys) > 1:
		// Some key was evicted before the cascade got to it: pin the others
		// one by one (all-or-nothing pins, so no pin was taken).
		for i, k := range c.keys {
			c.pinning++
			s.request(o, s.cfg.CPU, pendingReply{kind: replyPin, cas: c, idx: i}, func(corr uint64) any {
				return &cpumsg.LeaseToPin{Corr: corr, Job: ref, Keys: []messages.Key{k}, WantProv: true}
			})
		}
	case m.Err != nil:
		n := 1
		if p.idx < 0 {
			n = len(c.keys)
		}
		s.stats.CascadeDropped[s.cfg.Tiers[c.tier].Name] += uint64(n)
		s.queued[c.tier] -= n
	default:
		keys := c.keys
		if p.idx >= 0 {
			keys = c.keys[p.idx : p.idx+1]
		}
		s.write(o, c, keys, m.Slots, m.Prov)
	}
	s.maybeEndCascade(o, c)
}

// write sends the tier one tiermsg.Write per pinned key, with the provenance
// the CPU tier retained for it (prov: per key, or nil), stored in the
// block's header so a promotion announces it in full.
func (s *State) write(o *fx.Out, c *cascade, keys []messages.Key, slots []int, prov []*messages.Provenance) {
	tier := s.cfg.Tiers[c.tier]
	for i, k := range keys {
		c.outstanding++
		src, sum := s.cfg.Slot(slots[i]), c.sums[k]
		var p *messages.Provenance
		if i < len(prov) {
			p = prov[i]
		}
		s.request(o, tier.Ref, pendingReply{kind: replyWrite, cas: c, key: k}, func(corr uint64) any {
			return &tiermsg.Write{Corr: corr, Key: k, Src: src, Checksum: sum, Prov: p}
		})
	}
}

func (s *State) onWrite(o *fx.Out, p pendingReply, m *tiermsg.WriteResult) {
	c := p.cas
	c.outstanding--
	s.queued[c.tier]--
	name := s.cfg.Tiers[c.tier].Name
	switch {
	case m.Err == nil:
		s.stats.CascadeWritten[name]++
		if n, ok := s.negative[m.Key]; ok {
			n.absent.tiers &^= 1 << c.tier
			s.negative[m.Key] = n
		}
	case errors.Is(m.Err, messages.ErrTierUnavailable), errors.Is(m.Err, messages.ErrTierFull):
		s.stats.CascadeDropped[name]++
	default:
		s.stats.CascadeFailed[name]++
	}
	s.maybeEndCascade(o, c)
}

// maybeEndCascade releases the job's pins once nothing of it is awaited.
func (s *State) maybeEndCascade(o *fx.Out, c *cascade) {
	if c.pinning > 0 || c.outstanding > 0 || s.cascades[c.id] != c {
		return
	}
	c.timer.Stop()
	delete(s.cascades, c.id)
	s.release(o, c.id)
	s.dispatch(o, c.tier)
}

func (s *State) reapCascade(o *fx.Out, id messages.JobID) {
	if c := s.cascades[id]; c != nil {
		s.stalled(&c.job, &s.stats.CascadesReaped, "cascade", "writes_outstanding")
	}
	// Writes still running keep their pins until they return (a worker is
	// reading those slots); pins still being granted are dropped then too.
}

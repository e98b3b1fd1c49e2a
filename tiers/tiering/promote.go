package tiering

import (
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

type promotion struct {
	job      // keys: reserved (ToStore) once the reservation answered; outstanding: reads not yet done
	req      *messages.ReqContext
	slots    []int
	sums     []uint32
	ok       []bool
	prov     []*messages.Provenance // per key once a read brought one: its stored provenance
	issued   int                    // reads sent to the tier and not yet answered (they hold read budget)
	reserved bool
}

// readTask is one key of a promotion waiting for its tier's read budget.
type readTask struct {
	prom *promotion
	idx  int
}

// maxReadsPerTier bounds the promotion reads in flight to one per-key tier
// (fs, obj): the rest wait here, in order, so a prefix longer than the
// tier's I/O queue is promoted whole instead of overflowing it (reads the
// tier sheds would read as absent). Below the tiers' queue (256), with room
// for cascades (maxInFlight) and lookups.
const maxReadsPerTier = 64

func (s *State) promote(o *fx.Out, req *messages.ReqContext, tier int, keys []messages.Key) {
	ref := s.nextJob()
	p := &promotion{job: job{id: ref.ID, tier: tier, keys: keys}, req: req}
	s.proms[p.id] = p
	for _, k := range keys {
		s.promoting[k] = p
	}
	p.timer = o.After(s.cfg.PromotionTimeout, &promotionDeadline{job: ref.ID})
	// NB: into the asking engine's geometry: it is the one that loads them.
	blockBytes := 0
	if req != nil {
		blockBytes = req.BlockBytes
	}
	s.request(o, s.cfg.CPU, pendingReply{kind: replyReserve, prom: p}, func(corr uint64) any {
		return &cpumsg.ReserveSlots{Corr: corr, Job: ref, Keys: keys, BlockBytes: blockBytes}
	})
}

func (s *State) onReserve(o *fx.Out, p pendingReply, m *cpumsg.ReserveResult) {
	prom := p.prom
	ref := messages.JobRef{Origin: messages.OriginTier, ID: prom.id}
	if prom.reaped {
		// Reaped while waiting: whatever was reserved is freed at once.
		o.Request(s.cfg.CPU, &cpumsg.ReleaseJob{Job: ref})
		return
	}
	if m.Err != nil {
		s.stats.PromotionsFull += uint64(len(prom.keys))
		noRoom, ttl := errors.Is(m.Err, messages.ErrFull), s.cfg.NegativeTTL
		if noRoom {
			ttl = s.cfg.NoRoomTTL
		}
		until := s.cfg.Clock.Now().Add(ttl)
		for _, k := range prom.keys {
			s.mark(k, noRoom, 1<<prom.tier, until)
		}
		s.endPromotion(prom)
		return
	}
	for _, k := range prom.keys {
		delete(s.promoting, k) // keys already present: nothing to do for them
	}
	prom.keys, prom.slots, prom.reserved = m.ToStore, m.Slots, true
	prom.sums, prom.ok = make([]uint32, len(m.ToStore)), make([]bool, len(m.ToStore))
	if len(m.ToStore) == 0 {
		s.endPromotion(prom)
		return
	}
	tier := s.cfg.Tiers[prom.tier]
	if tier.Batched {
		s.readBatch(o, prom)
		return
	}
	for i, k := range prom.keys {
		s.promoting[k] = prom
		prom.outstanding++
		s.readQueue[prom.tier] = append(s.readQueue[prom.tier], readTask{prom: prom, idx: i})
	}
	s.pumpReads(o, prom.tier)
}

// pumpReads sends waiting promotion reads while tier t has read budget;
// a waiting read of a reaped promotion is dropped, not sent.
func (s *State) pumpReads(o *fx.Out, t int) {
	for s.reading[t] < maxReadsPerTier && len(s.readQueue[t]) > 0 {
		task := s.readQueue[t][0]
		s.readQueue[t] = s.readQueue[t][1:]
		prom := task.prom
		if prom.reaped {
			prom.outstanding--
			s.finishReaped(o, prom)
			continue
		}
		s.reading[t]++
		prom.issued++
		k, dest := prom.keys[task.idx], s.cfg.Slot(prom.slots[task.idx])
		s.request(o, s.cfg.Tiers[t].Ref, pendingReply{kind: replyRead, prom: prom, idx: task.idx}, func(corr uint64) any {
			return &tiermsg.Read{Corr: corr, Key: k, Dest: dest}
		})
	}
	if len(s.readQueue[t]) == 0 {
		s.readQueue[t] = nil // let the backing array go
	}
}

// finishReaped ends a reaped promotion once nothing can write its slots.
func (s *State) finishReaped(o *fx.Out, prom *promotion) {
	if prom.outstanding == 0 {
		s.release(o, prom.id)
		s.endPromotion(prom)
	}
}

// readBatch asks a batched tier for the whole promotion at once.
func (s *State) readBatch(o *fx.Out, prom *promotion) {
	dests := make([][]byte, len(prom.keys))
	for i, k := range prom.keys {
		s.promoting[k] = prom
		dests[i] = s.cfg.Slot(prom.slots[i])
	}
	prom.outstanding = len(prom.keys)
	keys, slots := prom.keys, prom.slots
	s.request(o, s.cfg.Tiers[prom.tier].Ref, pendingReply{kind: replyReadBatch, prom: prom}, func(corr uint64) any {
		return &tiermsg.ReadBatch{Corr: corr, Keys: keys, Slots: slots, Dests: dests}
	})
}

// onReadBatch applies a batched tier's answer key by key, as onRead does.
func (s *State) onReadBatch(o *fx.Out, p pendingReply, m *tiermsg.ReadBatchResult) {
	prom := p.prom
	for i, k := range prom.keys {
		res := &tiermsg.ReadResult{Key: k, Err: fmt.Errorf("%w: no answer for the key", messages.ErrTierUnavailable)}
		if i < len(m.Errs) && i < len(m.Checksums) {
			res.Err, res.Checksum = m.Errs[i], m.Checksums[i]
		}
		if i < len(m.Prov) {
			res.Prov = m.Prov[i]
		}
		s.readDone(o, prom, i, res)
	}
}

func (s *State) onRead(o *fx.Out, p pendingReply, m *tiermsg.ReadResult) {
	prom := p.prom
	prom.issued--
	if !prom.reaped { // a reaped promotion gave its budget back when reaped
		s.reading[prom.tier]--
	}
	s.readDone(o, prom, p.idx, m)
	s.pumpReads(o, prom.tier)
}

// readDone records one key's read of a promotion; the last one commits it.
func (s *State) readDone(o *fx.Out, prom *promotion, idx int, m *tiermsg.ReadResult) {
	prom.outstanding--
	tier := s.cfg.Tiers[prom.tier]
	if m.Err == nil {
		prom.sums[idx], prom.ok[idx] = m.Checksum, true
		if m.Prov != nil {
			if prom.prov == nil {
				prom.prov = make([]*messages.Provenance, len(prom.keys))
			}
			prom.prov[idx] = m.Prov
		}
	} else if errors.Is(m.Err, messages.ErrTierBusy) {
		// Back-pressure, not absence: the slot is freed with the promotion's
		// failed keys and the key is asked for again on the next lookup.
		s.stats.PromotionsBusy++
	} else {
		// No livelock: a failed copy is a miss for this tier until the
		// negative entry expires, and a bad copy is deleted.
		s.stats.PromotionsFailed[tier.Name]++
		s.markAbsent(m.Key, 1<<prom.tier, s.cfg.Clock.Now().Add(s.cfg.NegativeTTL))
		if errors.Is(m.Err, messages.ErrInvalidBlock) || errors.Is(m.Err, messages.ErrChecksum) {
			o.Send(tier.Ref, &tiermsg.Delete{Key: m.Key})
		}
		s.log.Warn().Err(m.Err).Str("tier", tier.Name).Msg("tiering: promotion read failed; key is a miss for this tier")
	}
	if prom.outstanding > 0 {
		return
	}
	if prom.reaped {
		s.release(o, prom.id)
		s.endPromotion(prom)
		return
	}
	s.commitPromotion(o, prom)
}

// commitPromotion makes the verified blocks readable and frees the slots of
// the rest.
func (s *State) commitPromotion(o *fx.Out, prom *promotion) {
	ref := messages.JobRef{Origin: messages.OriginTier, ID: prom.id}
	var keys []messages.Key
	var sums []uint32
	var prov []*messages.Provenance // the stored provenance, for the stored event: nil when none came
	for i, k := range prom.keys {
		if prom.ok[i] {
			keys, sums = append(keys, k), append(sums, prom.sums[i])
			if prom.prov != nil {
				prov = append(prov, prom.prov[i])
			}
		}
	}
	if len(keys) > 0 {
		tier := s.cfg.Tiers[prom.tier].Name
		n := uint64(len(keys))
		s.request(o, s.cfg.CPU, pendingReply{kind: replyCommit, prom: prom}, func(corr uint64) any {
			return &cpumsg.CommitSlots{Corr: corr, Job: ref, Keys: keys, OK: true, Checksums: sums, Ctx: prom.req, Prov: prov}
		})
		s.stats.Promoted[tier] += n
	}
	if len(keys) < len(prom.keys) {
		s.release(o, prom.id) // FIFO after the commit: frees only the failed keys
	}
	s.endPromotion(prom)
}

func (s *State) endPromotion(prom *promotion) {
	prom.timer.Stop()
	delete(s.proms, prom.id)
	for _, k := range prom.keys {
		if s.promoting[k] == prom {
			delete(s.promoting, k)
		}
	}
}

func (s *State) release(o *fx.Out, id messages.JobID) {
	o.Request(s.cfg.CPU, &cpumsg.ReleaseJob{Job: messages.JobRef{Origin: messages.OriginTier, ID: id}})
}

func (s *State) reapPromotion(o *fx.Out, id messages.JobID) {
	prom := s.proms[id]
	if prom == nil || !s.stalled(&prom.job, &s.stats.PromotionsReaped, "promotion", "reads_outstanding") {
		return
	}
	until := s.cfg.Clock.Now().Add(s.cfg.NegativeTTL)
	for _, k := range prom.keys {
		s.markAbsent(k, 1<<prom.tier, until)
	}
	// Reads sent and unanswered give their budget back now: a tier that
	// never answers them must not starve later promotions.
	s.reading[prom.tier] -= prom.issued
	switch {
	case !prom.reserved:
		// The reservation answer is still to come; onReserve frees it.
		s.endPromotion(prom)
	case prom.outstanding == 0:
		s.release(o, id)
		s.endPromotion(prom)
	}
	// Otherwise reads are still running into the reserved slots: the job
	// stays (its keys answer MISS here, HIT_PENDING at the CPU tier) and is
	// released by onRead when the last one returns.
	// Its reads still waiting for budget are dropped (and it ends) here, and
	// the budget it gave back goes to the promotions behind it.
	s.pumpReads(o, prom.tier)
}

func (s *State) onCommitAck(_ *fx.Out, p pendingReply, m *messages.Ack) {
	if m.Err != nil {
		s.log.Error().Err(m.Err).Uint64("job", uint64(p.prom.id)).Msg("tiering: promotion commit refused")
	}
}

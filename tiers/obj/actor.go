package obj

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/blockfmt"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// Actor serves the tier contract (tiers/contract.go) for one obj tier.
//
// Invariants:
//   - S3 calls run only on the tier's workers, at most Workers at once
//     (running ≤ Workers); results come back as opDone / probeDone.
//   - every request is answered exactly once, to its sender; an operation
//     is in exactly one of: fast or slow queue, running, waiting for a
//     retry timer.
//   - puts (queued, running or waiting to retry) ≤ Queue; a key has at most
//     one put and one delete at a time (writing, deleting).
//   - a probe timer is armed only while unhealthy with no probe running:
//     a healthy or idle tier has no timer.
//   - a block that fails validation is forgotten before the answer goes
//     out, then its object is deleted: it is never served.
//   - with a hub, announced stored − removed (medium STORAGE, ownership the
//     tier's name) = owned: the blocks this tier vouches for — written by
//     it, or read and verified by it, with their provenance — bounded like
//     known; a block leaves owned (announced removed) when it is found
//     invalid or missing, deleted, or forgotten to stay within the bound.
type Actor struct {
	t   *Tier
	log zerolog.Logger

	healthy   bool
	downSince time.Time
	streak    int // transient failures in a row
	probing   bool
	probeGen  uint64
	probe     supervision.Timer
	backoff   time.Duration

	fast, slow []*op // waiting for a worker: lookups, reads, deletes first
	running    int
	retrying   int
	puts       int
	writing    map[messages.Key]struct{}
	deleting   map[messages.Key]struct{}
	known      *keySet
	owned      *keySet    // what the tier's events announce (see Invariants)
	hub        *actor.PID // the node's event hub; nil: announce nothing
	waiters    []AwaitHealth
	stats      messages.SecondaryStats
	logged     uint64 // failures logged at powers of two
}

type opKind uint8

const (
	opHead opKind = iota + 1
	opGet
	opPut
	opDelete
)

// op is one S3 call and whom its outcome is for.
type op struct {
	kind     opKind
	key      messages.Key
	attempt  int
	deadline time.Time // on the tier's clock: no retry starts past it
	corr     uint64
	sender   *actor.PID
	buf      []byte // read into (get) or written from (put)
	sum      uint32
	prov     *messages.Provenance // stored with a put
	look     *lookupJob
	idx      int
}

// lookupJob is one tiermsg.Lookup whose keys are being HEADed.
type lookupJob struct {
	corr   uint64
	sender *actor.PID
	found  []bool
	left   int
}

// Messages the actor sends itself.
type (
	opDone struct {
		op    *op
		found bool
		sum   uint32
		prov  *messages.Provenance // read by a get
		err   error
	}
	retryOp   struct{ op *op }
	probeTick struct{ gen uint64 }
	probeDone struct{ err error }
)

func newActor(t *Tier) *Actor {
	return &Actor{t: t, log: t.cfg.Log.With().Str("tier", t.cfg.Name).Logger(), healthy: true,
		writing: map[messages.Key]struct{}{}, deleting: map[messages.Key]struct{}{},
		known: newKeySet(t.cfg.KnownKeys), owned: newKeySet(t.cfg.KnownKeys),
		stats: messages.SecondaryStats{Name: t.cfg.Name, Kind: "obj", Healthy: true, Blocks: -1}}
}

// Receive handles one message.
func (a *Actor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *tiermsg.Lookup:
		a.lookup(ctx, m)
	case *tiermsg.Read:
		a.read(ctx, m)
	case *tiermsg.Write:
		a.write(ctx, m)
	case *tiermsg.Delete:
		a.known.remove(m.Key)
		a.disown(ctx, m.Key)
		a.stats.Deleted++
		a.remove(m.Key)
	case *messages.TierInventory:
		m.Reply.Answer(messages.InventoryResult{Medium: messages.MediumStorage,
			Ownership: a.t.cfg.Name, Keys: a.owned.keys()}, nil)
	case *opDone:
		a.running--
		a.done(ctx, m)
	case *retryOp:
		a.retrying--
		if !a.healthy {
			a.fail(ctx, m.op)
		} else {
			a.enqueue(m.op)
		}
	case *probeTick:
		if m.gen == a.probeGen && !a.healthy && !a.probing {
			a.startProbe(ctx)
		}
	case *probeDone:
		a.probeDone(ctx, m.err)
	case *AwaitHealth:
		if a.healthy == m.Healthy {
			m.Reply.Answer(struct{}{}, nil)
		} else {
			a.waiters = append(a.waiters, *m)
		}
	case *tiermsg.StatsQuery:
		ctx.Respond(&tiermsg.StatsReply{Corr: m.Corr, Stats: a.snapshot()})
	case *actor.Started:
		// NB: one probe at start, so a wrong endpoint, bucket or key shows
		// in the log and in tier_healthy before the first block needs it.
		if !a.probing {
			a.startProbe(ctx)
		}
	case *actor.Stopping:
		a.stopProbe()
	case *actor.Stopped, *actor.Restarting, *actor.Restart:
	default:
		a.log.Warn().Str("type", fmt.Sprintf("%T", m)).Msg("obj tier: unknown message dropped")
	}
	a.pump(ctx)
}

func (a *Actor) unavailable(why string) error {
	return fmt.Errorf("%w: %s: %s", messages.ErrTierUnavailable, a.t.cfg.Name, why)
}

func (a *Actor) budget(k opKind) time.Duration {
	if k == opPut {
		return a.t.cfg.WriteTimeout
	}
	return a.t.cfg.LookupTimeout
}

func (a *Actor) newOp(k opKind, key messages.Key) *op {
	return &op{kind: k, key: key, deadline: a.t.cfg.Clock.Now().Add(a.budget(k))}
}

func (a *Actor) enqueue(o *op) {
	if o.kind == opPut {
		a.slow = append(a.slow, o)
	} else {
		a.fast = append(a.fast, o)
	}
}

// --- requests --------------------------------------------------------------

func (a *Actor) lookup(ctx actor.Context, m *tiermsg.Lookup) {
	a.stats.Lookups += uint64(len(m.Keys))
	job := &lookupJob{corr: m.Corr, sender: ctx.Sender(), found: make([]bool, len(m.Keys))}
	if !a.healthy {
		// NB: Err nil on purpose, see the package doc: "not here", so the
		// engine's next step is a MISS instead of another RETRY.
		ctx.Respond(&tiermsg.LookupResult{Corr: m.Corr, Found: job.found})
		return
	}
	for i, k := range m.Keys {
		switch {
		case a.known.has(k):
			job.found[i] = true
			a.stats.Found++
		case i >= a.t.cfg.MaxLookupKeys, blockfmt.Storable(k) != nil:
		default:
			o := a.newOp(opHead, k)
			o.look, o.idx = job, i
			job.left++
			a.fast = append(a.fast, o)
		}
	}
	if job.left == 0 {
		ctx.Respond(&tiermsg.LookupResult{Corr: m.Corr, Found: job.found})
	}
}

func (a *Actor) read(ctx actor.Context, m *tiermsg.Read) {
	var err error
	switch {
	case !a.healthy:
		err = a.unavailable("endpoint unreachable")
	case blockfmt.Storable(m.Key) != nil:
		err = fmt.Errorf("%w: %v", messages.ErrNotFound, m.Key)
	}
	if err != nil {
		a.stats.ReadFailures++
		ctx.Respond(&tiermsg.ReadResult{Corr: m.Corr, Key: m.Key, Err: err})
		return
	}
	o := a.newOp(opGet, m.Key)
	o.corr, o.sender, o.buf = m.Corr, ctx.Sender(), m.Dest
	a.fast = append(a.fast, o)
}

func (a *Actor) write(ctx actor.Context, m *tiermsg.Write) {
	respond := func(err error) { ctx.Respond(&tiermsg.WriteResult{Corr: m.Corr, Key: m.Key, Err: err}) }
	if err := blockfmt.Storable(m.Key); err != nil {
		a.stats.WriteFailures++
		respond(err)
		return
	}
	if err := blockfmt.CheckLength(len(m.Src), a.t.cfg.maxBlock()); err != nil {
		a.stats.WriteFailures++
		respond(fmt.Errorf("%v: %w", m.Key, err))
		return
	}
	_, busy := a.writing[m.Key]
	_, gone := a.deleting[m.Key]
	switch {
	case !a.healthy:
		a.stats.WritesShed++
		respond(a.unavailable("endpoint unreachable"))
	case busy || gone:
		a.stats.WritesShed++
		respond(a.unavailable("write or delete in flight"))
	case a.known.has(m.Key):
		respond(nil) // already stored
	case a.puts >= a.t.cfg.Queue:
		a.stats.WritesShed++
		respond(a.unavailable("write queue full"))
	default:
		o := a.newOp(opPut, m.Key)
		o.corr, o.sender, o.buf, o.sum, o.prov = m.Corr, ctx.Sender(), m.Src, m.Checksum, m.Prov
		a.writing[m.Key] = struct{}{}
		a.puts++
		a.slow = append(a.slow, o)
		a.announce(ctx, messages.BlockWriting, m.Key, nil)
	}
}

// remove deletes k's object (a bad copy) unless a delete is under way; a
// delete is dropped while unhealthy: a bad copy left behind fails its
// checksum on the next read and is deleted then.
func (a *Actor) remove(k messages.Key) {
	if _, ok := a.deleting[k]; ok || !a.healthy || blockfmt.Storable(k) != nil {
		return
	}
	a.deleting[k] = struct{}{}
	a.fast = append(a.fast, a.newOp(opDelete, k))
}

// --- I/O -------------------------------------------------------------------

// pump starts queued operations while workers are free, lookups and reads
// before writes.
func (a *Actor) pump(ctx actor.Context) {
	for a.running < a.t.cfg.Workers && len(a.fast)+len(a.slow) > 0 {
		var o *op
		if len(a.fast) > 0 {
			o, a.fast = a.fast[0], a.fast[1:]
		} else {
			o, a.slow = a.slow[0], a.slow[1:]
		}
		if o.kind == opHead && a.t.cfg.Clock.Now().After(o.deadline) {
			a.complete(ctx, o, opDone{op: o}) // the lookup is over: not worth a call
			continue
		}
		if !a.submit(ctx, o) {
			a.fail(ctx, o)
		}
	}
	if len(a.fast) == 0 {
		a.fast = nil // let the backing array go
	}
	if len(a.slow) == 0 {
		a.slow = nil
	}
}

func (a *Actor) submit(ctx actor.Context, o *op) bool {
	self, root, t := ctx.Self(), ctx.ActorSystem().Root, a.t
	timeout := a.budget(o.kind)
	ok := t.workers.Submit(func() {
		c, cancel := context.WithTimeout(t.base, timeout)
		defer cancel()
		d := opDone{op: o}
		switch o.kind {
		case opHead:
			d.found, d.err = t.store.Head(c, o.key, t.cfg.maxBlock())
		case opGet:
			d.sum, d.prov, d.err = t.store.Read(c, o.key, o.buf)
		case opPut:
			d.err = t.store.Write(c, o.key, o.buf, o.sum, o.prov)
		case opDelete:
			d.err = t.store.Remove(c, o.key)
		}
		root.Send(self, &d)
	})
	if ok {
		a.running++
	}
	return ok
}

// done takes an S3 call's outcome: retried, turned into ill health, or
// completed.
func (a *Actor) done(ctx actor.Context, d *opDone) {
	o := d.op
	switch classify(d.err) {
	case classOK, classNotFound, classInvalid:
		a.streak = 0
	case classUnreachable:
		a.markUnhealthy(ctx, d.err)
		a.fail(ctx, o)
		return
	case classTransient:
		a.streak++
		if a.streak >= a.t.cfg.UnhealthyAfter {
			a.markUnhealthy(ctx, d.err)
			a.fail(ctx, o)
			return
		}
		if a.retry(ctx, o) {
			return
		}
	}
	a.complete(ctx, o, *d)
}

// retry arms a backoff timer for o when its attempts and deadline allow.
func (a *Actor) retry(ctx actor.Context, o *op) bool {
	wait := a.t.cfg.RetryBase << o.attempt
	if o.attempt+1 >= a.t.cfg.MaxAttempts || a.t.cfg.Clock.Now().Add(wait).After(o.deadline) {
		return false
	}
	o.attempt++
	a.retrying++
	a.stats.RetriedIOCalls++
	self, root := ctx.Self(), ctx.ActorSystem().Root
	a.t.cfg.Clock.AfterFunc(wait, func() { root.Send(self, &retryOp{op: o}) })
	return true
}

// fail completes o as refused: the tier is unhealthy or closed.
func (a *Actor) fail(ctx actor.Context, o *op) {
	a.complete(ctx, o, opDone{op: o, err: a.unavailable("endpoint unreachable")})
}

// complete answers o's requester and updates the index hint and counters.
func (a *Actor) complete(ctx actor.Context, o *op, d opDone) {
	shed := errors.Is(d.err, messages.ErrTierUnavailable)
	switch o.kind {
	case opHead:
		if d.err == nil && d.found {
			a.known.add(o.key)
			a.stats.Found++
			o.look.found[o.idx] = true
		} else if d.err != nil && !shed {
			a.failed("head", d.err)
		}
		if o.look.left--; o.look.left == 0 {
			ctx.Send(o.look.sender, &tiermsg.LookupResult{Corr: o.look.corr, Found: o.look.found})
		}
	case opGet:
		switch classify(d.err) {
		case classOK:
			a.stats.Reads++
			a.known.add(o.key)
			if d.prov != nil {
				a.own(ctx, o.key, d.prov)
			}
		case classInvalid:
			a.stats.ReadFailures++
			a.stats.Invalid++
			a.known.remove(o.key)
			a.disown(ctx, o.key)
			a.log.Warn().Err(d.err).Msg("obj tier: invalid object deleted")
			a.remove(o.key)
		case classNotFound:
			a.stats.ReadFailures++
			a.known.remove(o.key)
			a.disown(ctx, o.key)
		default:
			a.stats.ReadFailures++
			if !shed {
				a.failed("get", d.err)
			}
		}
		ctx.Send(o.sender, &tiermsg.ReadResult{Corr: o.corr, Key: o.key, Checksum: d.sum, Prov: d.prov, Err: d.err})
	case opPut:
		a.puts--
		delete(a.writing, o.key)
		switch {
		case d.err == nil:
			a.stats.Writes++
			a.known.add(o.key)
		case shed:
			a.stats.WritesShed++
		default:
			a.stats.WriteFailures++
			a.failed("put", d.err)
		}
		if d.err != nil || !a.own(ctx, o.key, o.prov) {
			// NB: a block already vouched for (read before it was
			// written again) has its copy announced: the write just ends.
			a.announce(ctx, messages.BlockWriteAborted, o.key, nil)
		}
		ctx.Send(o.sender, &tiermsg.WriteResult{Corr: o.corr, Key: o.key, Err: d.err})
	case opDelete:
		delete(a.deleting, o.key)
	}
}

// failed logs a failed call at powers of two: a sick endpoint fails every
// call, and one line per block would drown the log.
func (a *Actor) failed(op string, err error) {
	a.logged++
	if a.logged&(a.logged-1) == 0 {
		a.log.Warn().Err(err).Str("op", op).Uint64("failures", a.logged).Msg("obj tier: call failed")
	}
}

// --- health ----------------------------------------------------------------

// markUnhealthy sheds everything queued and arms the first probe.
func (a *Actor) markUnhealthy(ctx actor.Context, err error) {
	if !a.healthy {
		return
	}
	a.healthy, a.downSince, a.backoff = false, a.t.cfg.Clock.Now(), a.t.cfg.ProbeMin
	a.stats.Unhealthy++
	a.log.Warn().Err(err).Int("queued_failed", len(a.fast)+len(a.slow)).Msg("obj tier: endpoint unreachable; tier unhealthy, lookups answer absent and writes are shed until a probe succeeds")
	queued := append(a.fast, a.slow...)
	a.fast, a.slow = nil, nil
	for _, o := range queued {
		a.fail(ctx, o)
	}
	a.answerWaiters()
	if !a.probing {
		a.armProbe(ctx)
	}
}

func (a *Actor) armProbe(ctx actor.Context) {
	a.probeGen++
	gen, self, root := a.probeGen, ctx.Self(), ctx.ActorSystem().Root
	a.probe = a.t.cfg.Clock.AfterFunc(a.backoff, func() { root.Send(self, &probeTick{gen: gen}) })
}

func (a *Actor) stopProbe() {
	a.probeGen++
	if a.probe != nil {
		a.probe.Stop()
		a.probe = nil
	}
}

func (a *Actor) startProbe(ctx actor.Context) {
	self, root, t := ctx.Self(), ctx.ActorSystem().Root, a.t
	a.probe = nil
	a.probing = t.workers.Submit(func() {
		c, cancel := context.WithTimeout(t.base, t.cfg.LookupTimeout)
		defer cancel()
		root.Send(self, &probeDone{err: t.cfg.Client.Probe(c)})
	})
}

func (a *Actor) probeDone(ctx actor.Context, err error) {
	a.probing = false
	switch {
	case err == nil && !a.healthy:
		a.healthy, a.streak = true, 0
		a.log.Info().Dur("down_for", a.t.cfg.Clock.Now().Sub(a.downSince)).Msg("obj tier: endpoint answers again; tier healthy")
		a.answerWaiters()
	case err == nil:
	case a.healthy:
		a.markUnhealthy(ctx, err) // the start probe failed
	default:
		a.backoff = min(2*a.backoff, a.t.cfg.ProbeMax)
		a.log.Debug().Err(err).Dur("next_in", a.backoff).Msg("obj tier: probe failed")
		a.armProbe(ctx)
	}
}

func (a *Actor) answerWaiters() {
	keep := a.waiters[:0]
	for _, w := range a.waiters {
		if w.Healthy == a.healthy {
			w.Reply.Answer(struct{}{}, nil)
		} else {
			keep = append(keep, w)
		}
	}
	a.waiters = keep
}

func (a *Actor) snapshot() messages.SecondaryStats {
	s := a.stats
	s.Healthy = a.healthy
	s.InFlight = a.running + a.retrying + len(a.fast) + len(a.slow)
	return s
}

// --- events ----------------------------------------------------------------

// own makes k a block the tier vouches for, announcing it stored with p if
// it was not already (and removed the block forgotten to make room); it
// reports whether it announced k.
func (a *Actor) own(ctx actor.Context, k messages.Key, p *messages.Provenance) bool {
	if a.hub == nil {
		return false
	}
	if a.owned.contains(k) {
		a.owned.add(k) // recency only
		return false
	}
	forgot, ok := a.owned.add(k)
	a.announce(ctx, messages.BlockStored, k, p)
	if ok {
		a.announce(ctx, messages.BlockRemoved, forgot, nil)
	}
	return true
}

// disown announces k removed if the tier vouched for it.
func (a *Actor) disown(ctx actor.Context, k messages.Key) {
	if a.owned.remove(k) {
		a.announce(ctx, messages.BlockRemoved, k, nil)
	}
}

// announce sends the hub an event about k (nothing without a hub).
func (a *Actor) announce(ctx actor.Context, kind messages.EventKind, k messages.Key, p *messages.Provenance) {
	if a.hub == nil {
		return
	}
	e := &messages.Event{Kind: kind, Keys: []messages.Key{k}, Medium: messages.MediumStorage,
		Ownership: a.t.cfg.Name, Locality: a.t.cfg.Locality, At: a.t.cfg.Clock.Now()}
	if kind == messages.BlockStored {
		e.Prov = []*messages.Provenance{p}
	}
	ctx.Send(a.hub, e)
}

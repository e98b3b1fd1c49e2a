package cpu

import (
	"hash/crc32"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
)

// Actor is the CPU tier's mailbox: it applies messages to State one at a time
// and answers each request to its sender.
//
// Invariants:
//   - State is touched only inside Receive.
//   - Receive never reads or writes slot bytes: verification runs in a
//     goroutine on a pinned slot and comes back as verifyDone.
//   - State outlives the actor: a supervisor restart gets the same State
//     back (it is the owner of record of the slot table) and checks its
//     invariants before serving again.
//   - Events are buffered up to DefaultMaxEvents; beyond that the oldest are dropped
//     and counted, so an engine that never drains cannot grow memory.
//   - With an event sink, every announced event is also sent to it, in
//     announce order, never dropped (the sink is an actor: a send, no I/O),
//     and so are notes of writes begun (a reservation) and ended unreadable
//     (a failed commit, a released job), so the hub can hold a block whose
//     parent is still being written.
//   - Each ready block retains its provenance (State's slot), answered with
//     WantProv to lookups and pins.
type Actor struct {
	state            *State
	pool             *Pool
	now              func() time.Time
	log              zerolog.Logger
	clock            supervision.Clock
	events           eventLog
	checksumFailures uint64
	verifyJob        messages.JobID
	restarted        bool
	sink             *actor.PID // event hub, or nil
	// nsGeometry is the geometry engines store each namespace in: where a
	// promotion or a peer's block of it goes.
	nsGeometry map[messages.Namespace]int
	offload    *actors.Offload
}

// Castagnoli is the CRC32C table every tier checksums blocks with.
var Castagnoli = crc32.MakeTable(crc32.Castagnoli)

// DefaultMaxEvents bounds the event buffer.
const DefaultMaxEvents = 1 << 16

// Option configures the actor.
type Option func(*Actor)

// WithOffload runs the actor's reads of slot memory off the mailbox (a
// block's verification) on o's tracked goroutines, which the node waits
// for before it unmaps the pool. Without it they run untracked.
func WithOffload(o *actors.Offload) Option { return func(a *Actor) { a.offload = o } }

// WithEventSink also sends every announced event, as a *messages.Event, to
// pid (the node's event hub). The TakeEvents buffer is unaffected.
func WithEventSink(pid *actor.PID) Option { return func(a *Actor) { a.sink = pid } }

// WithClock sets the clock of the tier's own timers (a restart's
// quarantine); default the wall clock.
func WithClock(c supervision.Clock) Option { return func(a *Actor) { a.clock = c } }

// Props builds the actor's props over a State and Pool that survive restarts.
func Props(state *State, pool *Pool, now func() time.Time, log zerolog.Logger, opts ...Option) *actor.Props {
	a := &Actor{state: state, pool: pool, now: now, log: log, events: eventLog{max: DefaultMaxEvents}}
	for _, o := range opts {
		o(a)
	}
	return actor.PropsFromProducer(func() actor.Actor { return a },
		actor.WithReceiverMiddleware(supervision.Faults))
}

type verifyDone struct {
	reply messages.Reply[struct{}]
	key   messages.Key
	job   messages.JobRef
	want  uint32
	got   uint32
}

// Receive applies one message.
func (a *Actor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.checkAfterRestart()
	case *actor.Restarting:
		a.restarted = true
	case *cpumsg.LookupAndLease:
		res := &cpumsg.LookupResult{Corr: m.Corr, Holder: m.Holder, Status: a.state.LookupAndLease(m.Holder, m.Keys, m.Prefix, m.TTL)}
		if m.WantChecksums {
			res.Checksums = a.checksumsOfHits(m.Keys, res.Status)
		}
		if m.WantProv {
			res.Prov = a.state.ProvenanceOf(m.Keys, res.Status)
		}
		if m.WantSlots {
			res.Slots = a.state.SlotsOf(m.Keys, res.Status)
		}
		ctx.Respond(res)
	case *cpumsg.LeaseToPin:
		pin := a.state.LeaseToPin
		if m.KeepRank {
			pin = a.state.LeaseToPinKeepRank
		}
		slots, err := pin(m.Holder, m.Job, m.Keys)
		res := &cpumsg.PinResult{Corr: m.Corr, Job: m.Job, Slots: slots, Err: err}
		if m.WantProv && err == nil {
			res.Prov = a.state.ProvenanceOf(m.Keys, nil)
		}
		ctx.Respond(res)
	case *cpumsg.TouchKeys:
		a.state.Touch(m.Keys)
	case *cpumsg.UnpinKeys:
		ctx.Respond(&messages.Ack{Corr: m.Corr, Err: a.state.Unpin(m.Job, m.Keys)})
	case *cpumsg.ReserveSlots:
		a.reserve(ctx, m)
	case *cpumsg.CommitSlots:
		a.commit(ctx, m)
	case *cpumsg.ReleaseJob:
		a.aborted(ctx, a.state.ReleaseJob(m.Job))
		ctx.Respond(&messages.Ack{Corr: m.Corr})
	case *cpumsg.ReleaseHolder:
		a.state.ReleaseHolder(m.Holder)
	case *cpumsg.ReleaseOrigin:
		a.releaseOrigin(ctx, m)
	case *releaseOrphans:
		a.releaseJobs(ctx, m.jobs)
	case *cpumsg.OrphanJobs:
		a.orphanJobs(ctx, m)
	case *cpumsg.GrantCredit:
		a.grant(ctx, m)
	case *cpumsg.BindCredit:
		a.bind(ctx, m)
	case *cpumsg.ReleaseCredit:
		a.releaseCreditAfter(ctx, m)
	case *releaseCredit:
		a.state.ReleaseCredit(m.owner)
	case *cpumsg.ClearTier:
		a.clear(ctx, m)
	case *cpumsg.VerifyBlock:
		a.verify(ctx, m)
	case *verifyDone:
		a.verified(ctx, m)
	case *cpumsg.TakeTierEvents:
		events, dropped := a.events.take()
		ctx.Respond(&cpumsg.TierEvents{Corr: m.Corr, Events: events, Dropped: dropped})
	case *cpumsg.TierStats:
		ctx.Respond(&cpumsg.TierStatsResult{Corr: m.Corr, Stats: a.stats()})
	case *cpumsg.ResidentOf:
		// NB: answered to the hub in order with this tier's events to it: a
		// block stored or removed after this answer reaches the hub after it.
		keys, prov := a.state.Resident(m.Namespace)
		ctx.Respond(&cpumsg.Resident{Topic: m.Topic, Event: messages.Event{
			Kind: messages.BlockStored, Keys: keys, Prov: prov, Medium: messages.MediumCPU, At: a.now()}})
	case *messages.TierInventory:
		m.Reply.Answer(messages.InventoryResult{Medium: messages.MediumCPU, Keys: a.state.ReadyKeys()}, nil)
	case *actor.Stopping, *actor.Stopped, *actor.Restart:
	default:
		a.log.Warn().Str("type", typeName(m)).Msg("cpu tier: unknown message dropped")
	}
}

func (a *Actor) reserve(ctx actor.Context, m *cpumsg.ReserveSlots) {
	gi, err := a.geometryFor(m.BlockBytes, m.Keys)
	if err != nil {
		ctx.Respond(&cpumsg.ReserveResult{Corr: m.Corr, Err: err})
		return
	}
	res, err := a.state.ReserveIn(gi, m.Job, m.Keys)
	if len(res.Evicted) > 0 {
		a.announce(ctx, messages.Event{Kind: messages.BlockRemoved, Keys: res.Evicted})
	}
	a.note(ctx, messages.BlockWriting, res.ToStore)
	ctx.Respond(&cpumsg.ReserveResult{Corr: m.Corr, ToStore: res.ToStore, Slots: res.Slots, Evicted: res.Evicted, Err: err})
}

func (a *Actor) commit(ctx actor.Context, m *cpumsg.CommitSlots) {
	src := ProvSource{Ctx: m.Ctx, Place: m.Place}
	if len(m.Prov) == len(m.Keys) {
		src.Prov = m.Prov
	}
	err := a.state.CommitAt(m.Job, m.Keys, m.Slots, m.OK, m.Checksums, src)
	switch {
	case err != nil:
	case m.OK && len(m.Keys) > 0:
		a.announce(ctx, messages.Event{Kind: messages.BlockStored, Keys: m.Keys, Ctx: m.Ctx, Place: m.Place, Prov: src.Prov})
	default:
		a.aborted(ctx, m.Keys)
	}
	ctx.Respond(&messages.Ack{Corr: m.Corr, Err: err})
}

// aborted tells the event hub that writes of keys ended unreadable.
// releaseOrphans frees the slots of jobs orphaned by ReleaseOrigin once
// their quarantine has passed.
type releaseOrphans struct{ jobs []messages.JobRef }

// releaseOrigin ends an origin's leases at once and its pins and writes at
// once or after the quarantine (their slots stay unusable meanwhile).
func (a *Actor) releaseOrigin(ctx actor.Context, m *cpumsg.ReleaseOrigin) {
	if m.Quarantine <= 0 {
		a.aborted(ctx, a.state.ReleaseOrigin(m.Origin))
		return
	}
	jobs, aborted := a.state.OrphanOrigin(m.Origin)
	a.aborted(ctx, aborted)
	if len(jobs) == 0 {
		return
	}
	a.log.Warn().Int("jobs", len(jobs)).Dur("quarantine", m.Quarantine).
		Msg("cpu: jobs orphaned by a restart; their slots are released after the quarantine")
	a.releaseAfter(ctx, jobs, m.Quarantine)
}

// orphanJobs ends the jobs of an engine that is gone: their writes are
// unindexed now, their slots freed after the quarantine.
func (a *Actor) orphanJobs(ctx actor.Context, m *cpumsg.OrphanJobs) {
	if m.Quarantine <= 0 {
		a.releaseJobs(ctx, m.Jobs)
		return
	}
	var aborted []messages.Key
	for _, j := range m.Jobs {
		aborted = append(aborted, a.state.OrphanJob(j)...)
	}
	a.aborted(ctx, aborted)
	a.releaseAfter(ctx, m.Jobs, m.Quarantine)
}

// releaseJobs frees jobs' pins and write-pending slots; a write that was
// not orphaned (re-keyed) before is announced aborted.
func (a *Actor) releaseJobs(ctx actor.Context, jobs []messages.JobRef) {
	var keys []messages.Key
	for _, j := range jobs {
		for _, k := range a.state.ReleaseJob(j) {
			if !IsQuarantineKey(k) {
				keys = append(keys, k)
			}
		}
	}
	a.aborted(ctx, keys)
}

// releaseAfter frees jobs' slots (releaseOrphans) once quarantine has passed.
func (a *Actor) releaseAfter(ctx actor.Context, jobs []messages.JobRef, quarantine time.Duration) {
	self, root, msg := ctx.Self(), ctx.ActorSystem().Root, &releaseOrphans{jobs: jobs}
	clock := a.clock
	if clock == nil {
		clock = supervision.RealClock{}
	}
	clock.AfterFunc(quarantine, func() { root.Send(self, msg) })
}

func (a *Actor) aborted(ctx actor.Context, keys []messages.Key) {
	a.note(ctx, messages.BlockWriteAborted, keys)
}

// note sends the event hub a note (BlockWriting, BlockWriteAborted): hub
// only, never buffered for TakeTierEvents.
func (a *Actor) note(ctx actor.Context, kind messages.EventKind, keys []messages.Key) {
	if a.sink == nil || len(keys) == 0 {
		return
	}
	ctx.Send(a.sink, &messages.Event{Kind: kind, Keys: keys, Medium: messages.MediumCPU, At: a.now()})
}

func (a *Actor) clear(ctx actor.Context, m *cpumsg.ClearTier) {
	removed := a.state.Clear()
	if a.state.Occupancy().Free == a.state.Slots() {
		a.announce(ctx, messages.Event{Kind: messages.AllBlocksCleared})
	} else if len(removed) > 0 {
		a.announce(ctx, messages.Event{Kind: messages.BlockRemoved, Keys: removed})
	}
	ctx.Respond(&messages.Ack{Corr: m.Corr})
}

// verify pins the block under a tier-owned job and checksums it off the
// mailbox; verified finishes the job.
func (a *Actor) verify(ctx actor.Context, m *cpumsg.VerifyBlock) {
	_, want, err := a.state.Checksum(m.Key)
	if err != nil {
		m.Reply.Answer(struct{}{}, err)
		return
	}
	a.verifyJob++
	job := messages.JobRef{Origin: messages.OriginTier, ID: messages.VerifyJobBase + a.verifyJob}
	slots, err := a.state.LeaseToPin(messages.Holder{}, job, []messages.Key{m.Key})
	if err != nil {
		m.Reply.Answer(struct{}{}, err)
		return
	}
	self, bytes := ctx.Self(), a.pool.Slot(slots[0])
	system := ctx.ActorSystem()
	a.offload.Go(func() {
		got := crc32.Checksum(bytes, Castagnoli)
		system.Root.Send(self, &verifyDone{reply: m.Reply, key: m.Key, job: job, want: want, got: got})
	})
}

func (a *Actor) verified(ctx actor.Context, m *verifyDone) {
	a.state.ReleaseJob(m.job)
	var err error
	if m.got != m.want {
		a.checksumFailures++
		err = messagesChecksumError(m.key, m.want, m.got)
		if a.state.Drop(m.key) {
			a.announce(ctx, messages.Event{Kind: messages.BlockRemoved, Keys: []messages.Key{m.key}})
		}
		a.log.Error().Stringer("key", m.key).Uint32("want", m.want).Uint32("got", m.got).Msg("cpu tier: block failed verification, dropped")
	}
	m.reply.Answer(struct{}{}, err)
}

func (a *Actor) announce(ctx actor.Context, e messages.Event) {
	e.Medium, e.At = messages.MediumCPU, a.now()
	if a.sink != nil {
		ev := e
		ctx.Send(a.sink, &ev)
	}
	a.events.add(e)
}

func (a *Actor) stats() messages.Stats {
	o := a.state.Occupancy()
	c := a.state.Counters
	var committed, used int64
	geos := make([]messages.GeometryStats, 0, a.state.Geometries())
	for _, g := range a.state.GeometryOccupancy() {
		geos = append(geos, messages.GeometryStats(g))
		committed += int64(g.Committed) * int64(g.BlockBytes)
		used += int64(g.Committed-g.Free) * int64(g.BlockBytes)
	}
	return messages.Stats{
		PoolBytes: a.state.Budget(), CommittedBytes: committed, UsedBytes: used, Geometries: geos,
		Slots: o.Slots, BlockBytes: a.pool.BlockBytes(), Free: o.Free, WritePending: o.WritePending,
		Ready: o.Ready, Pinned: o.Pinned, Leased: o.Leased, Leases: o.Leases, Credit: o.Credit,
		Lookups: c.Lookups, Hits: c.Hits, HitsPending: c.HitsPending, Misses: c.Misses,
		Stores: c.Stores, StoresFailed: c.StoresFailed, Evictions: c.Evictions, Full: c.Full,
		LeasesExpired: c.LeasesExpired, ChecksumFailures: a.checksumFailures,
	}
}

// checkAfterRestart verifies the surviving State once a supervisor restart
// brings the actor back.
func (a *Actor) checkAfterRestart() {
	if !a.restarted {
		return
	}
	a.restarted = false
	if err := a.state.CheckInvariants(); err != nil {
		a.log.Error().Err(err).Msg("cpu tier: state inconsistent after restart")
		return
	}
	a.log.Warn().Msg("cpu tier: restarted; slot table intact")
}

// checksumsOfHits is the committed CRC32C of each HIT among keys (0 for the
// rest), for a peer round.
func (a *Actor) checksumsOfHits(keys []messages.Key, status []messages.LookupStatus) []uint32 {
	sums := make([]uint32, len(keys))
	for i, st := range status {
		if st != messages.Hit {
			continue
		}
		if _, sum, err := a.state.Checksum(keys[i]); err == nil {
			sums[i] = sum
		}
	}
	return sums
}

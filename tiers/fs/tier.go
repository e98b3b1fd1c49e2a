package fs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/internal/defaults"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers"
)

// Config configures an fs tier.
type Config struct {
	Name       string // tier name in stats and filters (default "fs")
	Root       string // directory of the blocks (created if absent)
	Capacity   int64  // byte capacity including headers; 0 = unbounded
	BlockBytes int    // the node's block size: files of any other size are invalid
	Fsync      bool   // sync each block file before publishing it
	Workers    int    // I/O goroutines (default 4)
	Queue      int    // I/O operations waiting for a goroutine before writes are shed (default 256)
	FS         FS     // nil: the real filesystem
	// Locality is the `locality` of the tier's KV events: "LOCAL" (the
	// default) for a node's own disk, "REMOTE" for a filesystem other nodes
	// read too.
	Locality string
	Log      zerolog.Logger
}

// Defaults for Config.
const (
	DefaultWorkers  = 4
	DefaultQueue    = 256
	DefaultLocality = "LOCAL"
)

// Tier is an opened fs tier: its index (rebuilt from the directory), its
// store and its I/O workers. The actor (Props) serves it; the node closes
// the workers after the actor stopped.
type Tier struct {
	cfg     Config
	store   *Store
	index   *Index
	workers *tiers.Workers
	stats   messages.SecondaryStats
	intro   intro // announcing the blocks found at start (survives restarts)
}

// Open scans cfg.Root, rebuilding the index (oldest files least recent),
// removing leftovers, and evicting the oldest blocks if the capacity shrank
// since they were written. It runs before the actor starts, off any mailbox.
func Open(cfg Config) (*Tier, error) {
	if cfg.Root == "" || cfg.BlockBytes <= 0 {
		return nil, fmt.Errorf("%w: fs tier needs a root and a block size", messages.ErrBadConfig)
	}
	defaults.FillNonPositive(&cfg, Config{
		Name:     tiers.KindFS,
		Workers:  DefaultWorkers,
		Queue:    DefaultQueue,
		FS:       OS{},
		Locality: DefaultLocality,
	})
	t := &Tier{cfg: cfg, store: NewStore(cfg.FS, cfg.Root, cfg.Fsync), index: NewIndex(cfg.Capacity)}
	start := time.Now()
	res, err := t.store.Scan(cfg.BlockBytes)
	if err != nil {
		return nil, fmt.Errorf("fs tier %s: scan %s: %w", cfg.Name, cfg.Root, err)
	}
	over := 0
	for _, b := range res.blocks {
		if cfg.Capacity > 0 && t.index.Used()+b.size > cfg.Capacity {
			// The capacity shrank: the oldest blocks (scanned first) go.
			// NB: scanning oldest first and stopping late keeps the newest.
			continue
		}
		t.index.Add(b.key, b.size)
	}
	// Anything left out for capacity is removed now, before serving.
	for _, b := range res.blocks {
		if !t.index.Has(b.key) {
			if err := t.store.Remove(b.key); err == nil {
				over++
			}
			continue
		}
		t.intro.add(b.key)
	}
	t.stats = messages.SecondaryStats{Name: cfg.Name, Kind: tiers.KindFS, Healthy: true,
		ScannedBlocks: t.index.Blocks(), ScanRemoved: res.Removed + over, Capacity: cfg.Capacity}
	t.workers = tiers.NewWorkers(cfg.Workers, cfg.Queue)
	cfg.Log.Info().Str("tier", cfg.Name).Str("root", cfg.Root).Int("blocks", t.index.Blocks()).
		Int64("bytes", t.index.Used()).Int("removed", res.Removed+over).Int("skipped", res.Skipped).
		Dur("took", time.Since(start)).Msg("fs tier: index rebuilt from directory")
	return t, nil
}

// Name is the tier's name.
func (t *Tier) Name() string { return t.cfg.Name }

// Close stops the I/O workers, waiting for running operations until ctx
// ends. Call it after the actor stopped.
func (t *Tier) Close(ctx context.Context) error { return t.workers.Close(ctx) }

// Props builds the tier's actor over t (which survives restarts); it
// announces what the tier holds to hub (nil: events off, nothing announced).
func (t *Tier) Props(hub *actor.PID) *actor.Props {
	a := &Actor{t: t, hub: hub, log: t.cfg.Log.With().Str("tier", t.cfg.Name).Logger()}
	return actor.PropsFromProducer(func() actor.Actor { return a },
		actor.WithReceiverMiddleware(supervision.Faults))
}

// Actor serves the tier contract (tiers/contract.go) for one fs tier, and
// announces what the tier holds to the node's event hub (medium STORAGE,
// ownership the tier's name): a block stored when its write lands, removed
// when it becomes unreadable (evicted, deleted, found invalid), the blocks
// found on disk at start once their headers are read (intro), and notes of
// the writes it starts and abandons.
//
// Invariants:
//   - the index is touched only inside Receive; file I/O runs only on the
//     tier's workers and comes back as readDone / writeDone / removeDone.
//   - every request is answered exactly once, to its sender.
//   - a write is submitted only when the worker queue has room, so an
//     index change (reservation, evictions) is never left without the I/O
//     that completes it.
//   - a block that fails validation on read is made unreadable before the
//     answer goes out, then its file is removed: it is never served.
//   - with a hub: announced stored − removed = the index's readable keys
//     minus those the start-up introduction has not announced yet; a
//     TierInventory is answered once the introduction is over.
type Actor struct {
	t        *Tier
	log      zerolog.Logger
	inFlight int
	hub      *actor.PID                // the node's event hub; nil: announce nothing
	invWait  []*messages.TierInventory // inventories asked before the introduction ended
	invFrom  []*actor.PID              // their senders
}

type (
	readDone struct {
		req    *messages.TierRead
		sender *actor.PID
		sum    uint32
		prov   *messages.Provenance
		err    error
	}
	writeDone struct {
		req     *messages.TierWrite
		sender  *actor.PID
		evicted []messages.Key
		err     error
	}
	removeDone struct {
		keys []messages.Key
		then func() // run in Receive once the files are gone (nil: nothing)
	}
)

// Receive handles one message.
func (a *Actor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *messages.TierLookup:
		a.lookup(ctx, m)
	case *messages.TierRead:
		a.read(ctx, m)
	case *readDone:
		a.readDone(ctx, m)
	case *messages.TierWrite:
		a.write(ctx, m)
	case *writeDone:
		a.writeDone(ctx, m)
	case *messages.TierDelete:
		if a.t.index.StartDelete(m.Key) {
			a.t.stats.Deleted++
			a.gone(ctx, []messages.Key{m.Key})
			a.remove(ctx, []messages.Key{m.Key}, nil)
		}
	case *introDone:
		a.introDone(ctx, m)
	case *messages.TierInventory:
		a.inventory(ctx, m)
	case *removeDone:
		a.inFlight--
		for _, k := range m.keys {
			a.t.index.EndDelete(k)
		}
		if m.then != nil {
			m.then()
		}
	case *messages.TierStatsQuery:
		ctx.Respond(&messages.TierStatsReply{Corr: m.Corr, Stats: a.snapshot()})
	case *actor.Started:
		a.started(ctx)
	case *actor.Stopping, *actor.Stopped, *actor.Restarting, *actor.Restart:
	default:
		a.log.Warn().Str("type", fmt.Sprintf("%T", m)).Msg("fs tier: unknown message dropped")
	}
	a.introduce(ctx)
}

func (a *Actor) lookup(ctx actor.Context, m *messages.TierLookup) {
	found := make([]bool, len(m.Keys))
	for i, k := range m.Keys {
		found[i] = a.t.index.Has(k)
		if found[i] {
			a.t.stats.Found++
		}
	}
	a.t.stats.Lookups += uint64(len(m.Keys))
	ctx.Respond(&messages.TierLookupResult{Corr: m.Corr, Found: found})
}

// submit hands f to the workers, counting it in flight until its done
// message arrives.
func (a *Actor) submit(f func()) bool {
	if !a.t.workers.Submit(f) {
		return false
	}
	a.inFlight++
	return true
}

func (a *Actor) read(ctx actor.Context, m *messages.TierRead) {
	if !a.t.index.Has(m.Key) {
		a.t.stats.ReadFailures++
		ctx.Respond(&messages.TierReadResult{Corr: m.Corr, Key: m.Key, Err: fmt.Errorf("%w: %v", messages.ErrNotFound, m.Key)})
		return
	}
	a.t.index.Touch(m.Key)
	self, root, sender, store := ctx.Self(), ctx.ActorSystem().Root, ctx.Sender(), a.t.store
	if !a.submit(func() {
		sum, prov, err := store.Read(m.Key, m.Dest)
		root.Send(self, &readDone{req: m, sender: sender, sum: sum, prov: prov, err: err})
	}) {
		a.t.stats.ReadFailures++
		ctx.Respond(&messages.TierReadResult{Corr: m.Corr, Key: m.Key, Err: fmt.Errorf("%w: %s", messages.ErrTierBusy, a.t.cfg.Name)})
	}
}

func (a *Actor) readDone(ctx actor.Context, m *readDone) {
	a.inFlight--
	switch {
	case m.err == nil:
		a.t.stats.Reads++
	case errors.Is(m.err, messages.ErrInvalidBlock), errors.Is(m.err, messages.ErrNotFound):
		// NB: a missing file the index listed is as bad as a corrupt one:
		// forget it (and remove whatever is there) so it is never offered.
		// The reader hears of the failure once the bad copy is gone.
		a.t.stats.ReadFailures++
		if a.t.index.StartDelete(m.req.Key) {
			a.t.stats.Invalid++
			a.gone(ctx, []messages.Key{m.req.Key})
			a.log.Warn().Err(m.err).Msg("fs tier: invalid block removed")
			a.remove(ctx, []messages.Key{m.req.Key}, func() { a.answerRead(ctx, m) })
			return
		}
	default:
		a.t.stats.ReadFailures++
		a.log.Warn().Err(m.err).Stringer("key", m.req.Key).Msg("fs tier: read failed")
	}
	a.answerRead(ctx, m)
}

func (a *Actor) answerRead(ctx actor.Context, m *readDone) {
	if m.sender != nil {
		ctx.Send(m.sender, &messages.TierReadResult{Corr: m.req.Corr, Key: m.req.Key, Checksum: m.sum, Prov: m.prov, Err: m.err})
	}
}

func (a *Actor) write(ctx actor.Context, m *messages.TierWrite) {
	respond := func(err error) { ctx.Respond(&messages.TierWriteResult{Corr: m.Corr, Key: m.Key, Err: err}) }
	if err := storable(m.Key); err != nil {
		a.t.stats.WriteFailures++
		respond(err)
		return
	}
	if a.t.workers.Queued() >= a.t.cfg.Queue {
		a.t.stats.WritesShed++
		respond(fmt.Errorf("%w: %s: I/O queue full", messages.ErrTierUnavailable, a.t.cfg.Name))
		return
	}
	evicted, err := a.t.index.BeginWrite(m.Key, FileSize(len(m.Src), m.Prov))
	switch {
	case errors.Is(err, errExists):
		a.t.index.Touch(m.Key)
		respond(nil)
		return
	case errors.Is(err, errBusy):
		a.t.stats.WritesShed++
		respond(fmt.Errorf("%w: %v: write or delete in flight", messages.ErrTierUnavailable, m.Key))
		return
	case err != nil:
		a.t.stats.WritesFull++
		respond(err)
		return
	}
	a.t.stats.Evictions += uint64(len(evicted))
	a.gone(ctx, evicted)
	a.note(ctx, messages.BlockWriting, m.Key)
	self, root, sender, store := ctx.Self(), ctx.ActorSystem().Root, ctx.Sender(), a.t.store
	if !a.submit(func() {
		for _, k := range evicted {
			_ = store.Remove(k) // NB: a file left behind is re-validated by the next scan
		}
		_, err := store.Write(m.Key, m.Src, m.Checksum, m.Prov)
		root.Send(self, &writeDone{req: m, sender: sender, evicted: evicted, err: err})
	}) {
		// Only when the pool closed: undo the reservation.
		a.t.index.EndWrite(m.Key, false)
		a.note(ctx, messages.BlockWriteAborted, m.Key)
		for _, k := range evicted {
			a.t.index.EndDelete(k)
		}
		respond(fmt.Errorf("%w: %s: closed", messages.ErrTierUnavailable, a.t.cfg.Name))
	}
}

func (a *Actor) writeDone(ctx actor.Context, m *writeDone) {
	a.inFlight--
	for _, k := range m.evicted {
		a.t.index.EndDelete(k)
	}
	a.t.index.EndWrite(m.req.Key, m.err == nil)
	switch {
	case m.err == nil:
		a.t.stats.Writes++
		a.announce(ctx, messages.BlockStored, []messages.Key{m.req.Key}, []*messages.Provenance{m.req.Prov})
	case errors.Is(m.err, messages.ErrTierFull):
		a.t.stats.WritesFull++
	default:
		a.t.stats.WriteFailures++
	}
	if m.err != nil {
		a.note(ctx, messages.BlockWriteAborted, m.req.Key)
	}
	if m.err != nil && (a.t.stats.WriteFailures+a.t.stats.WritesFull)&(a.t.stats.WriteFailures+a.t.stats.WritesFull-1) == 0 {
		// Logged at powers of two: a full disk fails every write.
		a.log.Warn().Err(m.err).Uint64("write_failures", a.t.stats.WriteFailures).
			Uint64("writes_full", a.t.stats.WritesFull).Msg("fs tier: write failed")
	}
	if m.sender != nil {
		ctx.Send(m.sender, &messages.TierWriteResult{Corr: m.req.Corr, Key: m.req.Key, Err: m.err})
	}
}

// remove deletes the files of keys already marked deleting in the index.
// remove deletes keys' files on a worker; then, if set, runs in Receive
// once they are gone (or at once when the I/O queue is full).
func (a *Actor) remove(ctx actor.Context, keys []messages.Key, then func()) {
	self, root, store := ctx.Self(), ctx.ActorSystem().Root, a.t.store
	if !a.submit(func() {
		for _, k := range keys {
			_ = store.Remove(k)
		}
		root.Send(self, &removeDone{keys: keys, then: then})
	}) {
		for _, k := range keys {
			a.t.index.EndDelete(k)
		}
		if then != nil {
			then()
		}
	}
}

func (a *Actor) snapshot() messages.SecondaryStats {
	s := a.t.stats
	s.Blocks, s.Bytes, s.InFlight = a.t.index.Blocks(), a.t.index.Used(), a.inFlight
	return s
}

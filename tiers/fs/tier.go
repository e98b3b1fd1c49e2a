package fs

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/internal/defaults"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/blockfmt"
	"github.com/kvtier/kvtier/tiers/tiermsg"
)

// Config configures an fs tier.
type Config struct {
	Name     string // tier name in stats and filters (default "fs")
	Root     string // directory of the blocks (created if absent)
	Capacity int64  // byte capacity including headers (and segment overhead); 0 = unbounded
	// MaxBlockBytes bounds the blocks the tier stores: any length from 1
	// to it (blocks of several sizes, one per namespace, share a tier);
	// a write of another length is ErrSize, and a copy found at start
	// that cannot be one is removed. 0: blockfmt.MaxBlockBytes.
	MaxBlockBytes int
	Fsync         bool // sync each block (file or segment record) before it is readable
	Workers       int  // I/O goroutines (default 4)
	Queue         int  // I/O operations waiting for a goroutine before writes are shed (default 256)
	FS            FS   // nil: the real filesystem
	// Layout is how blocks are kept: "segments" (DefaultLayout: packed
	// into append-only segment files; block files found in the root are
	// read through) or "files" (one file per block). See doc.go.
	Layout string
	// SegmentBytes is the size a segment is sealed at (segments layout;
	// default 64 MiB, and at most an eighth of a nonzero Capacity).
	SegmentBytes int64
	// Locality is the `locality` of the tier's KV events: "LOCAL" (the
	// default) for a node's own disk, "REMOTE" for a filesystem other nodes
	// read too.
	Locality string
	// Residency, if set, hears the tier's readable keys come and go (the
	// residency index's region of this tier, standalone mode).
	Residency Observer
	Log       zerolog.Logger
}

// Defaults for Config.
const (
	DefaultWorkers  = 4
	DefaultQueue    = 256
	DefaultLocality = "LOCAL"
)

// Tier is an opened fs tier: its layout's state (rebuilt from the
// directory), its store and its I/O workers. The actor (Props) serves it;
// the node closes the workers after the actor stopped.
type Tier struct {
	cfg     Config
	store   *Store
	l       layout  // index or segs
	index   *Index  // the files layout's (nil otherwise)
	segs    *segLog // the segments layout's (nil otherwise)
	scan    ScanResult
	workers *tiers.Workers
	stats   messages.SecondaryStats
	intro   intro // announcing the blocks found at start (survives restarts)
}

// ValidLayout checks a Config.Layout value ("" is the default, files).
func ValidLayout(layout string) error {
	switch layout {
	case "", LayoutFiles, LayoutSegments:
		return nil
	}
	return fmt.Errorf("%w: fs tier layout %q (want %q or %q)", messages.ErrBadConfig, layout, LayoutFiles, LayoutSegments)
}

// Open scans cfg.Root, rebuilding the index (oldest blocks least recent),
// removing leftovers, and evicting the oldest blocks (files layout) or
// segments (segments layout) if the capacity shrank since they were
// written. It runs before the actor starts, off any mailbox.
func Open(cfg Config) (*Tier, error) {
	if cfg.Root == "" {
		return nil, fmt.Errorf("%w: fs tier needs a root", messages.ErrBadConfig)
	}
	if cfg.MaxBlockBytes < 0 || cfg.maxBlock() > blockfmt.MaxBlockBytes {
		return nil, fmt.Errorf("%w: fs tier block bound %d: want 1..%d", messages.ErrBadConfig, cfg.maxBlock(), blockfmt.MaxBlockBytes)
	}
	if err := ValidLayout(cfg.Layout); err != nil {
		return nil, err
	}
	if cfg.SegmentBytes < 0 {
		return nil, fmt.Errorf("%w: fs tier segment bytes %d must not be negative", messages.ErrBadConfig, cfg.SegmentBytes)
	}
	defaults.FillNonPositive(&cfg, Config{
		Name:         tiers.KindFS,
		Workers:      DefaultWorkers,
		Queue:        DefaultQueue,
		FS:           OS{},
		Locality:     DefaultLocality,
		Layout:       DefaultLayout,
		SegmentBytes: DefaultSegmentBytes,
	})
	t := &Tier{cfg: cfg, store: NewStore(cfg.FS, cfg.Root, cfg.Fsync)}
	t.store.maxBlock = cfg.maxBlock()
	start := time.Now()
	var over int
	var err error
	if cfg.Layout == LayoutSegments {
		over, err = t.openSegments()
	} else {
		over, err = t.openFiles()
	}
	if err != nil {
		return nil, fmt.Errorf("fs tier %s: scan %s: %w", cfg.Name, cfg.Root, err)
	}
	removed := t.scan.Removed + over + t.scan.Torn
	t.stats = messages.SecondaryStats{Name: cfg.Name, Kind: tiers.KindFS, Healthy: true,
		ScannedBlocks: t.l.Blocks(), ScanRemoved: removed, Capacity: cfg.Capacity,
		ChoreFailures: uint64(t.scan.Unsealed), ChoresFull: uint64(t.scan.SealsFull)}
	t.workers = tiers.NewWorkers(cfg.Workers, cfg.Queue)
	ev := cfg.Log.Info()
	if t.scan.Torn > 0 || t.scan.Unsealed > 0 {
		ev = cfg.Log.Warn()
	}
	ev.Str("tier", cfg.Name).Str("root", cfg.Root).Str("layout", cfg.Layout).Int("blocks", t.l.Blocks()).
		Int64("bytes", t.l.Used()).Int("removed", removed).Int("skipped", t.scan.Skipped).
		Int("torn_tails", t.scan.Torn).Int64("torn_bytes", t.scan.TornBytes).Int("unsealed", t.scan.Unsealed).
		Dur("took", time.Since(start)).Msg("fs tier: index rebuilt from directory")
	return t, nil
}

// maxBlock is the longest block the tier stores.
func (c Config) maxBlock() int {
	if c.MaxBlockBytes > 0 {
		return c.MaxBlockBytes
	}
	return blockfmt.MaxBlockBytes
}

// keepNewest decides which of sizes (oldest first) a capacity keeps: the
// newest that fit (all when capacity is 0).
func keepNewest(sizes []int64, capacity int64) []bool {
	keep := make([]bool, len(sizes))
	var used int64
	for i := len(sizes) - 1; i >= 0; i-- {
		if capacity == 0 || used+sizes[i] <= capacity {
			keep[i], used = true, used+sizes[i]
		}
	}
	return keep
}

// openFiles rebuilds the files layout's index; it returns how many block
// files the capacity left out (removed).
func (t *Tier) openFiles() (int, error) {
	res, err := t.store.Scan(t.cfg.maxBlock())
	if err != nil {
		return 0, err
	}
	t.scan, t.index = res, NewIndex(t.cfg.Capacity)
	t.index.SetObserver(t.cfg.Residency)
	if segs, err := t.store.fs.ReadDir(filepath.Join(t.cfg.Root, segDirName)); err == nil && len(segs) > 0 {
		t.cfg.Log.Warn().Str("tier", t.cfg.Name).Int("segments", len(segs)).
			Msg("fs tier: segment files found, not read by the files layout (layout: segments reads them, and block files)")
	}
	t.l = filesLayout{Index: t.index, store: t.store}
	sizes := make([]int64, len(res.blocks))
	for i, b := range res.blocks {
		sizes[i] = b.size
	}
	over := 0
	// NB: the capacity shrank: the oldest blocks go, the newest stay.
	for i, keep := range keepNewest(sizes, t.cfg.Capacity) {
		b := res.blocks[i]
		if !keep || !t.index.Add(b.key, b.size) {
			if err := t.store.Remove(b.key); err == nil {
				over++
			}
			continue
		}
		t.intro.add(b.key)
	}
	t.scan.blocks = nil
	return over, nil
}

// unitFound is a unit of the segments layout found at start: a segment, or
// a block file of the files layout.
type unitFound struct {
	seg   *segment
	recs  []segRec
	mtime time.Time
}

// openSegments rebuilds the segments layout's log from the segments and
// the block files under the root; it returns how many units the capacity
// (or newer copies of all their blocks) left out (removed).
func (t *Tier) openSegments() (int, error) {
	res, err := t.store.Scan(t.cfg.maxBlock())
	if err != nil {
		return 0, err
	}
	found, maxID, err := t.store.ScanSegments(t.cfg.maxBlock(), &res)
	if err != nil {
		return 0, err
	}
	t.scan = res
	t.scan.blocks = nil
	// NB: segments in id order — a key's newer copy is always in a later
	// segment, or later in the same one — with the block files (oldest
	// first) merged in by modification time.
	units := make([]unitFound, 0, len(res.blocks)+len(found))
	for len(res.blocks) > 0 || len(found) > 0 {
		if len(res.blocks) > 0 && (len(found) == 0 || !found[0].mtime.Before(res.blocks[0].mtime)) {
			b := res.blocks[0]
			res.blocks = res.blocks[1:]
			units = append(units, unitFound{seg: &segment{key: b.key, size: b.size},
				recs: []segRec{{key: b.key, size: b.size}}, mtime: b.mtime})
			continue
		}
		f := found[0]
		found = found[1:]
		units = append(units, unitFound{seg: &segment{id: f.id, size: f.size, end: f.end}, recs: f.recs, mtime: f.mtime})
	}
	liveRecs(units)
	sizes := make([]int64, len(units))
	for i, u := range units {
		sizes[i] = u.seg.size
	}
	t.segs = newSegLog(t.cfg.Capacity, t.cfg.SegmentBytes, maxID+1)
	t.segs.obs = t.cfg.Residency
	t.l = segLayout{x: t.segs, store: t.store}
	over := 0
	for i, keep := range keepNewest(sizes, t.cfg.Capacity) {
		u := units[i]
		if !keep || len(u.recs) == 0 {
			if t.store.removePath(segLayout{store: t.store}.path(u.seg)) == nil {
				over++
			}
			continue
		}
		t.segs.addFound(u.seg, u.recs)
		for _, r := range u.recs {
			t.intro.add(r.key)
		}
	}
	return over, nil
}

// liveRecs leaves in each unit (oldest first) only the records that are
// their key's newest copy.
func liveRecs(units []unitFound) {
	type at struct{ unit, rec int }
	newest := map[messages.Key]at{}
	for i, u := range units {
		for j, r := range u.recs {
			newest[r.key] = at{i, j}
		}
	}
	for i := range units {
		recs := units[i].recs[:0]
		for j, r := range units[i].recs {
			if newest[r.key] == (at{i, j}) {
				recs = append(recs, r)
			}
		}
		units[i].recs = recs
	}
}

// Name is the tier's name.
func (t *Tier) Name() string { return t.cfg.Name }

// Close stops the I/O workers, waiting for running operations until ctx
// ends. Call it after the actor stopped. The segments layout then seals the
// segments it was writing, so the next start need not walk them.
func (t *Tier) Close(ctx context.Context) error {
	// NB: even when a worker outlives ctx: a file it still holds closes
	// when it lets it go.
	defer t.store.segs.closeAll()
	if err := t.workers.Close(ctx); err != nil {
		return err
	}
	if t.segs == nil {
		return nil
	}
	l := segLayout{x: t.segs, store: t.store}
	for _, c := range t.segs.closing() {
		what, io := l.choreIO(c)
		if err := io(); err != nil {
			// NB: not the caller's problem: the next start walks an unsealed
			// segment, and rescans a file left behind.
			t.cfg.Log.Warn().Err(err).Str("chore", what).Str("tier", t.cfg.Name).Uint64("segment", c.seg.id).Msg("fs tier: closing segment failed")
		}
	}
	return nil
}

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
//   - the layout's state (index or segment log) is touched only inside
//     Receive; file I/O runs only on the tier's workers and comes back as
//     readDone / writeDone / cleanupDone / choreDone / introDone.
//   - every request is answered exactly once, to its sender.
//   - a write is submitted only when the worker queue has room, so an
//     index change (reservation, evictions) is never left without the I/O
//     that completes it.
//   - a block that fails validation on read is made unreadable before the
//     answer goes out, then its file is removed (files layout; in a
//     segment its record is dead, the segment removed once none is live):
//     it is never served.
//   - with a hub: announced stored − removed = the index's readable keys
//     minus those the start-up introduction has not announced yet; a
//     TierInventory is answered once the introduction is over.
type Actor struct {
	t        *Tier
	log      zerolog.Logger
	inFlight int
	hub      *actor.PID                // the node's event hub; nil: announce nothing
	invWait  []*messages.TierInventory // inventories asked before the introduction ended
}

type (
	readDone struct {
		req    *tiermsg.Read
		sender *actor.PID
		at     *record // the copy read (segments layout)
		sum    uint32
		prov   *messages.Provenance
		err    error
	}
	writeDone struct {
		req    *tiermsg.Write
		sender *actor.PID
		op     *writeOp
		err    error
	}
	cleanupDone struct {
		cs   []*cleanup
		then func() // run in Receive once the files are gone (nil: nothing)
	}
	choreDone struct {
		c   chore
		err error
	}
)

// Receive handles one message.
func (a *Actor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *tiermsg.Lookup:
		a.lookup(ctx, m)
	case *tiermsg.Read:
		a.read(ctx, m)
	case *readDone:
		a.readDone(ctx, m)
	case *tiermsg.Write:
		a.write(ctx, m)
	case *writeDone:
		a.writeDone(ctx, m)
	case *tiermsg.Delete:
		if ok, c := a.t.l.drop(m.Key, nil); ok {
			a.t.stats.Deleted++
			a.gone(ctx, []messages.Key{m.Key})
			a.cleanup(ctx, []*cleanup{c}, nil)
		}
	case *introDone:
		a.introDone(ctx, m)
	case *messages.TierInventory:
		a.inventory(m)
	case *cleanupDone:
		a.inFlight--
		for _, c := range m.cs {
			c.done()
		}
		if m.then != nil {
			m.then()
		}
	case *choreDone:
		a.inFlight--
		if m.err != nil {
			a.t.stats.ChoreFailures++
			if errors.Is(m.err, messages.ErrTierFull) {
				a.t.stats.ChoresFull++
			}
			a.log.Warn().Err(m.err).Msg("fs tier: " + m.c.what + " failed")
		}
		m.c.done(m.err)
	case *tiermsg.StatsQuery:
		ctx.Respond(&tiermsg.StatsReply{Corr: m.Corr, Stats: a.snapshot()})
	case *actor.Started:
		a.started(ctx)
	case *actor.Stopping, *actor.Stopped, *actor.Restarting, *actor.Restart:
	default:
		a.log.Warn().Str("type", fmt.Sprintf("%T", m)).Msg("fs tier: unknown message dropped")
	}
	a.introduce(ctx)
	a.housekeep(ctx)
}

func (a *Actor) lookup(ctx actor.Context, m *tiermsg.Lookup) {
	found := make([]bool, len(m.Keys))
	for i, k := range m.Keys {
		found[i] = a.t.l.Has(k)
		if found[i] {
			a.t.stats.Found++
		}
	}
	a.t.stats.Lookups += uint64(len(m.Keys))
	ctx.Respond(&tiermsg.LookupResult{Corr: m.Corr, Found: found})
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

func (a *Actor) read(ctx actor.Context, m *tiermsg.Read) {
	if !a.t.l.Has(m.Key) {
		a.t.stats.ReadFailures++
		ctx.Respond(&tiermsg.ReadResult{Corr: m.Corr, Key: m.Key, Err: fmt.Errorf("%w: %v", messages.ErrNotFound, m.Key)})
		return
	}
	a.t.l.Touch(m.Key)
	self, root, sender := ctx.Self(), ctx.ActorSystem().Root, ctx.Sender()
	read, at := a.t.l.reader(m.Key)
	if !a.submit(func() {
		sum, prov, err := read(m.Dest)
		root.Send(self, &readDone{req: m, sender: sender, at: at, sum: sum, prov: prov, err: err})
	}) {
		a.t.stats.ReadFailures++
		ctx.Respond(&tiermsg.ReadResult{Corr: m.Corr, Key: m.Key, Err: fmt.Errorf("%w: %s", messages.ErrTierBusy, a.t.cfg.Name)})
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
		if ok, c := a.t.l.drop(m.req.Key, m.at); ok {
			a.t.stats.Invalid++
			a.gone(ctx, []messages.Key{m.req.Key})
			a.log.Warn().Err(m.err).Msg("fs tier: invalid block removed")
			a.cleanup(ctx, []*cleanup{c}, func() { a.answerRead(ctx, m) })
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
		ctx.Send(m.sender, &tiermsg.ReadResult{Corr: m.req.Corr, Key: m.req.Key, Checksum: m.sum, Prov: m.prov, Err: m.err})
	}
}

func (a *Actor) write(ctx actor.Context, m *tiermsg.Write) {
	respond := func(err error) { ctx.Respond(&tiermsg.WriteResult{Corr: m.Corr, Key: m.Key, Err: err}) }
	if err := blockfmt.Storable(m.Key); err != nil {
		a.t.stats.WriteFailures++
		respond(err)
		return
	}
	if err := blockfmt.CheckLength(len(m.Src), a.t.cfg.maxBlock()); err != nil {
		// NB: never stored: the start-up scan would drop it.
		a.t.stats.WriteFailures++
		respond(fmt.Errorf("%v: %w", m.Key, err))
		return
	}
	if a.t.workers.Queued() >= a.t.cfg.Queue {
		a.t.stats.WritesShed++
		respond(fmt.Errorf("%w: %s: I/O queue full", messages.ErrTierUnavailable, a.t.cfg.Name))
		return
	}
	op, err := a.t.l.beginWrite(m, FileSize(len(m.Src), m.Prov))
	switch {
	case errors.Is(err, errExists):
		a.t.l.Touch(m.Key)
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
	a.t.stats.Evictions += uint64(len(op.evicted))
	a.gone(ctx, op.evicted)
	a.note(ctx, messages.BlockWriting, m.Key)
	self, root, sender := ctx.Self(), ctx.ActorSystem().Root, ctx.Sender()
	if !a.submit(func() {
		err := op.io()
		root.Send(self, &writeDone{req: m, sender: sender, op: op, err: err})
	}) {
		// Only when the pool closed: undo the reservation.
		op.abort()
		a.note(ctx, messages.BlockWriteAborted, m.Key)
		respond(fmt.Errorf("%w: %s: closed", messages.ErrTierUnavailable, a.t.cfg.Name))
	}
}

func (a *Actor) writeDone(ctx actor.Context, m *writeDone) {
	a.inFlight--
	m.op.end(m.err == nil)
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
		ctx.Send(m.sender, &tiermsg.WriteResult{Corr: m.req.Corr, Key: m.req.Key, Err: m.err})
	}
}

// cleanup runs the I/O of cs (nil entries: none) on a worker; then, if
// set, runs in Receive once it is done (or at once when there is none, or
// when the I/O queue is full: the files are left for the next scan).
func (a *Actor) cleanup(ctx actor.Context, cs []*cleanup, then func()) {
	cs = slices.DeleteFunc(cs, func(c *cleanup) bool { return c == nil })
	self, root := ctx.Self(), ctx.ActorSystem().Root
	if len(cs) > 0 && a.submit(func() {
		for _, c := range cs {
			c.io()
		}
		root.Send(self, &cleanupDone{cs: cs, then: then})
	}) {
		return
	}
	for _, c := range cs {
		if c.skipped != nil {
			c.skipped()
		}
		c.done()
	}
	if then != nil {
		then()
	}
}

// housekeep submits the layout's chores due (the segments layout's seals
// and removals); one the queue refuses is due again after the next
// message.
func (a *Actor) housekeep(ctx actor.Context) {
	chores := a.t.l.chores()
	for i, c := range chores {
		self, root := ctx.Self(), ctx.ActorSystem().Root
		if !a.submit(func() { root.Send(self, &choreDone{c: c, err: c.io()}) }) {
			for _, c := range chores[i:] {
				c.requeue()
			}
			return
		}
	}
}

func (a *Actor) snapshot() messages.SecondaryStats {
	s := a.t.stats
	s.Blocks, s.Bytes, s.InFlight = a.t.l.Blocks(), a.t.l.Used(), a.inFlight
	return s
}

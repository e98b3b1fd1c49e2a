package fs

import (
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/blockfmt"
)

// The tier's KV events (docs/PROTOCOL.md, "KV events"): medium STORAGE,
// ownership the tier's name, locality from its Config.

// introBatch is how many headers one start-up introduction read fetches.
const introBatch = 256

// intro announces the blocks found on disk at start: each one's header and
// provenance are read on a worker, introBatch at a time with one batch in
// flight (reads of blocks the engine asks for go first), and announced
// stored; a header that fails validation removes its block instead. Until
// then the blocks are noted as being written, so the hub announces a
// parent found at start before its children.
//
// Invariant: pending ⊆ order ∪ batch; every pending key is readable in the
// index (a key leaving the index leaves pending too: gone).
type intro struct {
	order    []messages.Key // scan order (oldest first), not yet read
	pending  map[messages.Key]struct{}
	batch    []messages.Key // being read
	begun    bool           // the BlockWriting note went out
	inFlight bool
	gen      uint64 // a restart abandons the batch in flight: its answer then only announces
}

func (in *intro) add(k messages.Key) {
	if in.pending == nil {
		in.pending = map[messages.Key]struct{}{}
	}
	in.pending[k] = struct{}{}
	in.order = append(in.order, k)
}

// introDone is one batch's headers read.
type introDone struct {
	gen   uint64
	keys  []messages.Key
	at    []*record // the copies read (segments layout)
	provs []*messages.Provenance
	errs  []error
}

// started begins the introduction the first time; after a restart the
// batch that was in flight is read again.
func (a *Actor) started(ctx actor.Context) {
	in := &a.t.intro
	if a.hub == nil {
		*in = intro{begun: true} // nobody to announce to
		return
	}
	if !in.begun {
		in.begun = true
		a.announce(ctx, messages.BlockWriting, in.order, nil)
	}
	if in.inFlight {
		in.order = append(in.batch, in.order...)
		in.inFlight, in.batch = false, nil
		in.gen++
	}
}

// introduce starts the next batch of the introduction when none is in
// flight.
func (a *Actor) introduce(ctx actor.Context) {
	in := &a.t.intro
	if a.hub == nil || in.inFlight || len(in.pending) == 0 {
		return
	}
	var batch []messages.Key
	for len(in.order) > 0 && len(batch) < introBatch {
		k := in.order[0]
		in.order = in.order[1:]
		if _, ok := in.pending[k]; ok {
			batch = append(batch, k)
		}
	}
	if len(batch) == 0 {
		// NB: cannot happen (pending ⊆ order); never leave an inventory
		// waiting on it.
		a.gone(ctx, slices.Collect(maps.Keys(in.pending)))
		return
	}
	// NB: any length: blocks of several sizes share the tier; the scan
	// checked each is within the bound, and a read checks it whole.
	self, root, n, gen := ctx.Self(), ctx.ActorSystem().Root, blockfmt.AnyLength, in.gen
	reads := make([]func() (*messages.Provenance, error), len(batch))
	at := make([]*record, len(batch))
	for i, k := range batch {
		reads[i], at[i] = a.t.l.provenance(k, n)
	}
	if !a.submit(func() {
		d := &introDone{gen: gen, keys: batch, at: at, provs: make([]*messages.Provenance, len(batch)), errs: make([]error, len(batch))}
		for i, read := range reads {
			d.provs[i], d.errs[i] = read()
		}
		root.Send(self, d)
	}) {
		in.order = append(batch, in.order...) // the queue is full: the next I/O done retries
		return
	}
	in.inFlight, in.batch = true, batch
}

func (a *Actor) introDone(ctx actor.Context, m *introDone) {
	a.inFlight--
	in := &a.t.intro
	if m.gen == in.gen {
		in.inFlight, in.batch = false, nil
	}
	var keys, bad, dead []messages.Key
	var provs []*messages.Provenance
	var cleanups []*cleanup
	for i, k := range m.keys {
		if _, ok := in.pending[k]; !ok {
			continue
		}
		switch err := m.errs[i]; {
		case errors.Is(err, messages.ErrInvalidBlock), errors.Is(err, messages.ErrNotFound):
			bad = append(bad, k) // gone: no longer pending, never announced
			if ok, c := a.t.l.drop(k, m.at[i]); ok {
				a.t.stats.Invalid++
				dead, cleanups = append(dead, k), append(cleanups, c)
				a.log.Warn().Err(err).Msg("fs tier: invalid block found at start removed")
			}
		case err != nil:
			// NB: readable for all we know (a read retries the I/O): announced
			// without provenance rather than left out of the events.
			a.log.Warn().Err(err).Stringer("key", k).Msg("fs tier: header read failed at start; block announced without provenance")
			keys, provs = append(keys, k), append(provs, nil)
			delete(in.pending, k)
		default:
			keys, provs = append(keys, k), append(provs, m.provs[i])
			delete(in.pending, k)
		}
	}
	a.announce(ctx, messages.BlockStored, keys, provs)
	a.gone(ctx, without(bad, dead))
	if len(dead) > 0 {
		// NB: an invalid block's write is announced abandoned once its file
		// is gone, so no one who saw the event finds the file.
		for _, k := range dead {
			delete(in.pending, k)
		}
		a.cleanup(ctx, cleanups, func() { a.announce(ctx, messages.BlockWriteAborted, dead, nil) })
	}
	a.answerInventories()
}

// without returns keys less those in drop.
func without(keys, drop []messages.Key) []messages.Key {
	if len(drop) == 0 {
		return keys
	}
	skip := make(map[messages.Key]struct{}, len(drop))
	for _, k := range drop {
		skip[k] = struct{}{}
	}
	out := keys[:0:0]
	for _, k := range keys {
		if _, ok := skip[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// gone announces keys that just became unreadable: removed, or, for a
// block the introduction had not announced yet, an abandoned write.
func (a *Actor) gone(ctx actor.Context, keys []messages.Key) {
	in := &a.t.intro
	var removed, unseen []messages.Key
	for _, k := range keys {
		if _, ok := in.pending[k]; ok {
			delete(in.pending, k)
			unseen = append(unseen, k)
		} else {
			removed = append(removed, k)
		}
	}
	a.announce(ctx, messages.BlockWriteAborted, unseen, nil)
	a.announce(ctx, messages.BlockRemoved, removed, nil)
	if len(unseen) > 0 {
		a.answerInventories()
	}
}

// inventory answers what the tier holds readable, once the introduction
// is over (so the answer is what the events announced).
func (a *Actor) inventory(m *messages.TierInventory) {
	if a.hub != nil && len(a.t.intro.pending) > 0 {
		a.invWait = append(a.invWait, m)
		return
	}
	m.Reply.Answer(a.inventoryResult(), nil)
}

func (a *Actor) inventoryResult() messages.InventoryResult {
	return messages.InventoryResult{Medium: messages.MediumStorage, Ownership: a.t.cfg.Name,
		Keys: a.t.l.ReadyKeys()}
}

func (a *Actor) answerInventories() {
	if len(a.t.intro.pending) > 0 {
		return
	}
	a.t.intro.order = nil // let the backing array go
	for _, m := range a.invWait {
		m.Reply.Answer(a.inventoryResult(), nil)
	}
	a.invWait = nil
}

// announce sends the hub an event about keys (nothing without a hub or
// keys).
func (a *Actor) announce(ctx actor.Context, kind messages.EventKind, keys []messages.Key, provs []*messages.Provenance) {
	if a.hub == nil || len(keys) == 0 {
		return
	}
	ctx.Send(a.hub, &messages.Event{Kind: kind, Keys: keys, Prov: provs, Medium: messages.MediumStorage,
		Ownership: a.t.cfg.Name, Locality: a.t.cfg.Locality, At: time.Now()})
}

// note announces one key.
func (a *Actor) note(ctx actor.Context, kind messages.EventKind, k messages.Key) {
	a.announce(ctx, kind, []messages.Key{k}, nil)
}

package events

import (
	"github.com/kvtier/kvtier/messages"
)

// Translator turns tier events into wire events and keeps, per medium, the
// copies of every block the tiers announced. It is plain data, owned by the
// hub actor (or a test): no goroutines, no clock, no I/O.
//
// Invariants:
//   - copies[m][k] = the number of tiers (Ownership values) of medium m
//     holding k, and owners[m][o] holds exactly the keys tier o of m holds;
//     a key is absent from copies[m] rather than at 0.
//   - a BlockStored for k in m is emitted only when copies[m][k] goes 0 → 1,
//     a BlockRemoved only when it goes 1 → 0: the wire's stored-minus-removed
//     per medium is exactly the keys of copies[m].
//   - stored runs keep chain order: a run is keys consecutive in their call,
//     so its parent_block_hash is its first key's parent and its token ids
//     are the concatenation of its blocks' tokens.
type Translator struct {
	format HashFormat
	media  map[string]*medium
	// Counters (monotonic).
	Placeholders    uint64 // blocks announced without full provenance
	UnknownRemovals uint64 // removals of keys the translator never saw stored
	Duplicates      uint64 // stores of a copy already held (ignored)
}

type medium struct {
	copies map[messages.Key]int
	owners map[string]map[messages.Key]struct{}
}

// NewTranslator builds an empty translator writing hashes in format.
func NewTranslator(format HashFormat) *Translator {
	return &Translator{format: format, media: map[string]*medium{}}
}

func (t *Translator) medium(name string) *medium {
	m := t.media[name]
	if m == nil {
		m = &medium{copies: map[messages.Key]int{}, owners: map[string]map[messages.Key]struct{}{}}
		t.media[name] = m
	}
	return m
}

// Inventory returns the keys each medium holds (at least one copy).
func (t *Translator) Inventory() map[string][]messages.Key {
	out := make(map[string][]messages.Key, len(t.media))
	for name, m := range t.media {
		if len(m.copies) == 0 {
			continue
		}
		keys := make([]messages.Key, 0, len(m.copies))
		for k := range m.copies {
			keys = append(keys, k)
		}
		out[name] = keys
	}
	return out
}

// Apply records e and returns the wire events it makes (possibly none).
func (t *Translator) Apply(e *messages.Event) []Event {
	med := e.Medium
	if med == "" {
		med = messages.MediumCPU
	}
	switch e.Kind {
	case messages.BlockStored:
		return t.stored(e, med)
	case messages.BlockRemoved:
		return t.removed(e, med, e.Keys)
	case messages.AllBlocksCleared:
		return t.cleared(e, med)
	}
	return nil
}

// add records a copy; it reports whether the key is new to the medium.
func (m *medium) add(owner string, k messages.Key) (added, first bool) {
	keys := m.owners[owner]
	if keys == nil {
		keys = map[messages.Key]struct{}{}
		m.owners[owner] = keys
	}
	if _, held := keys[k]; held {
		return false, false
	}
	keys[k] = struct{}{}
	m.copies[k]++
	return true, m.copies[k] == 1
}

// drop removes a copy; it reports whether it was held and whether it was
// the medium's last.
func (m *medium) drop(owner string, k messages.Key) (held, last bool) {
	keys := m.owners[owner]
	if _, ok := keys[k]; !ok {
		return false, false
	}
	delete(keys, k)
	if m.copies[k]--; m.copies[k] == 0 {
		delete(m.copies, k)
		return true, true
	}
	return true, false
}

func (t *Translator) stored(e *messages.Event, med string) []Event {
	m := t.medium(med)
	var out []Event
	var run []int // indexes into e.Keys of the current run
	flush := func() {
		if len(run) > 0 {
			out = append(out, t.storedRun(e, med, run))
			run = run[:0]
		}
	}
	for i, k := range e.Keys {
		added, first := m.add(e.Ownership, k)
		if !added {
			t.Duplicates++
		}
		if !first {
			flush()
			continue
		}
		if len(run) > 0 && !t.chained(e, run[len(run)-1], i) {
			flush()
		}
		run = append(run, i)
	}
	flush()
	return out
}

// chained reports whether key j directly follows key i in their call.
func (t *Translator) chained(e *messages.Event, i, j int) bool {
	if len(e.Place) != len(e.Keys) {
		return false // no provenance: never claim a chain
	}
	pi, pj := e.Place[i], e.Place[j]
	return e.Keys[i].Group == e.Keys[j].Group && pi.Index >= 0 &&
		pj.Index == pi.Index+1 && pj.Parent == e.Keys[i].Hash
}

// storedRun builds the BlockStored of the keys e.Keys[run...], a chain.
func (t *Translator) storedRun(e *messages.Event, med string, run []int) Event {
	first := e.Keys[run[0]]
	g := first.Group
	ev := Event{Type: TypeBlockStored, Medium: med, GroupIdx: &g,
		Locality: e.Locality, Ownership: e.Ownership, BlockHashes: make([]Hash, len(run))}
	for i, idx := range run {
		ev.BlockHashes[i] = WireHash(e.Keys[idx].Hash, t.format)
	}
	ctx := e.Ctx
	if ctx != nil {
		ev.BlockSize = ctx.BlockSize
		ev.LoRAName = ctx.LoRAName
		if ctx.LoRAID != 0 {
			id := int64(ctx.LoRAID)
			ev.LoRAID = &id
		}
		if len(ctx.ExtraKeys) > 0 {
			ev.ExtraKeys = make([][]string, len(run))
			for i := range run {
				ev.ExtraKeys[i] = ctx.ExtraKeys
			}
		}
	}
	if len(e.Place) == len(e.Keys) {
		if p := e.Place[run[0]].Parent; p != "" {
			h := WireHash(p, t.format)
			ev.Parent = &h
		}
		ev.TokenIDs = t.runTokens(e, run)
	}
	if len(ev.TokenIDs) == 0 || ev.BlockSize <= 0 {
		ev.TokenIDs = nil
		t.Placeholders += uint64(len(run))
	}
	return ev
}

// runTokens is the tokens of the run's blocks: a subslice of the call's
// token ids (the run is consecutive in the call), or nil when the context
// does not hold them all.
func (t *Translator) runTokens(e *messages.Event, run []int) []int32 {
	firstP, lastP := e.Place[run[0]], e.Place[run[len(run)-1]]
	lo, ok1 := messages.BlockTokens(e.Ctx, firstP)
	hi, ok2 := messages.BlockTokens(e.Ctx, lastP)
	if !ok1 || !ok2 || len(lo) == 0 || len(hi) == 0 {
		return nil
	}
	bs := e.Ctx.BlockSize
	return e.Ctx.TokenIDs[firstP.Index*bs : (lastP.Index+1)*bs]
}

// removed drops the owner's copies of keys and announces the keys whose last
// copy in the medium went away, one BlockRemoved per group.
func (t *Translator) removed(e *messages.Event, med string, keys []messages.Key) []Event {
	m := t.medium(med)
	var gone []messages.Key
	for _, k := range keys {
		held, last := m.drop(e.Ownership, k)
		if !held {
			t.UnknownRemovals++
		}
		if last {
			gone = append(gone, k)
		}
	}
	return t.removals(e, med, gone)
}

func (t *Translator) removals(e *messages.Event, med string, gone []messages.Key) []Event {
	var out []Event
	byGroup := map[uint32]int{} // group → index in out
	for _, k := range gone {
		i, ok := byGroup[k.Group]
		if !ok {
			g := k.Group
			i = len(out)
			byGroup[g] = i
			out = append(out, Event{Type: TypeBlockRemoved, Medium: med, GroupIdx: &g,
				Locality: e.Locality, Ownership: e.Ownership})
		}
		out[i].BlockHashes = append(out[i].BlockHashes, WireHash(k.Hash, t.format))
	}
	return out
}

// cleared drops every copy the owner held in the medium. When no medium
// holds anything any more that is AllBlocksCleared (vLLM's event has no
// medium: it clears everything a router knows of this node); otherwise the
// keys whose last copy went are announced removed, so the other media's
// blocks stay known.
func (t *Translator) cleared(e *messages.Event, med string) []Event {
	m := t.medium(med)
	held := m.owners[e.Ownership]
	keys := make([]messages.Key, 0, len(held))
	for k := range held {
		keys = append(keys, k)
	}
	var gone []messages.Key
	for _, k := range keys {
		if _, last := m.drop(e.Ownership, k); last {
			gone = append(gone, k)
		}
	}
	for _, other := range t.media {
		if len(other.copies) > 0 {
			return t.removals(e, med, gone)
		}
	}
	return []Event{{Type: TypeAllBlocksCleared}}
}

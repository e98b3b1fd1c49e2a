package events

import (
	"fmt"
	"maps"
	"slices"

	"github.com/kvtier/kvtier/messages"
)

// Translator turns tier events into wire events and keeps, per medium, the
// copies of every block the tiers announced, the writes in flight and the
// blocks held back for their parent. It is plain data, owned by the hub
// actor (or a test): no goroutines, no clock, no I/O.
//
// Invariants:
//   - copies[m][k] = the number of tiers (Ownership values) of medium m
//     holding k announced, and owners[m][o] holds exactly the keys tier o of
//     m holds announced; a key is absent from copies[m] rather than at 0.
//   - a BlockStored for k in m is emitted only when copies[m][k] goes 0 → 1,
//     a BlockRemoved only when it goes 1 → 0: the wire's stored-minus-removed
//     per medium is exactly the keys of copies[m].
//   - parents first, across media: a stored block whose parent p is not
//     announced in any medium but is being written in one (a BlockWriting
//     note, not yet stored or aborted) or is itself held in one, is held
//     (waiting[m][p], in the block's own medium m) and announced right after
//     p is announced in any medium — or, when p's writes all end unreadable
//     everywhere, announced as it is (kvtier does not hold p then). So a
//     router that resolves chains by parent never sees a block before its
//     parent (a STORAGE copy landing while its parent's CPU copy is still
//     held, say). Holding never forms a cycle, so every held block is
//     released once its ancestors' writes end.
//   - a held copy that is removed before it was announced is dropped
//     silently: the wire never saw it. One removal (or clear) is one step:
//     its copies all go before anything waiting is released, so a held
//     child removed with its held parent is not released by the parent's
//     going, and a key one tier's copy leaves while another's is released
//     in its place is neither removed nor stored.
//   - stored runs keep chain order: each block of a run is the child of the
//     one before it, so its parent_block_hash is its first block's parent
//     and its token ids are the concatenation of its blocks' tokens.
type Translator struct {
	format HashFormat
	media  map[string]*medium
	// SpecKind is the kv_cache_spec_kind of stored blocks whose request did
	// not say (events.kv_cache_spec_kind); "" = omitted.
	SpecKind string
	// Learned, when set, gives stored blocks whose own provenance has no
	// token ids those their engine announced for them (Learned).
	Learned *Learned
	// Counters (monotonic).
	Filled          uint64 // stored blocks given learned token ids
	Placeholders    uint64 // blocks announced without full provenance
	UnknownRemovals uint64 // removals of keys the translator never saw stored
	Duplicates      uint64 // stores of a copy already held (ignored)
	Held            uint64 // stored blocks held back until their parent was announced
}

// copyOf names one tier's copy of a block.
type copyOf struct {
	owner string
	key   messages.Key
}

type medium struct {
	copies  map[messages.Key]int
	owners  map[string]map[messages.Key]struct{}
	writes  map[copyOf]struct{}           // (tier, key) writes in flight
	writers map[messages.Key]int          // key → tiers writing it
	waiting map[messages.Key][]*block     // parent → held blocks waiting for it
	heldOn  map[messages.Key]messages.Key // held key → the parent it waits for
	held    map[messages.Key]int          // held key → copies of it held
}

// block is one stored copy on its way to the wire.
type block struct {
	med      string // its medium
	key      messages.Key
	owner    string
	locality string
	src      source
}

// source is where a block's provenance comes from: a Provenance, or a
// context and the block's place in its call.
type source struct {
	prov  *messages.Provenance
	ctx   *messages.ReqContext
	place messages.Placement
	known bool // place (or prov) is known: the parent hash is meaningful
}

func sourceOf(e *messages.Event, i int) source {
	if i < len(e.Prov) && e.Prov[i] != nil {
		return source{prov: e.Prov[i], known: true}
	}
	if len(e.Place) == len(e.Keys) && e.Place[i].Index >= 0 {
		return source{ctx: e.Ctx, place: e.Place[i], known: true}
	}
	return source{ctx: e.Ctx}
}

// sourceOf is block i's source, its token ids learned from its engine's
// own events where it has none.
func (t *Translator) sourceOf(e *messages.Event, i int) source {
	s := sourceOf(e, i)
	if p := t.learnedFor(e, i, s); p != nil {
		t.Filled++
		return source{prov: p, ctx: e.Ctx, known: true}
	}
	return s
}

// learnedFor is what the translator learned of block i of stored event e,
// when its source s has no token ids and the block's size is the learned
// one (a chunk of several engine blocks is not one learned block).
func (t *Translator) learnedFor(e *messages.Event, i int, s source) *messages.Provenance {
	if t.Learned == nil || s.tokens() != nil {
		return nil
	}
	p := t.Learned.Lookup(e.Keys[i].Hash)
	if p == nil {
		return nil
	}
	if size := s.meta().blockSize; size != 0 && size != p.BlockSize {
		return nil
	}
	return p
}

// AwaitsTokens reports whether e stores an engine's blocks (it carries the
// request's context) of which some have no token ids yet, in a block size
// the engines' events announce (or before any was heard): their engine's
// announcement of them may still be on its way (HubConfig.LearnWait).
func (t *Translator) AwaitsTokens(e *messages.Event) bool {
	if t.Learned == nil || e.Kind != messages.BlockStored || e.Ctx == nil {
		return false
	}
	for i := range e.Keys {
		s := sourceOf(e, i)
		if s.tokens() != nil || t.learnedFor(e, i, s) != nil {
			continue
		}
		if size := s.meta().blockSize; size == 0 || t.Learned.HasBlockSize(size) || t.Learned.Sizes() == 0 {
			return true
		}
	}
	return false
}

// parent is the block's parent hash ("" at the start of a prompt) and
// whether it is known.
func (s source) parent() (string, bool) {
	switch {
	case s.prov != nil:
		return string(s.prov.ParentHash), true
	case s.known:
		return s.place.Parent, true
	}
	return "", false
}

// tokens are the block's token ids, nil unless there are exactly
// blockSize of them.
func (s source) tokens() []int32 {
	if s.prov != nil {
		if s.prov.Full() {
			return s.prov.TokenIDs
		}
		return nil
	}
	if !s.known {
		return nil
	}
	t, _ := messages.BlockTokens(s.ctx, s.place)
	return t
}

// meta is what every block of one wire event shares.
type meta struct {
	blockSize int
	loraID    int
	loraName  string
	specKind  string // "" = unknown (the translator's default applies)
	window    int
	session   string
}

func (s source) meta() meta {
	switch {
	case s.prov != nil:
		// NB: a block's stored provenance (promoted, fetched from a peer) has
		// no spec kind, window or session: those come with requests only
		// (a learned provenance has its request's context beside it).
		m := meta{blockSize: s.prov.BlockSize, loraID: s.prov.LoRAID, loraName: s.prov.LoRAName}
		if s.ctx != nil {
			m.specKind, m.window, m.session = s.ctx.SpecKind, s.ctx.SlidingWindow, s.ctx.SessionID
		}
		return m
	case s.ctx != nil:
		return meta{s.ctx.BlockSize, s.ctx.LoRAID, s.ctx.LoRAName, s.ctx.SpecKind, s.ctx.SlidingWindow, s.ctx.SessionID}
	}
	return meta{}
}

func (s source) extraKeys() []string {
	switch {
	case s.prov != nil:
		return s.prov.ExtraKeys
	case s.ctx != nil:
		return s.ctx.ExtraKeys
	}
	return nil
}

// NewTranslator builds an empty translator writing hashes in format.
func NewTranslator(format HashFormat) *Translator {
	return &Translator{format: format, media: map[string]*medium{}}
}

func (t *Translator) medium(name string) *medium {
	m := t.media[name]
	if m == nil {
		m = &medium{copies: map[messages.Key]int{}, owners: map[string]map[messages.Key]struct{}{},
			writes: map[copyOf]struct{}{}, writers: map[messages.Key]int{}, waiting: map[messages.Key][]*block{},
			heldOn: map[messages.Key]messages.Key{}, held: map[messages.Key]int{}}
		t.media[name] = m
	}
	return m
}

// Inventory returns the keys each medium holds announced (at least one
// copy).
func (t *Translator) Inventory() map[string][]messages.Key {
	out := make(map[string][]messages.Key, len(t.media))
	for name, m := range t.media {
		if len(m.copies) == 0 {
			continue
		}
		out[name] = slices.Collect(maps.Keys(m.copies))
	}
	return out
}

// Holding is the number of stored copies held back for their parent now.
func (t *Translator) Holding() int {
	n := 0
	for _, m := range t.media {
		for _, c := range m.held {
			n += c
		}
	}
	return n
}

// Apply records e and returns the wire events it makes (possibly none).
func (t *Translator) Apply(e *messages.Event) []Event {
	med := e.Medium
	if med == "" {
		med = messages.MediumCPU
	}
	m := t.medium(med)
	switch e.Kind {
	case messages.BlockStored:
		var out []*block
		for i, k := range e.Keys {
			out = t.stored(m, &block{med: med, key: k, owner: e.Ownership, locality: e.Locality, src: t.sourceOf(e, i)}, out)
		}
		return t.storedEvents(out)
	case messages.BlockRemoved:
		return t.removed(m, e, med, e.Keys)
	case messages.AllBlocksCleared:
		return t.cleared(m, e, med)
	case messages.BlockWriting:
		for _, k := range e.Keys {
			m.startWrite(e.Ownership, k)
		}
	case messages.BlockWriteAborted:
		var out []*block
		for _, k := range e.Keys {
			m.endWrite(e.Ownership, k)
			out = t.settle(k, out)
		}
		return t.storedEvents(out)
	}
	return nil
}

// Restate is the wire events of e's stored blocks that the translator
// holds announced, but skip, without recording anything: the same blocks
// announced again, for a listener that came after them.
func (t *Translator) Restate(e *messages.Event, skip ...messages.Key) []Event {
	if e.Kind != messages.BlockStored {
		return nil
	}
	med := e.Medium
	if med == "" {
		med = messages.MediumCPU
	}
	m := t.media[med]
	if m == nil {
		return nil
	}
	skipped := make(map[messages.Key]struct{}, len(skip))
	for _, k := range skip {
		skipped[k] = struct{}{}
	}
	var out []*block
	for i, k := range e.Keys {
		if _, told := skipped[k]; m.copies[k] > 0 && !told {
			out = append(out, &block{med: med, key: k, owner: e.Ownership, locality: e.Locality, src: t.sourceOf(e, i)})
		}
	}
	return t.storedEvents(out)
}

func (m *medium) startWrite(owner string, k messages.Key) {
	c := copyOf{owner, k}
	if _, dup := m.writes[c]; !dup {
		m.writes[c] = struct{}{}
		m.writers[k]++
	}
}

func (m *medium) endWrite(owner string, k messages.Key) {
	c := copyOf{owner, k}
	if _, ok := m.writes[c]; ok {
		delete(m.writes, c)
		if m.writers[k]--; m.writers[k] == 0 {
			delete(m.writers, k)
		}
	}
}

// blocking reports whether k's children must wait: no medium announces k,
// but some medium is writing it or holds it back.
func (t *Translator) blocking(k messages.Key) bool {
	pending := false
	for _, m := range t.media {
		if m.copies[k] > 0 {
			return false
		}
		pending = pending || m.writers[k] > 0 || m.held[k] > 0
	}
	return pending
}

// closesCycle reports whether holding k on parent p would close a cycle of
// held blocks, in any media (only hashes that are not a prefix chain can do
// that).
func (t *Translator) closesCycle(k, p messages.Key) bool {
	limit := 1
	for _, m := range t.media {
		limit += len(m.heldOn)
	}
	for range limit {
		if p == k {
			return true
		}
		next, held := t.heldOn(p)
		if !held {
			return false
		}
		p = next
	}
	return true // a loop not through k: never hold onto it
}

// heldOn is the parent a held copy of k waits for, in whichever medium.
func (t *Translator) heldOn(k messages.Key) (messages.Key, bool) {
	for _, m := range t.media {
		if p, ok := m.heldOn[k]; ok {
			return p, true
		}
	}
	return messages.Key{}, false
}

// add records an announced copy; it reports whether the copy is new and
// whether it is the medium's first.
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

// drop removes an announced copy; it reports whether it was held and
// whether it was the medium's last.
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

// isHeld reports whether owner's copy of k is held back.
func (m *medium) isHeld(owner string, k messages.Key) bool {
	if m.held[k] == 0 {
		return false
	}
	for _, b := range m.waiting[m.heldOn[k]] {
		if b.key == k && b.owner == owner {
			return true
		}
	}
	return false
}

// unhold forgets owner's held copy of k (removed before it was announced);
// it reports whether there was one.
func (m *medium) unhold(owner string, k messages.Key) bool {
	if m.held[k] == 0 {
		return false
	}
	p := m.heldOn[k]
	list := m.waiting[p]
	for i, b := range list {
		if b.key == k && b.owner == owner {
			list = append(list[:i:i], list[i+1:]...)
			if len(list) == 0 {
				delete(m.waiting, p)
			} else {
				m.waiting[p] = list
			}
			m.released(k)
			return true
		}
	}
	return false
}

// released counts one held copy of k gone from waiting.
func (m *medium) released(k messages.Key) {
	if m.held[k]--; m.held[k] <= 0 {
		delete(m.held, k)
		delete(m.heldOn, k)
	}
}

// stored records one stored copy: held back for its parent, or announced
// (with whatever was waiting for it) onto out.
func (t *Translator) stored(m *medium, b *block, out []*block) []*block {
	m.endWrite(b.owner, b.key)
	if _, have := m.owners[b.owner][b.key]; have || m.isHeld(b.owner, b.key) {
		t.Duplicates++
		return t.settle(b.key, out)
	}
	if ph, ok := b.src.parent(); ok && ph != "" {
		p := messages.Key{Namespace: b.key.Namespace, Hash: ph, Group: b.key.Group}
		// NB: a key another copy of which waits on a different parent
		// (inconsistent provenance) is not held on two: it goes now.
		if other, held := m.heldOn[b.key]; (!held || other == p) && t.blocking(p) && !t.closesCycle(b.key, p) {
			m.waiting[p] = append(m.waiting[p], b)
			m.heldOn[b.key] = p
			m.held[b.key]++
			t.Held++
			return out
		}
	}
	return t.announce(m, b, out)
}

// announce adds b's copy (onto out when it is the medium's first), then
// releases what waited for it.
func (t *Translator) announce(m *medium, b *block, out []*block) []*block {
	added, first := m.add(b.owner, b.key)
	if !added {
		t.Duplicates++
	}
	if first {
		out = append(out, b)
	}
	return t.settle(b.key, out)
}

// settle releases, breadth first, the blocks waiting for k in every medium
// once k no longer blocks them (announced in some medium, or no longer
// written nor held in any).
func (t *Translator) settle(k messages.Key, out []*block) []*block {
	queue := []messages.Key{k}
	for len(queue) > 0 {
		x := queue[0]
		queue = queue[1:]
		if t.blocking(x) {
			continue
		}
		for _, name := range t.names() {
			m := t.media[name]
			kids := m.waiting[x]
			if len(kids) == 0 {
				continue
			}
			delete(m.waiting, x)
			for _, b := range kids {
				m.released(b.key)
				added, first := m.add(b.owner, b.key)
				if !added {
					t.Duplicates++
				}
				if first {
					out = append(out, b)
				}
				queue = append(queue, b.key)
			}
		}
	}
	return out
}

// names are the media in a fixed order, so releases are deterministic.
func (t *Translator) names() []string {
	return slices.Sorted(maps.Keys(t.media))
}

// storedEvents groups announced blocks, in order, into BlockStored events:
// a block joins the event before it when it is that event's last block's
// child in the same medium, group and tier, with the same block size and
// LoRA, and with tokens exactly when the others have them.
func (t *Translator) storedEvents(blocks []*block) []Event {
	var out []Event
	var r run
	for _, b := range blocks {
		if !r.accepts(b) {
			if r.open() {
				out = append(out, t.finish(&r))
			}
			r = t.start(b)
			continue
		}
		r.add(b, t.format)
	}
	if r.open() {
		out = append(out, t.finish(&r))
	}
	return out
}

// run is a BlockStored being built.
type run struct {
	ev       Event
	last     messages.Key
	meta     meta
	full     bool
	toks     []int32              // the tokens so far, clipped: appending never writes into a shared array
	alias    *messages.ReqContext // toks is alias.TokenIDs[lo:hi] (no copy) while set
	lo, hi   int
	extra    [][]string
	extraSet bool
}

func (r *run) open() bool { return len(r.ev.BlockHashes) > 0 }

func (t *Translator) start(b *block) run {
	g := b.key.Group
	r := run{ev: Event{Type: TypeBlockStored, Medium: b.med, GroupIdx: &g, Locality: b.locality, Ownership: b.owner},
		meta: b.src.meta()}
	r.ev.BlockSize, r.ev.LoRAName = r.meta.blockSize, r.meta.loraName
	r.ev.SpecKind, r.ev.SessionID = r.meta.specKind, r.meta.session
	if r.ev.SpecKind == "" {
		r.ev.SpecKind = t.SpecKind
	}
	if r.meta.window > 0 {
		w := int64(r.meta.window)
		r.ev.Window = &w
	}
	if r.meta.loraID != 0 {
		id := int64(r.meta.loraID)
		r.ev.LoRAID = &id
	}
	if ph, ok := b.src.parent(); ok && ph != "" {
		h := WireHash(ph, t.format)
		r.ev.Parent = &h
	}
	toks := b.src.tokens()
	r.full = toks != nil && r.meta.blockSize > 0
	if r.full {
		r.toks = toks[:len(toks):len(toks)]
		if b.src.prov == nil {
			r.alias, r.lo = b.src.ctx, b.src.place.Index*r.meta.blockSize
			r.hi = r.lo + r.meta.blockSize
		}
	}
	r.add(b, t.format)
	return r
}

// accepts reports whether b continues the run's chain.
func (r *run) accepts(b *block) bool {
	if !r.open() || b.med != r.ev.Medium || b.key.Group != r.last.Group || b.owner != r.ev.Ownership || b.locality != r.ev.Locality {
		return false
	}
	if ph, ok := b.src.parent(); !ok || ph != r.last.Hash {
		return false
	}
	toks := b.src.tokens()
	return b.src.meta() == r.meta && (toks != nil && r.meta.blockSize > 0) == r.full
}

// add appends b (the first block, or one accepts took) to the run.
func (r *run) add(b *block, f HashFormat) {
	if r.open() && r.full {
		s := b.src
		if r.alias != nil && s.prov == nil && s.ctx == r.alias && s.place.Index*r.meta.blockSize == r.hi {
			r.hi += r.meta.blockSize
			r.toks = r.alias.TokenIDs[r.lo:r.hi:r.hi]
		} else {
			r.alias = nil
			r.toks = append(r.toks, s.tokens()...)
		}
	}
	r.ev.BlockHashes = append(r.ev.BlockHashes, WireHash(b.key.Hash, f))
	ks := b.src.extraKeys()
	r.extra = append(r.extra, ks)
	r.extraSet = r.extraSet || len(ks) > 0
	r.last = b.key
}

func (t *Translator) finish(r *run) Event {
	ev := r.ev
	if r.full {
		ev.TokenIDs = r.toks
	} else {
		t.Placeholders += uint64(len(ev.BlockHashes))
	}
	if r.extraSet {
		ev.ExtraKeys = r.extra
	}
	return ev
}

// removed drops the owner's copies of keys and announces the keys whose last
// copy in the medium went away, one BlockRemoved per group. A held copy
// goes silently (it was never announced).
//
// The event is applied as one step: every copy it names is dropped (or
// unheld) before anything waiting is released. Releasing per key would
// let a held copy the same event removes later — a held child of a held
// parent removed first — be announced stored by the parent's release and
// then announced removed (or, for a key the event drops, removed then stored
// again while another tier's copy stays).
func (t *Translator) removed(m *medium, e *messages.Event, med string, keys []messages.Key) []Event {
	var gone []messages.Key
	for _, k := range keys {
		// NB: a tier that removes k is not writing it (a write note of k
		// still open here would only keep k's children waiting).
		m.endWrite(e.Ownership, k)
		if !m.unhold(e.Ownership, k) {
			held, last := m.drop(e.Ownership, k)
			if !held {
				t.UnknownRemovals++
			}
			if last {
				gone = append(gone, k)
			}
		}
	}
	var released []*block
	for _, k := range keys {
		released = t.settle(k, released)
	}
	gone, released = stayed(med, gone, released)
	return append(t.removals(e, med, gone), t.storedEvents(released)...)
}

// stayed takes out of gone (keys whose last announced copy in med went)
// and released (copies announced as their medium's first) the keys in both
// in med: one tier's copy went and another's, held until now, took its place
// in the same step, so the medium never stopped holding the key and the wire
// need not say anything about it.
func stayed(med string, gone []messages.Key, released []*block) ([]messages.Key, []*block) {
	if len(gone) == 0 || len(released) == 0 {
		return gone, released
	}
	back := make(map[messages.Key]bool, len(released))
	for _, b := range released {
		if b.med == med {
			back[b.key] = true
		}
	}
	both := map[messages.Key]bool{}
	var keptGone []messages.Key
	for _, k := range gone {
		if back[k] {
			both[k] = true
			continue
		}
		keptGone = append(keptGone, k)
	}
	if len(both) == 0 {
		return gone, released
	}
	var keptReleased []*block
	for _, b := range released {
		if b.med != med || !both[b.key] {
			keptReleased = append(keptReleased, b)
		}
	}
	return keptGone, keptReleased
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

// cleared drops every copy the owner held in the medium, announced or held
// back. When no medium holds anything any more that is AllBlocksCleared
// (vLLM's event has no medium: it clears everything a router knows of this
// node); otherwise the keys whose last copy went are announced removed, so
// the other media's blocks stay known.
func (t *Translator) cleared(m *medium, e *messages.Event, med string) []Event {
	held := m.owners[e.Ownership]
	keys := slices.Collect(maps.Keys(held))
	var gone []messages.Key
	for _, k := range keys {
		if _, last := m.drop(e.Ownership, k); last {
			gone = append(gone, k)
		}
	}
	var unheld []messages.Key
	for _, list := range m.waiting {
		for _, b := range list {
			if b.owner == e.Ownership {
				unheld = append(unheld, b.key)
			}
		}
	}
	// As in removed: every held copy goes before anything is released, or
	// a held child of a held parent would be released by the parent's
	// going and announced as if the tier still held it.
	for _, k := range unheld {
		m.unhold(e.Ownership, k)
	}
	var released []*block
	for _, k := range unheld {
		released = t.settle(k, released)
	}
	gone, released = stayed(med, gone, released)
	after := t.storedEvents(released)
	for _, other := range t.media {
		if len(other.copies) > 0 {
			return append(t.removals(e, med, gone), after...)
		}
	}
	return append([]Event{{Type: TypeAllBlocksCleared}}, after...)
}

// CheckInvariants verifies the bookkeeping above by a full scan (tests).
func (t *Translator) CheckInvariants() error {
	for name, m := range t.media {
		writers := map[messages.Key]int{}
		for c := range m.writes {
			writers[c.key]++
		}
		if !maps.Equal(writers, m.writers) {
			return fmt.Errorf("%s: writers %v, writes say %v", name, m.writers, writers)
		}
		held := map[messages.Key]int{}
		for p, list := range m.waiting {
			if len(list) == 0 {
				return fmt.Errorf("%s: empty waiting list for %v", name, p)
			}
			for _, b := range list {
				held[b.key]++
				if m.heldOn[b.key] != p {
					return fmt.Errorf("%s: %v waits on %v, heldOn says %v", name, b.key, p, m.heldOn[b.key])
				}
				if _, announced := m.owners[b.owner][b.key]; announced {
					return fmt.Errorf("%s: %v both held and announced by %q", name, b.key, b.owner)
				}
			}
		}
		if !maps.Equal(held, m.held) || len(m.heldOn) != len(m.held) {
			return fmt.Errorf("%s: held %v, waiting lists say %v", name, m.held, held)
		}
		copies := map[messages.Key]int{}
		for _, keys := range m.owners {
			for k := range keys {
				copies[k]++
			}
		}
		if !maps.Equal(copies, m.copies) {
			return fmt.Errorf("%s: copies %v, owners say %v", name, m.copies, copies)
		}
	}
	return nil
}

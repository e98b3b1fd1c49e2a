package cpu

import "github.com/kvtier/kvtier/messages"

// Provenance retained with each ready block, so that a peer's lookup (and
// a cascade's header) can carry it: the committing job's context and the
// block's place in that context's call, or a Provenance handed in whole
// (promotions, peer fetches). A reference costs 40 bytes a slot and copies
// nothing: token ids stay in the context they came with.

// provRef is where a ready block's provenance comes from.
type provRef struct {
	ctx   *messages.ReqContext // the committing job's context (with place)
	place messages.Placement
	prov  *messages.Provenance // given whole; wins over ctx
}

// ProvSource says where the provenance of each key of a commit comes from:
// Prov[i] when set, else Ctx with Place[i].
type ProvSource struct {
	Ctx   *messages.ReqContext
	Place []messages.Placement // nil or one per key
	Prov  []*messages.Provenance
}

func (p ProvSource) ref(i int) provRef {
	if i < len(p.Prov) && p.Prov[i] != nil {
		return provRef{prov: p.Prov[i]}
	}
	if p.Ctx == nil || i >= len(p.Place) {
		return provRef{}
	}
	return provRef{ctx: p.Ctx, place: p.Place[i]}
}

// parentHash is the hash of the block before this one in its chain; false
// at the start of a prompt or when unknown. It builds nothing.
func (r provRef) parentHash() (string, bool) {
	switch {
	case r.prov != nil:
		return string(r.prov.ParentHash), len(r.prov.ParentHash) > 0
	case r.ctx != nil && r.place.Index >= 0:
		return r.place.Parent, r.place.Parent != ""
	}
	return "", false
}

// resolve builds the provenance (nil when unknown).
func (r provRef) resolve() *messages.Provenance {
	if r.prov != nil {
		return r.prov
	}
	return messages.NewProvenance(r.ctx, r.place)
}

// Provenance returns a ready key's retained provenance, nil when the key is
// not ready or its provenance is unknown. Built on demand (one small
// allocation; token ids are not copied).
func (s *State) Provenance(k messages.Key) *messages.Provenance {
	idx, ok := s.index[k]
	if !ok || s.slots[idx].state != slotReady {
		return nil
	}
	return s.slots[idx].prov.resolve()
}

// ProvenanceOf answers Provenance for each key whose status is a HIT (nil
// for the others): a LookupResult's or a PinResult's Prov.
func (s *State) ProvenanceOf(keys []messages.Key, status []messages.LookupStatus) []*messages.Provenance {
	out := make([]*messages.Provenance, len(keys))
	for i, k := range keys {
		if status == nil || (i < len(status) && status[i] == messages.Hit) {
			out[i] = s.Provenance(k)
		}
	}
	return out
}

// Resident is every readable block of ns, parents before their children
// (a block whose parent the tier does not hold starts a chain), with each
// one's retained provenance (nil where unknown): what a router needs to
// credit an engine that came after the blocks did (cpumsg.ResidentOf).
// O(slots); it copies keys and provenance references, never slot bytes.
func (s *State) Resident(ns messages.Namespace) ([]messages.Key, []*messages.Provenance) {
	var idxs []int
	byHash := map[string]int{} // a held block's hash → its place in idxs
	for idx := range s.slots {
		sl := &s.slots[idx]
		if sl.state == slotReady && sl.key.Namespace == ns && !IsQuarantineKey(sl.key) {
			byHash[sl.key.Hash] = len(idxs)
			idxs = append(idxs, idx)
		}
	}
	children := make(map[int][]int, len(idxs)) // place → the places whose parent it is
	var roots []int
	for i, idx := range idxs {
		if parent, ok := s.slots[idx].prov.parentHash(); ok {
			if p, held := byHash[parent]; held && p != i {
				children[p] = append(children[p], i)
				continue
			}
		}
		roots = append(roots, i)
	}
	keys := make([]messages.Key, 0, len(idxs))
	prov := make([]*messages.Provenance, 0, len(idxs))
	seen := make([]bool, len(idxs))
	emit := func(i int) {
		seen[i] = true
		keys = append(keys, s.slots[idxs[i]].key)
		prov = append(prov, s.slots[idxs[i]].prov.resolve())
	}
	// NB: depth first, with an explicit stack: a chain is as long as a
	// prompt's blocks, and a cycle (hashes that are no prefix chain) ends
	// where it meets a block already emitted.
	walk := func(root int) {
		stack := []int{root}
		for len(stack) > 0 {
			i := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if seen[i] {
				continue
			}
			emit(i)
			for c := len(children[i]) - 1; c >= 0; c-- {
				stack = append(stack, children[i][c])
			}
		}
	}
	for _, r := range roots {
		walk(r)
	}
	for i := range idxs { // blocks on a cycle of parents: no root reaches them
		if !seen[i] {
			walk(i)
		}
	}
	return keys, prov
}

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

package endpoint

import (
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// Geometry is the pool's region of one block size, as a session of that
// size sees it: a file of Slots slots of BlockBytes, whose slot i is the
// CPU tier's slot Base + i. The engine numbers slots in its file; the
// endpoint turns them into the tier's and back (ids, numbers), so a
// session of any geometry is served as one of a pool of its own.
type Geometry struct {
	BlockBytes int    // bytes per slot
	Base       int    // the tier's number of the region's slot 0
	Slots      int    // slots in the region
	Path       string // the region's file
}

// sessionGeometry finds the region of the block size s's hello declared
// (0: Hello's) and tells it in h.
func (a *endpointActor) sessionGeometry(s *session, declared int, h *wire.Hello) error {
	get := a.ep.cfg.Geometry
	if get == nil {
		return nil
	}
	if declared <= 0 {
		declared = h.BlockBytes
	}
	g, err := get(declared)
	if err != nil {
		return fmt.Errorf("%w: blocks of %d bytes: %w", messages.ErrSizing, declared, err)
	}
	s.geometry = g
	h.PoolPath, h.BlockBytes, h.Slots = g.Path, g.BlockBytes, g.Slots
	return nil
}

// ids turns the session's slot numbers into the tier's.
func (g Geometry) ids(slots []int) []int {
	if g.Base == 0 {
		return slots
	}
	out := make([]int, len(slots))
	for i, n := range slots {
		out[i] = n + g.Base
	}
	return out
}

// numbers turns the tier's slots in a reply into the session's numbers. A
// slot outside the session's region (a block of another geometry under a
// key the session named) answers a lookup MISS and fails any other call:
// the engine would copy another geometry's bytes. The reply's slices are
// the bridge's: changed only in copies.
func (g Geometry) numbers(op wire.Op, rp *wire.Reply) error {
	if op == wire.OpLookup || g.BlockBytes == 0 || !g.changes(rp) {
		return nil // NB: a lookup's are turned by its route (lookupNumbers), before it counts its HITs
	}
	return g.renumber(rp)
}

// lookupNumbers is numbers for a lookup's reply (it cannot fail).
func (g Geometry) lookupNumbers(rp *wire.Reply) {
	if g.BlockBytes != 0 && g.changes(rp) {
		_ = g.renumber(rp)
	}
}

// renumber is numbers' work, once it knows there is some.
func (g Geometry) renumber(rp *wire.Reply) error {
	lookup := rp.Status != nil
	rp.Slots = slices.Clone(rp.Slots)
	if lookup {
		rp.Status = slices.Clone(rp.Status)
	}
	for i, id := range rp.Slots {
		if g.skip(rp, i) {
			continue
		}
		if n := id - g.Base; n >= 0 && n < g.Slots {
			rp.Slots[i] = n
			continue
		}
		if !lookup {
			return fmt.Errorf("%w: slot %d is not in the session's %d-byte region", messages.ErrInternal, id, g.BlockBytes)
		}
		rp.Status[i], rp.Slots[i] = messages.Miss, 0
	}
	return nil
}

// changes reports whether numbers has anything to change in rp.
func (g Geometry) changes(rp *wire.Reply) bool {
	for i, id := range rp.Slots {
		if !g.skip(rp, i) && (g.Base != 0 || id >= g.Slots) {
			return true
		}
	}
	return false
}

// skip: a lookup's slot i stands for no block (its key is not a HIT).
func (g Geometry) skip(rp *wire.Reply, i int) bool {
	return rp.Status != nil && (i >= len(rp.Status) || rp.Status[i] != messages.Hit)
}

// mixedGeometries reports whether the pool serves more than one block
// size now (then a key may be held in slots of another session's size).
func (e *Endpoint) mixedGeometries() bool {
	return e.cfg.Geometries != nil && e.cfg.Geometries() > 1
}

package cpu

import (
	"fmt"

	"github.com/kvtier/kvtier/messages"
)

// geometryFor is the geometry a reservation of keys in slots of blockBytes
// goes to (cpumsg.ReserveSlots.BlockBytes), added to the State from the
// pool's regions when it is new. An engine's reservation names its
// geometry, and the namespace of its keys is learned as that geometry's.
func (a *Actor) geometryFor(blockBytes int, keys []messages.Key) (int, error) {
	if blockBytes == 0 {
		if len(keys) > 0 {
			if gi, ok := a.nsGeometry[keys[0].Namespace]; ok {
				return gi, nil
			}
		}
		return 0, nil
	}
	gi, ok := a.state.GeometryOf(blockBytes)
	if !ok {
		var err error
		if gi, err = a.addGeometry(blockBytes); err != nil {
			return 0, err
		}
	}
	if len(keys) > 0 {
		if a.nsGeometry == nil {
			a.nsGeometry = map[messages.Namespace]int{}
		}
		a.nsGeometry[keys[0].Namespace] = gi
	}
	return gi, nil
}

// addGeometry adds the pool's region of blockBytes (made now if need be),
// and every region before it, to the State, in the pool's order, so that
// both number the slots alike.
func (a *Actor) addGeometry(blockBytes int) (int, error) {
	if _, err := a.pool.Geometry(blockBytes); err != nil {
		return 0, err
	}
	for _, r := range a.pool.Regions()[a.state.Geometries():] {
		gi, base, n, err := a.state.AddGeometry(r.BlockBytes)
		if err != nil {
			return 0, err
		}
		if gi != r.Index || base != r.Base || n != r.Slots {
			return 0, fmt.Errorf("%w: the pool's region %d (%d slots from %d) is the tier's %d (%d from %d)",
				messages.ErrInternal, r.Index, r.Slots, r.Base, gi, n, base)
		}
	}
	gi, _ := a.state.GeometryOf(blockBytes)
	return gi, nil
}

package sim

import (
	"context"

	"github.com/kvtier/kvtier/messages"
)

// A lookup stops at its first MISS, so a held block whose parent no tier
// holds can never be hit: capacity spent on nothing. The sampler measures
// that share of what the node holds, every ReachEvery steps.

// InventoryManager is a manager that can list what its node holds, per
// medium (the embedded node's; Node.Inventory).
type InventoryManager interface {
	Inventory(ctx context.Context) (map[string][]messages.Key, error)
}

// reach keeps every block's parent (from the requests admitted so far)
// and the samples taken.
type reach struct {
	parent  map[messages.Key]messages.Key // a block's parent in its prefix chain; absent at the root
	samples int
	held    int // blocks held, summed over samples
	dead    int // of those, blocks whose chain to the root is broken
}

func newReach() *reach { return &reach{parent: map[messages.Key]messages.Key{}} }

// note records the chain of one request's keys.
func (r *reach) note(keys []messages.Key) {
	for i := 1; i < len(keys); i++ {
		r.parent[keys[i]] = keys[i-1]
	}
}

// sample counts, among the blocks held in any medium, those with an
// ancestor no medium holds.
func (r *reach) sample(inv map[string][]messages.Key) {
	held := map[messages.Key]bool{}
	for _, keys := range inv {
		for _, k := range keys {
			held[k] = true
		}
	}
	reachable := make(map[messages.Key]bool, len(held))
	var ok func(k messages.Key) bool
	ok = func(k messages.Key) bool {
		if v, seen := reachable[k]; seen {
			return v
		}
		reachable[k] = false // NB: a cycle (never in a prefix chain) reads as broken
		p, has := r.parent[k]
		v := !has || (held[p] && ok(p))
		reachable[k] = v
		return v
	}
	r.samples++
	r.held += len(held)
	for k := range held {
		if !ok(k) {
			r.dead++
		}
	}
}

// fraction is the share of held blocks that were unreachable, over all
// samples.
func (r *reach) fraction() float64 {
	if r.held == 0 {
		return 0
	}
	return float64(r.dead) / float64(r.held)
}

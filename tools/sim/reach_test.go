package sim

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/kvtier/kvtier/messages"
)

func TestABlockWhoseParentNoTierHoldsIsUnreachable(t *testing.T) {
	ns := DefaultLayout.Namespace()
	r := newReach()
	chain := Keys(ns, []uint64{1, 2, 3, 4})
	r.note(chain)
	other := Keys(ns, []uint64{10, 11})
	r.note(other)

	// 1, 2 in CPU, 3 on disk: the chain is whole up to 3; 4 not held.
	r.sample(map[string][]messages.Key{messages.MediumCPU: {chain[0], chain[1]},
		messages.MediumStorage: {chain[2]}})
	assert.Equal(t, 0.0, r.fraction(), "a chain across media is whole")

	// 2 evicted everywhere: 3 and 4 hang on nothing; 11 hangs on 10, held.
	r.sample(map[string][]messages.Key{messages.MediumCPU: {chain[0], chain[2], chain[3], other[0], other[1]}})
	assert.Equal(t, 2, r.dead)
	assert.Equal(t, 3+5, r.held)
	assert.InDelta(t, 2.0/8.0, r.fraction(), 1e-9)
}

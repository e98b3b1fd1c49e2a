package cpu

import (
	"iter"
	"slices"

	"github.com/kvtier/kvtier/messages"
)

// slotSet is the slots one job holds at the CPU tier (pinned for a load,
// reserved for a store or as an engine's credit), with a count each.
//
// It is a short slice while the job holds few slots and a map past
// smallSet: most jobs hold a handful, and a map a job (made, filled and
// emptied for every call) was most of what the tier allocated per call.
type slotSet struct {
	small []slotCount
	large map[int]int32 // nil until small outgrows smallSet
}

type slotCount struct {
	idx int
	n   int32
}

// smallSet is the most slots a slotSet keeps in its slice.
const smallSet = 16

// count is how many times the set holds slot idx (0 for a nil set).
func (c *slotSet) count(idx int) int32 {
	switch {
	case c == nil:
		return 0
	case c.large != nil:
		return c.large[idx]
	}
	if i := c.find(idx); i >= 0 {
		return c.small[i].n
	}
	return 0
}

// has reports whether the set holds slot idx.
func (c *slotSet) has(idx int) bool { return c.count(idx) > 0 }

// len is how many slots the set holds (0 for a nil set).
func (c *slotSet) len() int {
	switch {
	case c == nil:
		return 0
	case c.large != nil:
		return len(c.large)
	}
	return len(c.small)
}

// add adds d to slot idx's count (a negative d takes away) and returns the
// new count; a slot whose count reaches 0 leaves the set.
func (c *slotSet) add(idx int, d int32) int32 {
	if c.large != nil {
		n := c.large[idx] + d
		if n <= 0 {
			delete(c.large, idx)
			return 0
		}
		c.large[idx] = n
		return n
	}
	i := c.find(idx)
	switch {
	case i >= 0 && c.small[i].n+d <= 0:
		c.small = slices.Delete(c.small, i, i+1)
		return 0
	case i >= 0:
		c.small[i].n += d
		return c.small[i].n
	case d <= 0:
		return 0
	case len(c.small) < smallSet:
		c.small = append(c.small, slotCount{idx, d})
		return d
	}
	c.large = make(map[int]int32, 2*smallSet)
	for _, e := range c.small {
		c.large[e.idx] = e.n
	}
	c.small = nil
	c.large[idx] = d
	return d
}

func (c *slotSet) find(idx int) int {
	return slices.IndexFunc(c.small, func(e slotCount) bool { return e.idx == idx })
}

// all yields each slot of the set with its count (nothing for a nil set).
// The loop's body may take the slot it was given out of the set (ReleaseJob
// does), not any other.
func (c *slotSet) all() iter.Seq2[int, int32] {
	return func(yield func(int, int32) bool) {
		switch {
		case c == nil:
			return
		case c.large != nil:
			for idx, n := range c.large {
				if !yield(idx, n) {
					return
				}
			}
			return
		}
		// NB: backwards, so that taking out the slot just yielded moves
		// only slots already yielded.
		for i := len(c.small) - 1; i >= 0; i-- {
			if !yield(c.small[i].idx, c.small[i].n) {
				return
			}
		}
	}
}

// setOf is job's set in sets, made if it has none.
func setOf(sets map[messages.JobRef]*slotSet, job messages.JobRef) *slotSet {
	c := sets[job]
	if c == nil {
		c = &slotSet{}
		sets[job] = c
	}
	return c
}

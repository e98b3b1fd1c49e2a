package sim

import "container/list"

// LRU is the simulated GPU block cache: a fixed number of block ids, least
// recently used evicted first. It is not safe for concurrent use (the engine
// scheduler is one thread).
type LRU struct {
	cap   int
	order *list.List               // front = most recent; values are uint64 ids
	index map[uint64]*list.Element // Invariant: len(index) == order.Len() <= cap
}

// NewLRU returns an empty cache of capacity blocks (0 holds nothing).
func NewLRU(capacity int) *LRU {
	return &LRU{cap: capacity, order: list.New(), index: make(map[uint64]*list.Element)}
}

// Len is the number of cached blocks.
func (c *LRU) Len() int { return c.order.Len() }

// Contains reports whether id is cached, without touching it.
func (c *LRU) Contains(id uint64) bool {
	_, ok := c.index[id]
	return ok
}

// Touch marks id most recently used; false if it is not cached.
func (c *LRU) Touch(id uint64) bool {
	e, ok := c.index[id]
	if ok {
		c.order.MoveToFront(e)
	}
	return ok
}

// Add inserts id as most recently used (or touches it), evicting the least
// recently used block when full. It returns the evicted id, if any.
func (c *LRU) Add(id uint64) (evicted uint64, ok bool) {
	if c.cap <= 0 || c.Touch(id) {
		return 0, false
	}
	if c.order.Len() >= c.cap {
		back := c.order.Back()
		evicted = c.order.Remove(back).(uint64)
		delete(c.index, evicted)
		ok = true
	}
	c.index[id] = c.order.PushFront(id)
	return evicted, ok
}

// PrefixHits counts the leading ids of chain that are cached (prefix
// semantics: the count stops at the first miss), touching each hit.
func (c *LRU) PrefixHits(chain []uint64) int {
	n := 0
	for _, id := range chain {
		if !c.Touch(id) {
			break
		}
		n++
	}
	return n
}

// Prefix counts the leading ids of chain that are cached, without touching
// them: an engine's GPU prefix before a lookup (the prefill that uses them
// re-inserts the whole prompt with AddChain).
func (c *LRU) Prefix(chain []uint64) int {
	n := 0
	for n < len(chain) && c.Contains(chain[n]) {
		n++
	}
	return n
}

// AddChain inserts a prompt's prefix chain after its prefill, the chain's
// head last, so the head is the last of it evicted.
func (c *LRU) AddChain(chain []uint64) {
	for i := len(chain) - 1; i >= 0; i-- {
		c.Add(chain[i])
	}
}

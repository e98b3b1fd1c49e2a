package cpu

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

// chainKey is block i of a test chain (its own namespace, so that parents
// built from a hash stay in it).
func chainKey(i int) messages.Key {
	return messages.Key{Namespace: "ns", Hash: fmt.Sprintf("c%04d", i)}
}

// newTree is a prefix index of n slots: slot s holds block s for each of
// parents, inserted in order (block 0 least recent), then set under block
// parents[s] where that is not -1.
func newTree(n int, parents ...int) *prefix {
	p := newPrefix(n)
	for s := range parents {
		p.Insert(s, chainKey(s))
	}
	for s, parent := range parents {
		if parent >= 0 {
			p.SetParent(s, chainKey(parent))
		}
	}
	return p
}

func TestPrefixEvictsADeepestBlockFirst(t *testing.T) {
	// Chain 0 → 1 → 2 touched head first (the head least recent, as LRU
	// would evict it first), then an unrelated block 3.
	p := newTree(8, -1, 0, 1, -1)
	require.NoError(t, p.check())
	assert.False(t, p.isLeaf(0))
	assert.False(t, p.isLeaf(1))
	assert.True(t, p.isLeaf(2))
	// LRU would give 0 1 2 3; the chain is peeled from its tail, and each
	// parent it uncovers is older than 3.
	assert.Equal(t, []int{2, 1, 0, 3}, drain(p, all))
	require.NoError(t, p.check())
	assert.Empty(t, p.kids)
	assert.Empty(t, p.at)
}

func TestPrefixAmongLeavesIsLRU(t *testing.T) {
	// A shared head 0 with two children 1 and 2; 3 alone.
	p := newTree(8, -1, 0, 0, -1)
	p.Access(1) // leaves by recency: 2 3 1
	s, ok := p.Victim(all)
	require.True(t, ok)
	assert.Equal(t, 2, s)
	assert.False(t, p.isLeaf(0), "0 keeps a child")
	assert.Equal(t, []int{3, 1, 0}, drain(p, all), "1 last of the leaves, then its parent")
}

func TestPrefixFallsBackToLRUWhenEveryLeafIsHeld(t *testing.T) {
	p := newTree(8, -1, 0, 1)                    // chain 0 → 1 → 2
	pinned := func(s int) bool { return s != 2 } // the only leaf is held
	s, ok := p.Victim(pinned)
	require.True(t, ok)
	assert.Equal(t, 0, s, "no evictable leaf: the least recently used of the others")
	assert.True(t, p.isLeaf(2), "a skipped leaf stays ranked")
	require.NoError(t, p.check())
	_, ok = p.Victim(func(int) bool { return false })
	assert.False(t, ok)
	assert.Equal(t, []int{2, 1}, drain(p, all))
}

func TestPrefixParentStoredAfterItsChild(t *testing.T) {
	p := newPrefix(4)
	p.Insert(1, chainKey(1))
	p.SetParent(1, chainKey(0)) // the parent is not held yet
	p.Insert(0, chainKey(0))    // it comes back (a promotion, a re-store)
	assert.False(t, p.isLeaf(0), "a block stored under its held child is no leaf")
	require.NoError(t, p.check())
	p.Remove(1)
	assert.True(t, p.isLeaf(0), "its last child gone, it is a leaf again")
	require.NoError(t, p.check())
}

func TestPrefixWithNoParentIsLRU(t *testing.T) {
	p, l := newPrefix(6), newLRU(6)
	for _, q := range []Policy{p, l} {
		for _, s := range []int{3, 0, 5, 1, 4} {
			q.Insert(s, tk(s))
		}
		q.Access(3)
		q.Access(1)
		q.Remove(5)
		q.Insert(2, tk(2))
	}
	assert.Equal(t, drain(l, all), drain(p, all))
}

// refPrefix is the reference for prefix's order, by brute force: slots
// with their key, parent and last use; a victim is the least recently used
// evictable slot none of whose children is held, else the least recently
// used evictable slot.
type refPrefix struct {
	use    uint64
	stamp  map[int]uint64
	key    map[int]messages.Key
	parent map[int]messages.Key // only slots with a parent
}

func newRefPrefix() *refPrefix {
	return &refPrefix{stamp: map[int]uint64{}, key: map[int]messages.Key{}, parent: map[int]messages.Key{}}
}

func (r *refPrefix) bump(s int) { r.use++; r.stamp[s] = r.use }

func (r *refPrefix) victim(evictable func(int) bool) (int, bool) {
	held := map[messages.Key]bool{}
	for _, k := range r.parent {
		held[k] = true
	}
	best, leafBest := -1, -1
	for s, st := range r.stamp {
		if !evictable(s) {
			continue
		}
		if best < 0 || st < r.stamp[best] {
			best = s
		}
		if !held[r.key[s]] && (leafBest < 0 || st < r.stamp[leafBest]) {
			leafBest = s
		}
	}
	if leafBest >= 0 {
		best = leafBest
	}
	if best < 0 {
		return 0, false
	}
	return best, true
}

func (r *refPrefix) remove(s int) {
	delete(r.stamp, s)
	delete(r.key, s)
	delete(r.parent, s)
}

// The policy against the brute-force reference over random operations on
// a random forest of chains: every victim is the reference's (so a block
// with a held child goes only when no leaf is evictable), every slot
// leaves once, and the invariants hold after every operation.
func TestPrefixMatchesReference(t *testing.T) {
	for _, seed := range seeds(t, 2_000_001, 2_000) {
		rng := rand.New(rand.NewSource(seed))
		n := 2 + rng.Intn(14)
		nkeys := 3 * n
		parentOf := make([]int, nkeys) // key i's parent: an earlier key, or -1 (a root)
		for i := range parentOf {
			parentOf[i] = -1
			if i > 0 && rng.Intn(4) != 0 {
				parentOf[i] = rng.Intn(i)
			}
		}
		p, ref := newPrefix(n), newRefPrefix()
		heldKey := map[int]bool{}
		slotKey := map[int]int{}
		var log []string
		fail := func(format string, a ...any) {
			t.Fatalf("seed %d (-seed %d): %s\n%v", seed, seed, fmt.Sprintf(format, a...), log)
		}
		for range 40 + rng.Intn(60) {
			switch op := rng.Intn(10); {
			case op < 4: // insert a free slot with a key not held, often with its parent
				s := rng.Intn(n)
				k := rng.Intn(nkeys)
				if _, in := ref.stamp[s]; in || heldKey[k] {
					continue
				}
				p.Insert(s, chainKey(k))
				ref.bump(s)
				ref.key[s] = chainKey(k)
				heldKey[k], slotKey[s] = true, k
				log = append(log, fmt.Sprintf("insert %d=%d", s, k))
				if parentOf[k] >= 0 && rng.Intn(5) != 0 {
					p.SetParent(s, chainKey(parentOf[k]))
					ref.parent[s] = chainKey(parentOf[k])
					log = append(log, fmt.Sprintf("parent %d←%d", s, parentOf[k]))
				}
			case op < 5: // a parent learnt later (touched while written, then committed)
				s := rng.Intn(n)
				_, has := ref.parent[s]
				if _, in := ref.stamp[s]; !in || has || parentOf[slotKey[s]] < 0 {
					continue
				}
				p.SetParent(s, chainKey(parentOf[slotKey[s]]))
				ref.parent[s] = chainKey(parentOf[slotKey[s]])
				log = append(log, fmt.Sprintf("parent %d←%d", s, parentOf[slotKey[s]]))
			case op < 7:
				s := rng.Intn(n)
				p.Access(s)
				if _, in := ref.stamp[s]; in {
					ref.bump(s)
				}
				log = append(log, fmt.Sprintf("access %d", s))
			case op < 8:
				s := rng.Intn(n)
				p.Remove(s)
				if _, in := ref.stamp[s]; in {
					delete(heldKey, slotKey[s])
					ref.remove(s)
				}
				log = append(log, fmt.Sprintf("remove %d", s))
			default:
				held := map[int]bool{}
				for s := range n {
					held[s] = rng.Intn(3) == 0
				}
				evictable := func(s int) bool { return !held[s] }
				want, wok := ref.victim(evictable)
				got, gok := p.Victim(evictable)
				log = append(log, fmt.Sprintf("victim(held %v) = %d %v", held, got, gok))
				if got != want || gok != wok {
					fail("victim %d %v, reference %d %v", got, gok, want, wok)
				}
				if gok {
					delete(heldKey, slotKey[got])
					ref.remove(got)
				}
			}
			if err := p.check(); err != nil {
				fail("%v", err)
			}
			if p.Len() != len(ref.stamp) {
				fail("policy holds %d, reference %d", p.Len(), len(ref.stamp))
			}
		}
	}
}

// auditPolicy checks each of a State's victims against the reference order
// computed from the prefix policy's own view (its slots, keys, parents and
// stamps) at that moment.
type auditPolicy struct {
	*prefix
	t       *testing.T
	seed    int64
	victims int
	inner   int // victims with a held child (when no leaf was evictable)
}

func (a *auditPolicy) Victim(evictable func(int) bool) (int, bool) {
	ref := newRefPrefix()
	for s := a.all.head; s != none; s = a.all.next[s] {
		ref.stamp[int(s)] = a.stamp[s]
		ref.key[int(s)] = a.key[s]
		if a.hasParent[s] {
			ref.parent[int(s)] = a.parent[s]
		}
	}
	want, wok := ref.victim(evictable)
	got, gok := a.prefix.Victim(evictable)
	if got != want || gok != wok {
		a.t.Fatalf("seed %d: victim %d %v, reference %d %v", a.seed, got, gok, want, wok)
	}
	if gok {
		a.victims++
		for c, k := range ref.parent {
			if c != got && k == ref.key[got] {
				a.inner++
				break
			}
		}
	}
	return got, gok
}

// A State under "prefix" serving requests over shared prefix chains, as the
// bridge drives it (lookup and lease, load, store with provenance, touch,
// failed writes, Clear): every eviction is the reference's, the State's
// invariants and the policy's hold after every request, and the capacity
// accounting is LRU's (the same Reserve outcomes and counts for the same
// requests as long as both hold the same number of slots).
func TestPrefixStateServesChains(t *testing.T) {
	for _, seed := range seeds(t, 3_000_001, 300) {
		rng := rand.New(rand.NewSource(seed))
		n := 8 + rng.Intn(40)
		clk := newFakeClock()
		s, err := NewState(n, "prefix", clk.now)
		require.NoError(t, err)
		audit := &auditPolicy{prefix: s.policy.(*prefix), t: t, seed: seed}
		s.policy = audit
		// Sessions: a shared system prompt of 1-3 blocks, then turns of 1-3
		// blocks each; a request is a session's chain up to some turn.
		sessions := make([][]messages.Key, 6)
		next := 0
		for i := range sessions {
			sys := i % 2
			var c []messages.Key
			for b := range 1 + sys {
				c = append(c, messages.Key{Namespace: "ns", Hash: fmt.Sprintf("sys%d-%d", sys, b)})
			}
			for range 2 + rng.Intn(10) {
				next++
				c = append(c, messages.Key{Namespace: "ns", Hash: fmt.Sprintf("b%d", next)})
			}
			sessions[i] = c
		}
		for req := range 60 + rng.Intn(60) {
			c := sessions[rng.Intn(len(sessions))]
			chain := c[:1+rng.Intn(len(c))]
			h := engineHolder(fmt.Sprintf("r%d", req))
			load := engineJob(messages.JobID(2 * (req + 1)))
			store := engineJob(messages.JobID(2*(req+1) + 1))
			st := s.LookupAndLease(h, chain, true, time.Second)
			hits := 0
			for hits < len(st) && st[hits] == messages.Hit {
				hits++
			}
			if hits > 0 {
				_, err := s.LeaseToPin(h, load, chain[:hits])
				require.NoError(t, err, "seed %d", seed)
			}
			ctx := &messages.ReqContext{RequestID: fmt.Sprintf("r%d", req)}
			if hits > 0 {
				ctx.ParentBlockHash = []byte(chain[hits-1].Hash)
			}
			res, err := s.Reserve(store, chain[hits:])
			if err == nil && len(res.ToStore) > 0 {
				src := ProvSource{Ctx: ctx, Place: messages.Place(chain[hits:], res.ToStore, ctx.ParentBlockHash)}
				if rng.Intn(3) == 0 {
					s.Touch(chain) // vLLM touches before the store completes
				}
				require.NoError(t, s.CommitProv(store, res.ToStore, rng.Intn(10) != 0, make([]uint32, len(res.ToStore)), src))
			} else if err != nil {
				require.ErrorIs(t, err, messages.ErrFull)
			}
			s.Touch(chain)
			if hits > 0 && rng.Intn(4) != 0 {
				require.NoError(t, s.Unpin(load, chain[:hits]))
			}
			if rng.Intn(3) == 0 {
				s.ReleaseHolder(h)
			}
			clk.advance(time.Duration(rng.Intn(400)) * time.Millisecond)
			switch rng.Intn(40) {
			case 0:
				s.Clear()
			case 1:
				s.ReleaseJob(engineJob(messages.JobID(2 * (1 + rng.Intn(req+1)))))
			}
			if err := s.CheckInvariants(); err != nil {
				t.Fatalf("seed %d request %d: %v", seed, req, err)
			}
		}
		assert.Equal(t, uint64(audit.victims), s.Counters.Evictions, "seed %d: every eviction went through the policy once", seed)
	}
}

// The same requests (fresh chains, so that what is present never depends
// on the order) through "lru" and "prefix": the same Reserve outcomes, the
// same evictions counted, the same occupancy. Only which blocks go differs.
func TestPrefixCapacityAccountingIsLRUs(t *testing.T) {
	for _, seed := range seeds(t, 4_000_001, 200) {
		rng := rand.New(rand.NewSource(seed))
		n := 4 + rng.Intn(30)
		var states []*State
		for _, name := range []string{"lru", "prefix"} {
			s, err := NewState(n, name, newFakeClock().now)
			require.NoError(t, err)
			states = append(states, s)
		}
		next := 0
		for req := range 50 {
			var chain []messages.Key
			for range 1 + rng.Intn(n) {
				next++
				chain = append(chain, messages.Key{Namespace: "ns", Hash: fmt.Sprintf("f%d", next)})
			}
			job := engineJob(messages.JobID(req + 1))
			ok := rng.Intn(8) != 0
			touched := chain[:rng.Intn(len(chain)+1)]
			var outcomes []string
			for _, s := range states {
				res, err := s.Reserve(job, chain)
				if err == nil {
					src := ProvSource{Ctx: &messages.ReqContext{}, Place: messages.Place(chain, res.ToStore, nil)}
					require.NoError(t, s.CommitProv(job, res.ToStore, ok, make([]uint32, len(res.ToStore)), src))
				}
				s.Touch(touched)
				outcomes = append(outcomes, fmt.Sprintf("%v %d %d %+v", err, len(res.ToStore), len(res.Evicted), s.Occupancy()))
				require.NoError(t, s.CheckInvariants())
			}
			require.Equal(t, outcomes[0], outcomes[1], "seed %d request %d", seed, req)
		}
		assert.Equal(t, states[0].Counters, states[1].Counters, "seed %d", seed)
	}
}

package cpu

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

func all(int) bool { return true }

// drain evicts every slot the predicate allows, in policy order.
func drain(p Policy, evictable func(int) bool) []int {
	var out []int
	for {
		s, ok := p.Victim(evictable)
		if !ok {
			return out
		}
		out = append(out, s)
	}
}

func TestNewPolicy(t *testing.T) {
	for _, name := range []string{"", "lru"} {
		p, err := NewPolicy(name, 4)
		require.NoError(t, err)
		assert.IsType(t, &lru{}, p)
	}
	p, err := NewPolicy("arc", 4)
	require.NoError(t, err)
	assert.IsType(t, &arc{}, p)
	p, err = NewPolicy("prefix", 4)
	require.NoError(t, err)
	assert.IsType(t, &prefix{}, p)
	for _, name := range Policies {
		assert.NoError(t, ValidPolicy(name), name)
	}
	assert.ErrorIs(t, ValidPolicy("fifo"), messages.ErrBadConfig)
	_, err = NewPolicy("LRU", 4)
	assert.ErrorIs(t, err, messages.ErrBadConfig)
}

func TestLRUVictimOrder(t *testing.T) {
	p := newLRU(6)
	for _, s := range []int{3, 0, 5, 1, 4} {
		p.Insert(s, tk(s))
	}
	p.Access(3)        // 0 5 1 4 3
	p.Access(1)        // 0 5 4 3 1
	p.Access(2)        // not in the policy: ignored
	p.Remove(5)        // 0 4 3 1
	p.Remove(5)        // twice: ignored
	p.Insert(2, tk(2)) // 0 4 3 1 2
	assert.Equal(t, []int{0, 4, 3, 1, 2}, drain(p, all))
	_, ok := p.Victim(all)
	assert.False(t, ok, "empty")

	// A slot reused after eviction starts at the hot end.
	p.Insert(0, tk(10))
	p.Insert(1, tk(11))
	p.Access(0)
	assert.Equal(t, []int{1, 0}, drain(p, all))
}

func TestVictimSkipsUnevictable(t *testing.T) {
	for _, name := range []string{"lru", "arc", "prefix"} {
		t.Run(name, func(t *testing.T) {
			p, err := NewPolicy(name, 5)
			require.NoError(t, err)
			for s := range 5 {
				p.Insert(s, tk(s))
			}
			pinned := map[int]bool{0: true, 2: true}
			notPinned := func(s int) bool { return !pinned[s] }
			assert.Equal(t, []int{1, 3, 4}, drain(p, notPinned))
			_, ok := p.Victim(notPinned)
			assert.False(t, ok, "only pinned slots left")
			// The skipped slots stay, in their order, for when they are unpinned.
			assert.Equal(t, []int{0, 2}, drain(p, all))
		})
	}
}

// A scan of one-time keys must not flush a key that is used again and
// again; LRU does flush it.
func TestARCScanResistance(t *testing.T) {
	const n = 4
	hot := tk(100)
	run := func(policy string) (hotSurvived bool) {
		s, err := NewState(n, policy, newFakeClock().now)
		require.NoError(t, err)
		store(t, s, j1, hot)
		s.Touch([]messages.Key{hot}) // used twice
		for i := range 3 * n {       // a scan: each key used once
			res, err := s.Reserve(j1, ks(i))
			require.NoError(t, err)
			require.NoError(t, s.Commit(j1, res.ToStore, true, make([]uint32, len(res.ToStore))))
			checkInv(t, s)
		}
		return s.Status([]messages.Key{hot})[0] == messages.Hit
	}
	assert.False(t, run("lru"), "LRU evicts the hot key during the scan")
	assert.True(t, run("arc"), "ARC keeps the hot key in T2 while the scan cycles through T1")
}

func TestARCGhostHitsGoToT2(t *testing.T) {
	a := newARC(2)
	a.Insert(0, tk(0))
	a.Insert(1, tk(1))
	assert.True(t, a.t1.in[0] && a.t1.in[1])

	// Evicted from T1: remembered in B1.
	v, ok := a.Victim(all)
	require.True(t, ok)
	assert.Equal(t, 0, v)
	assert.Equal(t, 1, a.b1.len())

	// The key comes back (into another slot): a B1 ghost hit, straight to T2,
	// and T1's target grows.
	a.Insert(0, tk(0))
	assert.True(t, a.t2.in[0], "ghost hit lands in T2")
	assert.False(t, a.t1.in[0])
	assert.Equal(t, 0, a.b1.len(), "the ghost is consumed")
	assert.Equal(t, 1, a.p)

	// Evicted from T2: remembered in B2; its return shrinks T1's target.
	a.Access(1) // 1 moves to T2 as well
	assert.True(t, a.t2.in[1])
	v, ok = a.Victim(func(s int) bool { return s == 1 })
	require.True(t, ok)
	assert.Equal(t, 1, v)
	assert.Equal(t, 1, a.b2.len())
	a.Insert(1, tk(1))
	assert.True(t, a.t2.in[1])
	assert.Equal(t, 0, a.p)
	assert.Equal(t, 0, a.b2.len())

	// Remove (reset, failed verification) leaves no ghost.
	a.Remove(0)
	a.Remove(0)
	assert.False(t, a.t1.in[0] || a.t2.in[0])
	assert.Equal(t, 0, a.b1.len()+a.b2.len())
}

func TestARCGhostsAreBounded(t *testing.T) {
	const n = 3
	a := newARC(n)
	for i := range 10 * n {
		a.Insert(i%n, tk(i))
		_, ok := a.Victim(all)
		require.True(t, ok)
	}
	assert.LessOrEqual(t, a.b1.len(), n)
	assert.LessOrEqual(t, a.b2.len(), n)
	// The oldest ghosts are forgotten: the newest evicted key is still remembered.
	a.Insert(0, tk(10*n-1))
	assert.True(t, a.t2.in[0])
}

// The policy holds exactly the ready slots (an invariant CheckInvariants
// does not scan), for both policies, through churn with failed commits,
// touches, pins, drops and clears.
func TestPolicyHoldsExactlyReadySlots(t *testing.T) {
	inPolicy := func(p Policy, idx int) (in bool, twice bool) {
		switch p := p.(type) {
		case *lru:
			return p.l.in[idx], false
		case *arc:
			return p.t1.in[idx] || p.t2.in[idx], p.t1.in[idx] && p.t2.in[idx]
		case *prefix:
			return p.all.in[idx], false
		}
		t.Fatalf("unknown policy %T", p)
		return false, false
	}
	for _, name := range []string{"lru", "arc", "prefix"} {
		t.Run(name, func(t *testing.T) {
			s, err := NewState(4, name, newFakeClock().now)
			require.NoError(t, err)
			for i := range 60 {
				res, err := s.Reserve(j1, ks(i%9, (i*7)%9))
				if err != nil {
					require.ErrorIs(t, err, messages.ErrFull)
				} else {
					require.NoError(t, s.Commit(j1, res.ToStore, i%5 != 0, make([]uint32, len(res.ToStore))))
				}
				s.Touch(ks(i % 9))
				switch i % 11 {
				case 3:
					if _, err := s.LeaseToPin(hA, j2, ks(i%9)); err == nil && i%2 == 0 {
						require.NoError(t, s.Unpin(j2, ks(i%9)))
					}
				case 5:
					s.Drop(tk((i + 1) % 9))
				case 7:
					s.ReleaseJob(j2)
				case 10:
					s.Clear()
				}
				checkInv(t, s)
				for idx := range s.slots {
					in, twice := inPolicy(s.policy, idx)
					require.Equal(t, s.slots[idx].state == slotReady, in, "step %d slot %d", i, idx)
					require.False(t, twice, "step %d slot %d in T1 and T2", i, idx)
				}
			}
		})
	}
}

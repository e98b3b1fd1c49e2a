package cpu

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

// Unit tests of State's edge cases, one behaviour each, on a fake clock.

var (
	hA, hB = engineHolder("A"), engineHolder("B")
	j1, j2 = engineJob(1), engineJob(2)
)

func newTestState(t *testing.T, n int) (*State, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	s, err := NewState(n, "lru", clk.now)
	require.NoError(t, err)
	return s, clk
}

// storedState is a state of n slots holding keys, stored through j1.
func storedState(t *testing.T, n int, keys ...messages.Key) *State {
	t.Helper()
	s, _ := newTestState(t, n)
	store(t, s, j1, keys...)
	return s
}

// store makes keys ready through job (Reserve + Commit ok), failing on any
// eviction so a test knows exactly what is resident.
func store(t *testing.T, s *State, job messages.JobRef, keys ...messages.Key) {
	t.Helper()
	res, err := s.Reserve(job, keys)
	require.NoError(t, err)
	require.Empty(t, res.Evicted, "store() is for a pool with room")
	require.NoError(t, s.Commit(job, res.ToStore, true, make([]uint32, len(res.ToStore))))
	checkInv(t, s)
}

// mustReserve makes keys pending for job (a Reserve that must succeed).
func mustReserve(t *testing.T, s *State, job messages.JobRef, keys []messages.Key) {
	t.Helper()
	_, err := s.Reserve(job, keys)
	require.NoError(t, err)
}

// mustPin pins keys for job, with h's leases (a LeaseToPin that must succeed).
func mustPin(t *testing.T, s *State, h messages.Holder, job messages.JobRef, keys []messages.Key) {
	t.Helper()
	_, err := s.LeaseToPin(h, job, keys)
	require.NoError(t, err)
}

func checkInv(t *testing.T, s *State) {
	t.Helper()
	require.NoError(t, s.CheckInvariants())
}

func ks(is ...int) []messages.Key {
	out := make([]messages.Key, len(is))
	for i, x := range is {
		out[i] = tk(x)
	}
	return out
}

func statuses(s *State, is ...int) []messages.LookupStatus { return s.Status(ks(is...)) }

var (
	miss, hit, pending = messages.Miss, messages.Hit, messages.HitPending
)

func TestNewStateBadConfig(t *testing.T) {
	for _, tc := range []struct {
		n      int
		policy string
	}{{0, "lru"}, {-1, "lru"}, {4, "fifo"}} {
		_, err := NewState(tc.n, tc.policy, time.Now)
		assert.ErrorIs(t, err, messages.ErrBadConfig, "%d slots, policy %q", tc.n, tc.policy)
	}
	for _, p := range []string{"", "lru", "arc", "prefix"} {
		_, err := NewState(4, p, time.Now)
		assert.NoError(t, err, p)
	}
}

func TestReserveSkipsRepeatsAndPresentKeys(t *testing.T) {
	s := storedState(t, 8, tk(0)) // ready
	mustReserve(t, s, j2, ks(1))  // pending for another job
	res, err := s.Reserve(j1, ks(2, 0, 2, 1, 3, 3))
	require.NoError(t, err)
	assert.Equal(t, ks(2, 3), res.ToStore)
	require.Len(t, res.Slots, 2)
	assert.NotEqual(t, res.Slots[0], res.Slots[1])
	assert.Empty(t, res.Evicted)
	assert.ElementsMatch(t, ks(2, 3), s.Pending(j1))
	assert.ElementsMatch(t, ks(1), s.Pending(j2))
	checkInv(t, s)

	res, err = s.Reserve(j1, ks(0, 1))
	require.NoError(t, err, "nothing to store is not an error")
	assert.Empty(t, res.ToStore)
	assert.Empty(t, res.Slots)
}

// A key of the call that is already present is "not to store", so it must
// survive the call even when it is the LRU victim (vLLM's prepare_store
// protects the keys of the call the same way).
func TestReserveNeverEvictsKeysOfTheCall(t *testing.T) {
	s := storedState(t, 2, tk(0))
	store(t, s, j1, tk(1)) // LRU order: 0 (oldest), 1
	res, err := s.Reserve(j2, ks(0, 2))
	require.NoError(t, err)
	assert.Equal(t, ks(2), res.ToStore)
	assert.Equal(t, ks(1), res.Evicted, "the oldest key not named in the call goes")
	assert.Equal(t, []messages.LookupStatus{hit, miss, pending}, statuses(s, 0, 1, 2))

	// When only keys of the call could make room, the call is Full.
	s, _ = newTestState(t, 1)
	store(t, s, j1, tk(0))
	_, err = s.Reserve(j2, ks(0, 1))
	assert.ErrorIs(t, err, messages.ErrFull)
	assert.Equal(t, []messages.LookupStatus{hit, miss}, statuses(s, 0, 1))
	checkInv(t, s)
}

func TestReserveFullChangesNothing(t *testing.T) {
	s := storedState(t, 4, ks(0, 1, 2, 3)...)
	s.LookupAndLease(hA, ks(0), false, time.Minute) // leased
	mustPin(t, s, hB, engineJob(9), ks(1))          // pinned
	mustReserve(t, s, j2, ks(10))                   // pending would need room: fill it; evicts 2 (LRU among 2, 3)
	before, counters := s.Occupancy(), s.Counters
	res, err := s.Reserve(j2, ks(20, 21)) // 1 evictable (3), 2 needed
	require.ErrorIs(t, err, messages.ErrFull)
	assert.Equal(t, ReserveResult{}, res)
	assert.Equal(t, before, s.Occupancy())
	assert.Equal(t, []messages.LookupStatus{hit, hit, miss, hit, pending, miss, miss}, statuses(s, 0, 1, 2, 3, 10, 20, 21))
	counters.Full++
	assert.Equal(t, counters, s.Counters, "only Full counts")
	checkInv(t, s)

	// The failed call did not disturb the eviction order either.
	res, err = s.Reserve(j2, ks(20))
	require.NoError(t, err)
	assert.Equal(t, ks(3), res.Evicted)
}

func TestReserveEvictsInLRUOrder(t *testing.T) {
	s := storedState(t, 4, ks(0, 1, 2, 3)...) // recency: 0 < 1 < 2 < 3
	s.Touch(ks(0))                            // 1 < 2 < 3 < 0
	_, err := s.LeaseToPin(hA, j2, ks(1))
	require.NoError(t, err) // 1 pinned, and most recent
	s.LookupAndLease(hA, ks(2), false, time.Minute)
	// Lookup does not bump recency, but the lease protects 2: the order of
	// candidates is 3, 0.
	res, err := s.Reserve(j1, ks(4, 5))
	require.NoError(t, err)
	assert.Equal(t, ks(3, 0), res.Evicted)
	assert.Equal(t, uint64(2), s.Counters.Evictions)
}

func TestCommit(t *testing.T) {
	tests := []struct {
		name    string
		job     messages.JobRef
		keys    []messages.Key
		ok      bool
		sums    int
		wantErr error // nil, or a sentinel; errAny for a plain error
	}{
		{"all of them", j1, ks(0, 1), true, 2, nil},
		{"a subset, failed", j1, ks(1), false, 0, nil},
		{"nothing", j1, nil, true, 0, nil},
		{"the wrong job", j2, ks(0), true, 1, messages.ErrNotPending},
		{"a key named twice", j1, ks(0, 1, 0), true, 3, messages.ErrNotPending},
		{"one key not pending", j1, ks(0, 5), true, 2, messages.ErrNotPending},
		{"a ready key", j1, ks(0, 9), false, 0, messages.ErrNotPending},
		{"checksum count", j1, ks(0, 1), true, 1, errAny},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := storedState(t, 8, tk(9))
			mustReserve(t, s, j1, ks(0, 1))
			before, counters := s.Occupancy(), s.Counters
			err := s.Commit(tc.job, tc.keys, tc.ok, make([]uint32, tc.sums))
			switch tc.wantErr {
			case nil:
				require.NoError(t, err)
			case errAny:
				require.Error(t, err)
			default:
				require.ErrorIs(t, err, tc.wantErr)
			}
			checkInv(t, s)
			if tc.wantErr != nil {
				// All-or-nothing: the job can still commit both.
				assert.Equal(t, before, s.Occupancy())
				assert.Equal(t, counters, s.Counters)
				require.NoError(t, s.Commit(j1, ks(0, 1), true, []uint32{1, 2}))
				checkInv(t, s)
			}
		})
	}
}

var errAny = &struct{ error }{}

func TestCommitTwiceAndChecksums(t *testing.T) {
	s, _ := newTestState(t, 4)
	res, err := s.Reserve(j1, ks(0, 1))
	require.NoError(t, err)
	require.NoError(t, s.Commit(j1, ks(1, 0), true, []uint32{0xb, 0xa}))
	assert.ErrorIs(t, s.Commit(j1, ks(0), true, []uint32{0xa}), messages.ErrNotPending)
	assert.ErrorIs(t, s.Commit(j1, ks(0), false, nil), messages.ErrNotPending)
	for i, want := range []uint32{0xa, 0xb} {
		slot, sum, err := s.Checksum(tk(i))
		require.NoError(t, err)
		assert.Equal(t, res.Slots[i], slot)
		assert.Equal(t, want, sum)
	}
	_, _, err = s.Checksum(tk(2))
	assert.ErrorIs(t, err, messages.ErrUnknownKey)
	assert.Empty(t, s.Pending(j1))
	assert.Equal(t, uint64(2), s.Counters.Stores)

	// Not ok frees the slots: the keys are gone, not pending, not counted stored.
	mustReserve(t, s, j2, ks(2))
	_, _, err = s.Checksum(tk(2))
	assert.ErrorIs(t, err, messages.ErrUnknownKey, "a pending key has no checksum")
	require.NoError(t, s.Commit(j2, ks(2), false, nil))
	assert.Equal(t, []messages.LookupStatus{miss}, statuses(s, 2))
	assert.Equal(t, 2, s.Occupancy().Free)
	assert.Equal(t, uint64(1), s.Counters.StoresFailed)
	checkInv(t, s)
}

func TestUnpin(t *testing.T) {
	s := storedState(t, 4, ks(0, 1)...)
	mustPin(t, s, hA, j2, ks(0, 0, 1))
	assert.Equal(t, 2, s.Occupancy().Pinned)

	for _, bad := range [][]messages.Key{
		ks(0, 0, 0), // more than pinned
		ks(1, 1),    // more than pinned
		ks(0, 2),    // 2 is unknown
		ks(0, 3),    // 3 was never stored
	} {
		assert.ErrorIs(t, s.Unpin(j2, bad), messages.ErrNotLoading, "%v", bad)
		assert.Equal(t, 2, s.Occupancy().Pinned, "all-or-nothing: %v", bad)
	}
	assert.ErrorIs(t, s.Unpin(j1, ks(0)), messages.ErrNotLoading, "another job's pin")
	checkInv(t, s)

	require.NoError(t, s.Unpin(j2, ks(0, 1)))
	assert.Equal(t, 1, s.Occupancy().Pinned, "0 was pinned twice")
	require.NoError(t, s.Unpin(j2, ks(0)))
	assert.Equal(t, 0, s.Occupancy().Pinned)
	assert.ErrorIs(t, s.Unpin(j2, ks(0)), messages.ErrNotLoading)
	checkInv(t, s)
}

func TestLeaseToPinAllOrNothing(t *testing.T) {
	s := storedState(t, 4, ks(0, 1)...)
	mustReserve(t, s, j1, ks(2))
	assert.Equal(t, []messages.LookupStatus{hit, hit}, s.LookupAndLease(hA, ks(0, 1), false, time.Minute))

	for _, bad := range [][]messages.Key{ks(0, 3), ks(0, 1, 2)} { // unknown; pending
		slots, err := s.LeaseToPin(hA, j2, bad)
		assert.ErrorIs(t, err, messages.ErrUnknownKey)
		assert.Nil(t, slots)
		o := s.Occupancy()
		assert.Equal(t, 0, o.Pinned, "nothing pinned")
		assert.Equal(t, 2, o.Leases, "no lease consumed")
		checkInv(t, s)
	}

	slots, err := s.LeaseToPin(hA, j2, ks(1, 0))
	require.NoError(t, err)
	require.Len(t, slots, 2)
	s0, _, _ := s.Checksum(tk(0))
	s1, _, _ := s.Checksum(tk(1))
	assert.Equal(t, []int{s1, s0}, slots, "slots in the order of the keys")
	o := s.Occupancy()
	assert.Equal(t, 2, o.Pinned)
	assert.Equal(t, 0, o.Leases, "the leases became pins")
	checkInv(t, s)

	// Without a lease (another holder) a ready key still pins.
	mustPin(t, s, hB, j1, ks(0))
	checkInv(t, s)
}

func TestLookupPrefix(t *testing.T) {
	for _, prefix := range []bool{true, false} {
		s := storedState(t, 8, ks(0, 2, 4)...)
		mustReserve(t, s, j1, ks(3))
		s.Counters = Counters{}

		got := s.LookupAndLease(hA, ks(0, 1, 2), prefix, time.Minute)
		if prefix {
			assert.Equal(t, []messages.LookupStatus{hit, miss, miss}, got)
			assert.Equal(t, 1, s.Occupancy().Leases, "2 after the miss is not leased")
			assert.Equal(t, Counters{Lookups: 2, Hits: 1, Misses: 1}, s.Counters, "2 is not counted")
		} else {
			assert.Equal(t, []messages.LookupStatus{hit, miss, hit}, got)
			assert.Equal(t, 2, s.Occupancy().Leases)
			assert.Equal(t, Counters{Lookups: 3, Hits: 2, Misses: 1}, s.Counters)
		}
		s.Counters = Counters{}
		got = s.LookupAndLease(hB, ks(0, 3, 4), prefix, time.Minute)
		if prefix {
			assert.Equal(t, []messages.LookupStatus{hit, pending, miss}, got, "stops at HIT_PENDING too")
			assert.Equal(t, Counters{Lookups: 2, Hits: 1, HitsPending: 1}, s.Counters)
		} else {
			assert.Equal(t, []messages.LookupStatus{hit, pending, hit}, got)
			assert.Equal(t, Counters{Lookups: 3, Hits: 2, HitsPending: 1}, s.Counters)
		}
		checkInv(t, s)
	}
}

func TestLeaseRefreshAndExpiry(t *testing.T) {
	s, clk := newTestState(t, 4)
	store(t, s, j1, ks(0, 1)...)
	t0 := clk.now()
	s.LookupAndLease(hA, ks(0), false, 10*time.Second)
	clk.advance(5 * time.Second)
	s.LookupAndLease(hA, ks(0), false, 10*time.Second) // extends to t0+15s
	assert.Equal(t, 1, s.Occupancy().Leases, "one lease per holder and key")
	at, ok := s.NextLeaseExpiry()
	require.True(t, ok)
	assert.Equal(t, t0.Add(15*time.Second), at)

	s.LookupAndLease(hA, ks(0), false, time.Second) // a shorter ttl never shortens it
	at, _ = s.NextLeaseExpiry()
	assert.Equal(t, t0.Add(15*time.Second), at)

	clk.set(t0.Add(15*time.Second - time.Nanosecond))
	assert.Equal(t, 1, s.Occupancy().Leases, "live until its deadline")
	assert.Equal(t, uint64(0), s.Counters.LeasesExpired)
	clk.set(t0.Add(15 * time.Second))
	assert.Equal(t, 0, s.Occupancy().Leases, "expired exactly at its deadline")
	assert.Equal(t, uint64(1), s.Counters.LeasesExpired)
	_, ok = s.NextLeaseExpiry()
	assert.False(t, ok)

	// An expired lease no longer protects: a store evicts the key.
	s.LookupAndLease(hB, ks(0, 1), false, time.Second)
	store(t, s, j1, ks(2, 3)...)
	clk.advance(time.Second)
	res, err := s.Reserve(j1, ks(4, 5))
	require.NoError(t, err)
	assert.Equal(t, ks(0, 1), res.Evicted)
	assert.Equal(t, uint64(3), s.Counters.LeasesExpired)
	checkInv(t, s)
}

func TestLeaseProtectsUntilExpiry(t *testing.T) {
	s, clk := newTestState(t, 1)
	store(t, s, j1, tk(0))
	s.LookupAndLease(hA, ks(0), false, 2*time.Second)
	clk.advance(2*time.Second - 1)
	_, err := s.Reserve(j2, ks(1))
	assert.ErrorIs(t, err, messages.ErrFull)
	clk.advance(1)
	res, err := s.Reserve(j2, ks(1))
	require.NoError(t, err)
	assert.Equal(t, ks(0), res.Evicted)
	checkInv(t, s)
}

func TestLeasesOfTwoHolders(t *testing.T) {
	s := storedState(t, 2, ks(0, 1)...)
	s.LookupAndLease(hA, ks(0), false, time.Minute)
	s.LookupAndLease(hB, ks(0), false, time.Minute)
	o := s.Occupancy()
	assert.Equal(t, 1, o.Leased)
	assert.Equal(t, 2, o.Leases)
	mustPin(t, s, hA, j1, ks(0))
	require.NoError(t, s.Unpin(j1, ks(0)))
	_, err := s.Reserve(j2, ks(2, 3))
	assert.ErrorIs(t, err, messages.ErrFull, "B's lease still protects 0")
	s.ReleaseHolder(hB)
	res, err := s.Reserve(j2, ks(2, 3))
	require.NoError(t, err)
	assert.ElementsMatch(t, ks(0, 1), res.Evicted)
	checkInv(t, s)
}

func TestReleaseOriginOnlyTouchesThatOrigin(t *testing.T) {
	s := storedState(t, 8, ks(0, 1, 2)...)
	peerH := messages.Holder{Origin: messages.OriginPeer, ID: "A"} // same id as hA
	tierJ := messages.JobRef{Origin: messages.OriginTier, ID: 1}   // same id as j1
	peerJ := messages.JobRef{Origin: messages.OriginPeer, ID: 1}
	s.LookupAndLease(hA, ks(0), false, time.Minute)
	s.LookupAndLease(peerH, ks(0, 1), false, time.Minute)
	mustPin(t, s, hA, j1, ks(2))
	mustPin(t, s, peerH, peerJ, ks(2))
	mustReserve(t, s, tierJ, ks(5))
	mustReserve(t, s, peerJ, ks(6))
	mustReserve(t, s, j2, ks(7))

	s.ReleaseOrigin(messages.OriginPeer)
	checkInv(t, s)
	o := s.Occupancy()
	assert.Equal(t, 1, o.Leases, "hA's lease stays")
	assert.Equal(t, 1, o.Pinned, "j1's pin stays")
	assert.Equal(t, []messages.LookupStatus{pending, miss, pending}, statuses(s, 5, 6, 7))
	require.NoError(t, s.Unpin(j1, ks(2)), "j1 still holds its pin")
	assert.ErrorIs(t, s.Unpin(peerJ, ks(2)), messages.ErrNotLoading)

	s.ReleaseOrigin(messages.OriginTier)
	assert.Equal(t, []messages.LookupStatus{miss, pending}, statuses(s, 5, 7))
	s.ReleaseOrigin(messages.OriginEngine)
	o = s.Occupancy()
	assert.Equal(t, 0, o.Leases)
	assert.Equal(t, 0, o.WritePending)
	assert.Equal(t, uint64(3), s.Counters.StoresFailed)
	checkInv(t, s)
}

func TestReleaseJob(t *testing.T) {
	s := storedState(t, 8, ks(0, 1)...)
	mustPin(t, s, hA, j2, ks(0, 0, 1))
	mustReserve(t, s, j2, ks(3, 4))
	aborted := s.ReleaseJob(j2)
	assert.ElementsMatch(t, ks(3, 4), aborted)
	o := s.Occupancy()
	assert.Equal(t, 0, o.Pinned)
	assert.Equal(t, 0, o.WritePending)
	assert.Equal(t, 2, o.Ready)
	assert.Nil(t, s.ReleaseJob(j2), "twice is harmless")
	assert.ErrorIs(t, s.Commit(j2, ks(3), true, []uint32{0}), messages.ErrNotPending)
	checkInv(t, s)
}

func TestClearUnindexesPinnedAndKeepsPending(t *testing.T) {
	s := storedState(t, 8, ks(0, 1, 2, 3)...)
	s.LookupAndLease(hA, ks(0, 1), false, time.Minute)
	mustPin(t, s, hA, j2, ks(1))
	mustReserve(t, s, j1, ks(5))

	removed := s.Clear()
	assert.ElementsMatch(t, ks(0, 1, 2, 3), removed, "leased 0 goes too; pinned 1 is announced removed")
	assert.Equal(t, []messages.LookupStatus{miss, miss, miss, miss, pending}, statuses(s, 0, 1, 2, 3, 5),
		"a block pinned during the clear is never served again")
	o := s.Occupancy()
	assert.Equal(t, Occupancy{Slots: 8, Free: 6, WritePending: 1, Ready: 1, Pinned: 1}, o, "its slot stays under its reader")
	assert.Equal(t, uint64(0), s.Counters.Evictions, "a clear is not an eviction")
	checkInv(t, s)
	// A new store of the same key takes another slot; the reader still
	// unpins the cleared copy by its key.
	mustReserve(t, s, j1, ks(1))
	require.NoError(t, s.Unpin(j2, ks(1)))
	assert.Equal(t, 6, s.Occupancy().Free, "the cleared copy's slot is free at its last unpin")
	require.NoError(t, s.Commit(j1, ks(5, 1), true, []uint32{0, 0}))
	assert.ElementsMatch(t, ks(1, 5), s.Clear())
	assert.Equal(t, 8, s.Occupancy().Free)
	checkInv(t, s)
}

func TestDrop(t *testing.T) {
	s := storedState(t, 4, ks(0, 1)...)
	mustReserve(t, s, j1, ks(2))
	mustPin(t, s, hA, j2, ks(1))
	s.LookupAndLease(hB, ks(0), false, time.Minute)

	assert.False(t, s.Drop(tk(1)), "pinned")
	assert.False(t, s.Drop(tk(2)), "pending")
	assert.False(t, s.Drop(tk(3)), "absent")
	assert.True(t, s.Drop(tk(0)), "leased is dropped with its lease")
	assert.False(t, s.Drop(tk(0)))
	o := s.Occupancy()
	assert.Equal(t, 0, o.Leases)
	assert.Equal(t, 2, o.Free)
	_, err := s.LeaseToPin(hB, j2, ks(0))
	assert.ErrorIs(t, err, messages.ErrUnknownKey)
	checkInv(t, s)
}

func TestTouchIgnoresUnknownAndPending(t *testing.T) {
	s := storedState(t, 3, ks(0, 1)...)
	mustReserve(t, s, j1, ks(2))
	s.Touch(ks(2, 9, 0)) // 0 becomes most recent; 2 and 9 are ignored
	require.NoError(t, s.Commit(j1, ks(2), true, []uint32{0}))
	res, err := s.Reserve(j2, ks(3))
	require.NoError(t, err)
	assert.Equal(t, ks(1), res.Evicted)
	checkInv(t, s)
}

func TestCountersExact(t *testing.T) {
	s, clk := newTestState(t, 2)
	store(t, s, j1, ks(0, 1)...)                          // Stores 2
	s.LookupAndLease(hA, ks(0, 1, 2), false, time.Second) // Lookups 3, Hits 2, Misses 1
	_, err := s.Reserve(j1, ks(2))                        // Full 1
	require.ErrorIs(t, err, messages.ErrFull)
	clk.advance(time.Second)         // both leases due
	res, err := s.Reserve(j1, ks(2)) // LeasesExpired 2, Evictions 1
	require.NoError(t, err)
	require.Len(t, res.Evicted, 1)
	s.LookupAndLease(hA, ks(2), true, time.Second)      // Lookups 4, HitsPending 1
	require.NoError(t, s.Commit(j1, ks(2), false, nil)) // StoresFailed 1
	assert.Equal(t, Counters{
		Lookups: 4, Hits: 2, HitsPending: 1, Misses: 1,
		Stores: 2, StoresFailed: 1, Evictions: 1, Full: 1, LeasesExpired: 2,
	}, s.Counters)
}

func TestNextLeaseExpirySkipsStale(t *testing.T) {
	s, clk := newTestState(t, 4)
	store(t, s, j1, ks(0, 1, 2)...)
	t0 := clk.now()
	_, ok := s.NextLeaseExpiry()
	assert.False(t, ok)

	s.LookupAndLease(hA, ks(0), false, 5*time.Second)
	s.LookupAndLease(hB, ks(1), false, 10*time.Second)
	at, ok := s.NextLeaseExpiry()
	require.True(t, ok)
	assert.Equal(t, t0.Add(5*time.Second), at)

	mustPin(t, s, hA, j1, ks(0)) // consumed: its entry is stale
	at, _ = s.NextLeaseExpiry()
	assert.Equal(t, t0.Add(10*time.Second), at)

	clk.advance(3 * time.Second)
	s.LookupAndLease(hB, ks(1), false, 20*time.Second) // extended: the old entry is stale
	at, _ = s.NextLeaseExpiry()
	assert.Equal(t, t0.Add(23*time.Second), at)

	s.LookupAndLease(hA, ks(2), false, 30*time.Second)
	s.ReleaseHolder(hB) // released: stale
	at, _ = s.NextLeaseExpiry()
	assert.Equal(t, t0.Add(33*time.Second), at)

	s.ReleaseHolder(hA)
	_, ok = s.NextLeaseExpiry()
	assert.False(t, ok)
	assert.Equal(t, uint64(0), s.Counters.LeasesExpired, "released, not expired")
	checkInv(t, s)
}

// NextLeaseExpiry reports the earliest deadline even when it has passed and
// no call has expired it yet (the actor schedules its timer from it).
func TestNextLeaseExpiryDoesNotExpire(t *testing.T) {
	s, clk := newTestState(t, 2)
	store(t, s, j1, tk(0))
	s.LookupAndLease(hA, ks(0), false, time.Second)
	clk.advance(time.Hour)
	at, ok := s.NextLeaseExpiry()
	require.True(t, ok)
	assert.Equal(t, clk.now().Add(-time.Hour+time.Second), at)
	s.ExpireLeases()
	_, ok = s.NextLeaseExpiry()
	assert.False(t, ok)
	assert.Equal(t, uint64(1), s.Counters.LeasesExpired)
}

// A commit that names its keys' slots commits what one that does not would:
// a slot holding its key stands for the index's answer, and a wrong slot
// (another key's, out of range) is looked up as if unnamed. A slot that
// is not the job's is still refused.
func TestCommitAtNamedSlotsCommitsAsByKey(t *testing.T) {
	s, _ := newTestState(t, 8)
	res, err := s.Reserve(j1, ks(1, 2, 3))
	require.NoError(t, err)
	slots := res.Slots
	wrong := []int{slots[1], -1, 99} // another key's, below range, above range
	require.NoError(t, s.CommitAt(j1, ks(1), wrong[:1], true, []uint32{7}, ProvSource{}))
	require.NoError(t, s.CommitAt(j1, ks(2, 3), []int{slots[1], 99}, true, []uint32{8, 9}, ProvSource{}))
	checkInv(t, s)
	assert.Equal(t, []messages.LookupStatus{hit, hit, hit}, statuses(s, 1, 2, 3))
	for i, k := range ks(1, 2, 3) {
		idx, sum, err := s.Checksum(k)
		require.NoError(t, err)
		assert.Equal(t, slots[i], idx)
		assert.Equal(t, uint32(7+i), sum, "key %d took its own checksum", i+1)
	}

	res, err = s.Reserve(j2, ks(4))
	require.NoError(t, err)
	require.ErrorIs(t, s.CommitAt(j1, ks(4), res.Slots, true, []uint32{1}, ProvSource{}), messages.ErrNotPending,
		"another job's write, named by its slot")
	require.ErrorIs(t, s.CommitAt(j2, ks(1), slots[:1], true, []uint32{1}, ProvSource{}), messages.ErrNotPending,
		"a ready block, named by its slot")
	require.NoError(t, s.CommitAt(j2, ks(4), res.Slots, true, []uint32{1}, ProvSource{}))
	checkInv(t, s)
}

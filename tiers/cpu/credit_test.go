package cpu

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

var credA = messages.JobRef{Origin: messages.OriginCredit, ID: 1}

// A credited slot is out of everyone's reach: not free, not evictable, not
// named by any lookup, and no other store or grant gets it.
func TestGrantReservesSlotsNobodyElseGets(t *testing.T) {
	s, _ := newTestState(t, 4)
	slots, evicted := s.Grant(credA, 2)
	require.Len(t, slots, 2)
	assert.Empty(t, evicted)
	assert.Equal(t, 2, s.Credit(credA))
	o := s.Occupancy()
	assert.Equal(t, 2, o.Free)
	store(t, s, j1, ks(0, 1)...)
	res, err := s.Reserve(j2, ks(2))
	require.NoError(t, err)
	assert.Equal(t, ks(0), res.Evicted, "a full pool evicts a ready block, never the credit")
	assert.NotContains(t, slots, res.Slots[0])
	more, _ := s.Grant(messages.JobRef{Origin: messages.OriginCredit, ID: 2}, 4)
	assert.Len(t, more, 1, "a second grant gets what is evictable (block 1), never the credit")
	assert.NotContains(t, slots, more[0])
	assert.Equal(t, 2, s.Credit(credA))
	checkInv(t, s)
}

// A grant larger than the room grants what there is, evicting in policy
// order (least recently used first).
func TestGrantEvictsInPolicyOrder(t *testing.T) {
	s, _ := newTestState(t, 4)
	store(t, s, j1, ks(0, 1, 2)...)
	s.Touch(ks(0))
	s.LookupAndLease(hA, ks(2), false, time.Minute)
	slots, evicted := s.Grant(credA, 8)
	assert.Len(t, slots, 3, "free 1 + evictable 2 (2 is leased)")
	assert.Equal(t, ks(1, 0), evicted, "least recently used first")
	assert.Equal(t, []messages.LookupStatus{miss, miss, hit}, statuses(s, 0, 1, 2))
	checkInv(t, s)
}

// Bind gives an absent key its credited slot (write-pending for the store
// job, committed as usual); a key the tier holds keeps its slot in the
// credit, and the held block is untouched.
func TestBindBindsAbsentKeysAndLeavesDuplicatesInTheCredit(t *testing.T) {
	s, _ := newTestState(t, 8)
	store(t, s, j1, ks(1)...)
	slots, _ := s.Grant(credA, 3)
	bound, err := s.Bind(credA, j2, ks(0, 1, 2), slots)
	require.NoError(t, err)
	assert.Equal(t, []bool{true, false, true}, bound)
	assert.Equal(t, 1, s.Credit(credA), "the duplicate's slot stays credited")
	assert.Equal(t, []messages.LookupStatus{pending, hit, pending}, statuses(s, 0, 1, 2))
	checkInv(t, s)
	require.NoError(t, s.Commit(j2, ks(0, 2), true, []uint32{7, 8}))
	idx, sum, err := s.Checksum(tk(2))
	require.NoError(t, err)
	assert.Equal(t, slots[2], idx, "the key is in the slot the engine copied into")
	assert.Equal(t, uint32(8), sum)
	checkInv(t, s)
	// The credit can be bound again once the engine's copy is over.
	bound, err = s.Bind(credA, j2, ks(3), slots[1:2])
	require.NoError(t, err)
	assert.Equal(t, []bool{true}, bound)
	assert.Equal(t, 0, s.Credit(credA))
	checkInv(t, s)
}

// A slot that is not the owner's credit (another session's, a bound one, a
// ready one, out of range), or one named twice, refuses the whole bind.
func TestBindRefusesSlotsThatAreNotTheOwnersCredit(t *testing.T) {
	s, _ := newTestState(t, 8)
	mine, _ := s.Grant(credA, 2)
	theirs, _ := s.Grant(messages.JobRef{Origin: messages.OriginCredit, ID: 2}, 1)
	store(t, s, j1, ks(5)...)
	ready, _, _ := s.Checksum(tk(5))
	for name, slots := range map[string][]int{
		"another session's": {mine[0], theirs[0]},
		"a ready block's":   {mine[0], ready},
		"named twice":       {mine[0], mine[0]},
		"out of range":      {mine[0], 99},
		"negative":          {mine[0], -1},
	} {
		_, err := s.Bind(credA, j2, ks(0, 1), slots)
		assert.ErrorIs(t, err, messages.ErrBadRequest, name)
	}
	_, err := s.Bind(credA, j2, ks(0, 1), mine[:1])
	assert.ErrorIs(t, err, messages.ErrBadRequest, "a slot per key")
	assert.Equal(t, 2, s.Credit(credA), "nothing bound")
	assert.Equal(t, []messages.LookupStatus{miss, miss}, statuses(s, 0, 1))
	checkInv(t, s)
}

func TestReleaseCreditFreesIt(t *testing.T) {
	s, _ := newTestState(t, 4)
	slots, _ := s.Grant(credA, 3)
	_, err := s.Bind(credA, j1, ks(0), slots[:1])
	require.NoError(t, err)
	assert.Equal(t, 2, s.ReleaseCredit(credA))
	assert.Equal(t, 3, s.Occupancy().Free, "the bound slot belongs to its store job now")
	assert.Equal(t, 0, s.Credit(credA))
	checkInv(t, s)
}

// recorder is an Observer keeping what it heard.
type recorder struct{ writing, readable, gone []messages.Key }

func (r *recorder) Writing(k messages.Key)  { r.writing = append(r.writing, k) }
func (r *recorder) Readable(k messages.Key) { r.readable = append(r.readable, k) }
func (r *recorder) Gone(k messages.Key)     { r.gone = append(r.gone, k) }

// The observer hears exactly the keys that begin to be written (a
// reservation, a credited slot bound), those that become readable, and
// those that stop being either: a commit, a write that fails or is
// orphaned, an eviction, a drop, a clear (pinned or not); never a credited
// slot's placeholder or a quarantined copy.
func TestObserverHearsWritingReadableAndGone(t *testing.T) {
	s, _ := newTestState(t, 6)
	rec := &recorder{}
	s.SetObserver(rec)
	store(t, s, j1, ks(0, 1, 2)...)
	res, err := s.Reserve(j2, ks(3))
	require.NoError(t, err)
	require.NoError(t, s.Commit(j2, res.ToStore, false, nil))
	assert.Equal(t, ks(0, 1, 2, 3), rec.writing, "every write begun")
	assert.Equal(t, ks(0, 1, 2), rec.readable, "a failed write is never readable")
	assert.Equal(t, ks(3), rec.gone, "a failed write is gone")

	rec.gone = nil
	slots, evicted := s.Grant(credA, 4)
	require.Len(t, slots, 4)
	assert.Equal(t, evicted, rec.gone, "the grant's eviction; its placeholders are not heard")
	assert.Len(t, rec.writing, 4, "nor written")
	_, err = s.Bind(credA, engineJob(3), ks(4), slots[:1])
	require.NoError(t, err)
	assert.Equal(t, tk(4), rec.writing[4], "a bound credited slot is written")
	s.OrphanJob(engineJob(3))
	assert.Equal(t, tk(4), rec.gone[len(rec.gone)-1], "an orphaned write is gone")

	rec.gone = nil
	kept := []messages.Key{}
	for _, k := range ks(0, 1, 2) {
		if _, held := s.index[k]; held {
			kept = append(kept, k)
		}
	}
	require.NotEmpty(t, kept)
	s.LookupAndLease(hA, kept[:1], false, time.Minute)
	_, err = s.LeaseToPin(hA, j1, kept[:1])
	require.NoError(t, err)
	s.Clear()
	assert.ElementsMatch(t, kept, rec.gone, "cleared while pinned, or not")
	require.NoError(t, s.Unpin(j1, kept[:1]))
	assert.Len(t, rec.gone, len(kept), "the quarantined copy's free is not a second Gone")
	assert.Len(t, rec.readable, 3)
	checkInv(t, s)
}

// An engine's pin keeps the block's rank (vLLM re-ranks it when the request
// finishes); a peer's or a cascade's pin makes it most recent.
func TestLeaseToPinKeepRank(t *testing.T) {
	s, _ := newTestState(t, 3)
	store(t, s, j1, ks(0, 1, 2)...)
	s.LookupAndLease(hA, ks(0), false, time.Minute)
	_, err := s.LeaseToPinKeepRank(hA, j2, ks(0))
	require.NoError(t, err)
	require.NoError(t, s.Unpin(j2, ks(0)))
	slots, evicted := s.Grant(credA, 1)
	require.Len(t, slots, 1)
	assert.Equal(t, ks(0), evicted, "still the least recently used")
	s.LookupAndLease(hA, ks(1), false, time.Minute)
	_, err = s.LeaseToPin(hA, j2, ks(1))
	require.NoError(t, err)
	require.NoError(t, s.Unpin(j2, ks(1)))
	_, evicted = s.Grant(credA, 1)
	assert.Equal(t, ks(2), evicted, "a ranking pin made 1 most recent")
	checkInv(t, s)
}

// Every session's credit together stays within CreditLimit, however many
// sessions ask: credit comes out of the cache they share, and the bound
// tightens with every session that holds credit. A released credit makes
// room for another, and its session no longer counts.
func TestCreditOfAllSessionsIsBounded(t *testing.T) {
	const slots = 65536
	require.Equal(t, 4096, CreditLimit(slots, 1), "a sixteenth of the pool for one engine")
	require.Equal(t, 1024, CreditLimit(slots, 2), "a sixty-fourth for two")
	require.Equal(t, 256, CreditLimit(slots, 4), "a 256th for four")
	require.Equal(t, 64, CreditLimit(slots, 8), "never less than one engine's default credit")
	require.Equal(t, 64, CreditLimit(256, 1))
	s, _ := newTestState(t, slots)
	owner := func(id int) messages.JobRef {
		return messages.JobRef{Origin: messages.OriginCredit, ID: messages.JobID(id)}
	}
	got, _ := s.Grant(owner(1), 5000)
	assert.Len(t, got, 4096, "one engine: a sixteenth")
	got, _ = s.Grant(owner(2), 100)
	assert.Empty(t, got, "with a second engine the bound is a sixty-fourth, which the first holds four times over")
	require.Equal(t, 4096, s.ReleaseCredit(owner(1)))
	got, _ = s.Grant(owner(2), 5000)
	assert.Len(t, got, 4096, "the first released: one engine again")
	for id := 3; id <= 8; id++ {
		got, _ = s.Grant(owner(id), 64)
		assert.Empty(t, got, "engine %d: the credit held passes the bound of %d engines", id, id)
	}
	require.Equal(t, 4096, s.ReleaseCredit(owner(2)))
	total := 0
	for id := 3; id <= 8; id++ {
		got, _ = s.Grant(owner(id), 64)
		total += len(got)
	}
	assert.Equal(t, CreditLimit(slots, 6), total, "the six left share their bound")
	res, err := s.Reserve(j1, ks(0, 1, 2))
	require.NoError(t, err, "stores outside credit are not bounded by it")
	assert.Len(t, res.Slots, 3)
	checkInv(t, s)
}

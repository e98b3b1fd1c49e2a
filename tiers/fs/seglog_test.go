package fs

// The segment layout's decision logic alone, no I/O: reservations at the
// ends of the active segment's two regions, roll-over at the target size
// or a full entry region, whole-segment eviction in LRU order within the
// capacity, dead blocks, chores.

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

// The records of these tests: an entry of ent bytes, a block of blk.
const (
	ent  = 100
	blk  = 256
	cost = ent + blk + segEntrySize
)

// logWrite reserves and completes k's record.
func logWrite(t *testing.T, x *segLog, k messages.Key) *segWrite {
	t.Helper()
	w, err := x.beginWrite(k, ent, blk)
	require.NoError(t, err)
	x.endWrite(w, true)
	require.NoError(t, x.checkInvariants())
	return w
}

func TestSegLogReservesSequentiallyAndRolls(t *testing.T) {
	x := newSegLog(0, segOverhead+3*cost, 1)
	var ws []*segWrite
	for i := range 7 {
		ws = append(ws, logWrite(t, x, benchKey(i)))
	}
	for i, w := range ws {
		base := w.rec.seg.dataBase
		require.Equal(t, uint64(1+i/3), w.rec.seg.id, "three records a segment")
		require.Equal(t, int64(segHeaderSize+(i%3)*ent), w.rec.off, "entries back to back from the header")
		require.Equal(t, int64(ent), w.rec.size)
		require.Zero(t, base%segPage, "the data region starts at a filesystem block")
		require.GreaterOrEqual(t, base, int64(segHeaderSize+3*entryBudget), "room for an entry per block slot")
		require.Equal(t, base+int64(i%3)*blk, w.rec.data, "blocks back to back from the data region's start")
		require.Equal(t, i%3 == 0, w.header, "the first record writes the segment header")
	}
	require.Equal(t, 7, x.ready)
	require.Equal(t, int64(3*segOverhead+7*cost), x.used)
	// Two full segments, settled: each due its seal, once.
	c := x.chores()
	require.Len(t, c, 2)
	require.True(t, c[0].seal)
	require.Equal(t, []int64{segHeaderSize, segHeaderSize + ent, segHeaderSize + 2*ent}, c[0].offs)
	require.Empty(t, x.chores())
	x.choreDone(c[0], nil)
	x.requeue(c[1])
	require.Len(t, x.chores(), 1, "a chore the queue refused is due again")

	// A first write that fails: the next write carries the header again.
	x.roll()
	w0, err := x.beginWrite(benchKey(200), ent, blk)
	require.NoError(t, err)
	require.True(t, w0.header)
	x.endWrite(w0, false)
	w1, err := x.beginWrite(benchKey(201), ent, blk)
	require.NoError(t, err)
	require.Same(t, w0.rec.seg, w1.rec.seg)
	require.True(t, w1.header, "no write with the header landed yet")
	x.endWrite(w1, true)
	w2, err := x.beginWrite(benchKey(202), ent, blk)
	require.NoError(t, err)
	require.False(t, w2.header, "one did")
	x.endWrite(w2, true)
	x.roll()
	require.NoError(t, x.checkInvariants())

	// A record larger than the target still takes a segment of its own.
	w, err := x.beginWrite(benchKey(100), ent, 10*blk)
	require.NoError(t, err)
	require.Equal(t, int64(segHeaderSize), w.rec.off)
	_, err = x.beginWrite(benchKey(100), ent, blk)
	require.ErrorIs(t, err, errBusy, "no second write of a key being written")
	x.endWrite(w, false)
	require.False(t, x.has(benchKey(100)))
	require.NoError(t, x.checkInvariants())
	_, err = x.beginWrite(benchKey(0), ent, blk)
	require.ErrorIs(t, err, errExists)
}

// Entries larger than the region kept for them close the segment early;
// one always fits a new segment's region.
func TestSegLogRollsWhenTheEntryRegionIsFull(t *testing.T) {
	const block = 64 << 10
	x := newSegLog(0, 64*block, 1)
	write := func(i int, entry int64) *record {
		w, err := x.beginWrite(benchKey(i), entry, block)
		require.NoError(t, err)
		x.endWrite(w, true)
		require.NoError(t, x.checkInvariants())
		return w.rec
	}
	first := write(0, ent)
	big := first.seg.dataBase / 2
	require.Equal(t, uint64(1), write(1, big).seg.id, "half the region still fits")
	r := write(2, big)
	require.Equal(t, uint64(2), r.seg.id, "the region is full: a new segment, long before its target size")
	require.GreaterOrEqual(t, r.seg.dataBase, int64(segHeaderSize)+2*big, "sized for its first entry")
	require.Zero(t, r.seg.dataBase%block)
}

func TestSegLogEvictsWholeSegmentsInLRUOrder(t *testing.T) {
	seg := int64(segOverhead + 2*cost) // two records a segment
	x := newSegLog(8*seg, seg, 1)      // sealed at seg: an eighth of the capacity
	for i := range 16 {
		logWrite(t, x, benchKey(i))
	}
	require.Equal(t, 8*seg, x.used, "full to the byte")
	x.touch(benchKey(0)) // segment 1 most recent (segment 8, the active one, is not evictable)
	w, err := x.beginWrite(benchKey(16), ent, blk)
	require.NoError(t, err)
	require.Equal(t, []messages.Key{benchKey(2), benchKey(3)}, w.evicted, "the least recently used segment goes whole")
	require.Len(t, w.removes, 1)
	require.Equal(t, uint64(2), w.removes[0].id)
	require.False(t, x.has(benchKey(2)))
	require.True(t, x.has(benchKey(0)))
	x.endWrite(w, true)
	require.NoError(t, x.checkInvariants())
	require.LessOrEqual(t, x.used, x.capacity)

	// A record that cannot fit even with every settled segment gone.
	_, err = x.beginWrite(benchKey(50), ent, 8*seg)
	require.ErrorIs(t, err, messages.ErrTierFull)
	require.NoError(t, x.checkInvariants())
}

func TestSegLogDeadBlocksAndEmptySegments(t *testing.T) {
	x := newSegLog(0, segOverhead+2*cost, 1)
	first := logWrite(t, x, benchKey(0))
	logWrite(t, x, benchKey(1))
	logWrite(t, x, benchKey(2))   // segment 1 full and settled
	require.Len(t, x.chores(), 1) // its seal, in flight from now

	dropped := func(k messages.Key, at *record) bool {
		ok, gone := x.drop(k, at)
		require.Nil(t, gone, "segment 1's seal is in flight")
		return ok
	}
	require.False(t, dropped(benchKey(0), &record{}), "a failed read of another copy drops nothing")
	require.True(t, dropped(benchKey(0), first.rec))
	require.False(t, dropped(benchKey(0), nil), "already gone")
	used := x.used
	require.True(t, dropped(benchKey(1), nil))
	require.Equal(t, used-first.rec.seg.size, x.used, "a settled segment with no live block goes")
	require.Empty(t, x.chores(), "its removal waits for its seal in flight")
	x.choreDone(segChore{seg: first.rec.seg, seal: true}, nil)
	c := x.chores()
	require.Len(t, c, 1)
	require.False(t, c[0].seal, "then its file is removed")
	require.NoError(t, x.checkInvariants())

	// Removed, then written again: a new record, readable.
	w := logWrite(t, x, benchKey(0))
	require.True(t, x.has(benchKey(0)))
	require.NotEqual(t, first.rec, w.rec)

	// A dead block in the active segment: the segment, once rolled with
	// nothing live, goes without a seal.
	require.True(t, dropped(benchKey(2), nil))
	require.True(t, dropped(benchKey(0), nil))
	logWrite(t, x, benchKey(3))
	logWrite(t, x, benchKey(4))
	c = x.chores()
	require.Len(t, c, 1)
	require.False(t, c[0].seal, "an emptied segment is removed, not sealed")
	require.NoError(t, x.checkInvariants())

	// Emptied once sealed: its removal is the caller's, at once.
	x.choreDone(c[0], nil)
	logWrite(t, x, benchKey(5)) // segment 3 (3, 4) full
	for _, c := range x.chores() {
		x.choreDone(c, nil)
	}
	_, gone := x.drop(benchKey(3), nil)
	require.Nil(t, gone)
	ok, gone := x.drop(benchKey(4), nil)
	require.True(t, ok)
	require.NotNil(t, gone)
	require.Equal(t, uint64(3), gone.id)
	require.Empty(t, x.chores())
	require.NoError(t, x.checkInvariants())
}

// keyLog is an Observer keeping what it heard, in order.
type keyLog struct{ readable, gone []messages.Key }

func (l *keyLog) Readable(k messages.Key) { l.readable = append(l.readable, k) }
func (l *keyLog) Gone(k messages.Key)     { l.gone = append(l.gone, k) }

// The residency index hears every block that becomes readable (a write, a
// segment found at start) and every one that stops being so (a whole
// segment evicted, a block dropped) — never a write that failed.
func TestSegLogTellsItsObserverWhatIsReadable(t *testing.T) {
	seg := int64(segOverhead + 2*cost)
	x := newSegLog(4*seg, seg, 1)
	obs := &keyLog{}
	x.obs = obs
	w, err := x.beginWrite(benchKey(9), ent, blk)
	require.NoError(t, err)
	x.endWrite(w, false)
	var evicted []messages.Key
	for i := range 9 {
		evicted = append(evicted, logWrite(t, x, benchKey(i)).evicted...)
	}
	require.Len(t, obs.readable, 9, "the failed write is never readable")
	require.NotContains(t, obs.readable, benchKey(9))
	require.NotEmpty(t, evicted)
	require.Equal(t, evicted, obs.gone, "an evicted segment's blocks go")
	w, err = x.beginWrite(benchKey(10), ent, blk)
	require.NoError(t, err)
	x.endWrite(w, true)
	ok, _ := x.drop(benchKey(8), nil)
	require.True(t, ok)
	require.Equal(t, benchKey(8), obs.gone[len(obs.gone)-1], "a dropped block goes")

	found := newSegLog(0, seg, 1)
	found.obs = &keyLog{}
	found.addFound(&segment{id: 3, size: seg}, []segRec{{key: benchKey(1)}, {key: benchKey(2)}})
	require.Equal(t, []messages.Key{benchKey(1), benchKey(2)}, found.obs.(*keyLog).readable, "found at start")
}

// The files layout's Index tells its observer the same.
func TestIndexTellsItsObserverWhatIsReadable(t *testing.T) {
	x := NewIndex(3 * 100)
	obs := &keyLog{}
	x.SetObserver(obs)
	require.True(t, x.Add(benchKey(0), 100))
	_, err := x.BeginWrite(benchKey(1), 100)
	require.NoError(t, err)
	x.EndWrite(benchKey(1), true)
	_, err = x.BeginWrite(benchKey(2), 100)
	require.NoError(t, err)
	x.EndWrite(benchKey(2), false)
	require.Empty(t, obs.gone)
	_, err = x.BeginWrite(benchKey(3), 100)
	require.NoError(t, err)
	x.EndWrite(benchKey(3), true)
	evicted, err := x.BeginWrite(benchKey(4), 100)
	require.NoError(t, err)
	require.Equal(t, []messages.Key{benchKey(0), benchKey(1), benchKey(3)}, obs.readable, "never the failed write")
	require.Equal(t, []messages.Key{benchKey(0)}, evicted)
	require.Equal(t, evicted, obs.gone)
}

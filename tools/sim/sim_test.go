package sim

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

func TestFillVerifyDetectsFlippedByte(t *testing.T) {
	ns := DefaultLayout.Namespace()
	for _, size := range []int{1, 7, 8, 100, 16 << 10} {
		buf := make([]byte, size)
		Fill(buf, KeyFor(ns, 42))
		require.True(t, Verify(buf, KeyFor(ns, 42)), "size %d", size)
		assert.False(t, Verify(buf, KeyFor(ns, 43)), "another key's content, size %d", size)
		for _, i := range []int{0, size / 2, size - 1} {
			buf[i] ^= 0x10
			assert.False(t, Verify(buf, KeyFor(ns, 42)), "flipped byte %d of %d", i, size)
			buf[i] ^= 0x10
		}
	}
}

func TestShardsCoverTheBlockAndMatchWholeFill(t *testing.T) {
	key := KeyFor(DefaultLayout.Namespace(), 7)
	for _, size := range []int{8, 100, 4096, 16<<10 + 3} {
		for workers := 1; workers <= 5; workers++ {
			whole := make([]byte, size)
			Fill(whole, key)
			parts := make([]byte, size)
			next := 0
			for w := range workers {
				lo, hi := Shard(size, workers, w)
				require.Equal(t, next, lo, "size %d workers %d worker %d", size, workers, w)
				require.Zero(t, lo%8)
				WriteShard(parts, key, workers, w)
				assert.True(t, VerifyShard(whole, key, workers, w))
				assert.True(t, VerifyRange(whole[lo:hi], key, lo))
				next = hi
			}
			require.Equal(t, size, next)
			assert.Equal(t, whole, parts)
		}
	}
}

func TestLRUEvictsLeastRecentlyUsed(t *testing.T) {
	c := NewLRU(3)
	for _, id := range []uint64{1, 2, 3} {
		_, evicted := c.Add(id)
		require.False(t, evicted)
	}
	require.True(t, c.Touch(1)) // order now 1,3,2 (most recent first)
	victim, evicted := c.Add(4)
	require.True(t, evicted)
	assert.Equal(t, uint64(2), victim)
	assert.Equal(t, 3, c.Len())
	assert.False(t, c.Contains(2))
	assert.Equal(t, 1, c.PrefixHits([]uint64{1, 2, 3}), "prefix stops at the first miss")
	assert.Equal(t, 0, NewLRU(0).Len())
	_, evicted = NewLRU(0).Add(1)
	assert.False(t, evicted)
}

func TestLRUChainPrefixDoesNotTouch(t *testing.T) {
	c := NewLRU(3)
	c.AddChain([]uint64{1, 2, 3}) // the head goes in last: evicted last
	assert.Equal(t, 2, c.Prefix([]uint64{1, 2, 4, 3}), "prefix stops at the first miss")
	victim, evicted := c.Add(5)
	require.True(t, evicted)
	assert.Equal(t, uint64(3), victim, "Prefix touched nothing; the chain's tail goes first")
}

func TestReadLookup(t *testing.T) {
	const h, m, r, p = messages.Hit, messages.Miss, messages.Retry, messages.HitPending
	for _, c := range []struct {
		st   []messages.LookupStatus
		want Answer
	}{
		{nil, Answer{}},
		{[]messages.LookupStatus{h, h}, Answer{Hits: 2}},
		{[]messages.LookupStatus{h, m, h}, Answer{Hits: 1}},
		{[]messages.LookupStatus{h, r, m}, Answer{Hits: 1, Retry: true}},
		{[]messages.LookupStatus{p, h}, Answer{Pending: true}},
	} {
		a := ReadLookup(c.st)
		assert.Equal(t, c.want, a, "%v", c.st)
		assert.Equal(t, c.want.Retry || c.want.Pending, a.Wait())
	}
}

func TestStoreContextNamesTheParent(t *testing.T) {
	ctx := NewReqContext("r", 2)
	keys := Keys(DefaultLayout.Namespace(), []uint64{1, 2, 3})
	assert.Nil(t, StoreContext(ctx, keys, 0).ParentBlockHash)
	sc := StoreContext(ctx, keys, 2)
	assert.Equal(t, []byte(keys[1].Hash), sc.ParentBlockHash)
	assert.Equal(t, "r", sc.RequestID)
	assert.Nil(t, ctx.ParentBlockHash, "the request's own context is not changed")
}

func TestSyntheticIsDeterministic(t *testing.T) {
	a := Synthetic(DefaultSynthetic(7, 500))
	b := Synthetic(DefaultSynthetic(7, 500))
	c := Synthetic(DefaultSynthetic(8, 500))
	require.Len(t, a, 500)
	assert.Equal(t, a, b)
	assert.NotEqual(t, a, c)
	ideal := IdealHitRate(a)
	assert.Greater(t, ideal, 0.3, "multi-turn conversations share prefixes")
	assert.Less(t, ideal, 1.0)
}

// A trace whose unbounded-cache hit rate is known by hand: prefix semantics
// count a block only while every earlier block of its chain was seen.
const tinyTrace = `{"timestamp": 0, "input_length": 1536, "output_length": 10, "hash_ids": [1, 2, 3]}
{"timestamp": 5, "input_length": 2048, "output_length": 10, "hash_ids": [1, 2, 4, 5]}

{"timestamp": 9, "input_length": 1024, "output_length": 10, "hash_ids": [6, 2]}
{"timestamp": 12, "input_length": 1536, "output_length": 10, "hash_ids": [1, 2, 4]}
`

func TestIdealHitRateOnTinyTrace(t *testing.T) {
	reqs, err := ReadTrace(strings.NewReader(tinyTrace), 0)
	require.NoError(t, err)
	require.Len(t, reqs, 4)
	assert.Equal(t, []uint64{1, 2, 4, 5}, reqs[1].Blocks)
	assert.EqualValues(t, 5e6, reqs[1].Arrival.Nanoseconds())
	// hits: 0 + 2 (1,2) + 0 (6 unseen stops the chain before 2) + 3 = 5 of 12.
	assert.InDelta(t, 5.0/12.0, IdealHitRate(reqs), 1e-12)
	two, err := ReadTrace(strings.NewReader(tinyTrace), 2)
	require.NoError(t, err)
	assert.Len(t, two, 2)
	_, err = ReadTrace(strings.NewReader("{not json}\n"), 0)
	assert.Error(t, err)
}

// testConfig is a small, fast engine configuration.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.GPUBlocks = 64
	cfg.Workers = 2
	return cfg
}

func TestRunAgainstFakeNodeVerifiesEveryLoad(t *testing.T) {
	reqs := Synthetic(DefaultSynthetic(1, 400))
	run := func() Summary {
		s, err := Run(context.Background(), newFakeNode(512, 4096, 2), reqs, testConfig())
		require.NoError(t, err)
		return s
	}
	s := run()
	require.True(t, s.Healthy(), "%+v", s)
	assert.Equal(t, 400, s.Requests)
	assert.Positive(t, s.BlocksLoaded)
	assert.Positive(t, s.GPUHitBlocks)
	assert.Equal(t, s.BlocksLoaded, s.BlocksVerified)
	assert.Equal(t, s.PromptBlocks, s.GPUHitBlocks+s.BlocksLoaded+s.BlocksRecomputed)
	assert.InDelta(t, s.HitRate, s.GPUHitRate+s.CPUHitRate, 1e-12)
	assert.Equal(t, s.Counts(), run().Counts(), "same seed, same counts")
}

func TestRunDetectsCorruptLoads(t *testing.T) {
	node := newFakeNode(512, 4096, 3)
	node.corrupt = true
	cfg := testConfig()
	cfg.Workers = 3
	s, err := Run(context.Background(), node, Synthetic(DefaultSynthetic(1, 200)), cfg)
	require.NoError(t, err)
	assert.Positive(t, s.CorruptBlocks)
	assert.Equal(t, s.BlocksLoaded, s.CorruptBlocks)
	assert.Zero(t, s.BlocksVerified)
	assert.False(t, s.Healthy())
}

func TestRunTimeScaledJumpsIdleTime(t *testing.T) {
	reqs, err := ReadTrace(strings.NewReader(tinyTrace), 0)
	require.NoError(t, err)
	cfg := testConfig()
	cfg.TimeScale = 0.001 // 1 ms of trace = 1 s virtual
	s, err := Run(context.Background(), newFakeNode(64, 1024, 2), reqs, cfg)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, s.VirtualSeconds, 12.0)
	assert.Less(t, s.Steps, 100, "idle time is skipped, not stepped through")
	assert.Equal(t, 3, s.BlocksLoaded+s.GPUHitBlocks-2, "1,2 hit for request 2; 1,2,4 for request 4")
}

// tracePath locates the shared conversation trace from the module root.
func tracePath(t *testing.T) string {
	t.Helper()
	p := filepath.Join("..", "..", "testdata", "traces", "conversation_trace.jsonl")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("trace not found: %v", err)
	}
	return p
}

func TestTraceAgainstFakeNodeMatchesLRUModel(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("replays the whole trace (about 3 s, a minute under -race)")
	}
	reqs, err := ReadTraceFile(tracePath(t), 0)
	require.NoError(t, err)
	require.Len(t, reqs, 12031)
	assert.InDelta(t, 0.366, IdealHitRate(reqs), 0.001)
	cfg := DefaultConfig()
	s, err := Run(context.Background(), newFakeNode(20000, 64, 2), reqs, cfg)
	require.NoError(t, err)
	require.True(t, s.Healthy())
	t.Logf("gpu %.4f cpu %.4f total %.4f", s.GPUHitRate, s.CPUHitRate, s.HitRate)
	assert.InDelta(t, 0.045, s.GPUHitRate, 0.005)
	assert.InDelta(t, 0.288, s.HitRate, 0.01)
}

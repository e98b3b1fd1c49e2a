package sim

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// runNode runs reqs against a fresh embedded node of cpuBlocks slots.
func runNode(t *testing.T, reqs []Request, cpuBlocks int, cfg Config) Summary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	blockBytes := 4096
	node, err := kvtier.Open(ctx, kvtier.Config{
		PoolBytes: int64(cpuBlocks * blockBytes), BlockBytes: blockBytes, JobWorkers: max(cfg.Workers, 1)})
	require.NoError(t, err)
	s, runErr := Run(ctx, node.Manager(), reqs, cfg)
	require.NoError(t, node.Close(ctx))
	require.NoError(t, runErr)
	return s
}

// requireClean asserts a run loaded blocks, verified all of them, and left
// nothing pinned, leased or pending.
func requireClean(t *testing.T, s Summary) {
	t.Helper()
	assert.Zero(t, s.CorruptBlocks)
	assert.Positive(t, s.BlocksLoaded)
	assert.Equal(t, s.BlocksLoaded, s.BlocksVerified)
	assert.Zero(t, s.LeakedPins)
	assert.Zero(t, s.LeakedLeases)
	assert.Zero(t, s.LeakedWritePending)
	assert.False(t, s.PendingWorkAtEnd)
	assert.Zero(t, s.LateReports)
	assert.Equal(t, s.PromptBlocks, s.GPUHitBlocks+s.BlocksLoaded+s.BlocksRecomputed)
}

func TestEmbeddedNodeSyntheticRunIsCleanAndReproducible(t *testing.T) {
	reqs := Synthetic(DefaultSynthetic(3, 600))
	cfg := testConfig()
	a := runNode(t, reqs, 400, cfg)
	requireClean(t, a)
	assert.Positive(t, a.Evictions, "the pool is small enough to evict")
	b := runNode(t, reqs, 400, cfg)
	assert.Equal(t, a.Counts(), b.Counts(), "same seed, same counts")
}

func TestEmbeddedNodeSlowCopiesWaitOnPendingWrites(t *testing.T) {
	reqs := Synthetic(SyntheticConfig{Seed: 5, Requests: 300, SystemPrompts: 2, Concurrent: 8})
	cfg := testConfig()
	cfg.MaxRunning = 16
	cfg.CopyTime = cfg.StepTime // a store of n blocks takes n steps
	cfg.Workers = 4
	s := runNode(t, reqs, 2000, cfg)
	requireClean(t, s)
	assert.Positive(t, s.LookupWaits, "lookups met HIT_PENDING while stores were in flight")
}

func TestEmbeddedNodeTracePrefix(t *testing.T) {
	if testing.Short() {
		t.Skip("replays 2,000 trace requests")
	}
	reqs, err := ReadTraceFile(tracePath(t), 2000)
	require.NoError(t, err)
	cfg := DefaultConfig()
	cfg.GPUBlocks = 500
	s := runNode(t, reqs, 5000, cfg)
	requireClean(t, s)
	assert.LessOrEqual(t, s.HitRate, IdealHitRate(reqs))
	assert.Greater(t, s.HitRate, s.GPUHitRate)
	t.Logf("first 2000 requests: hit %.4f (gpu %.4f, cpu %.4f), ideal %.4f",
		s.HitRate, s.GPUHitRate, s.CPUHitRate, IdealHitRate(reqs))
}

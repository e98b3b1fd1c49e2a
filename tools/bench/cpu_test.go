package bench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/internal/testutil/testleak"
)

func TestMain(m *testing.M) { testleak.VerifyTestMain(m) }

// TestRunCPUSmall runs the scenario at a tiny size: it must complete, every
// lookup must be a full hit and every store must evict exactly its batch
// (RunCPU checks both), and every figure must be a positive number.
func TestRunCPUSmall(t *testing.T) {
	o := DefaultCPUOptions()
	o.Slots, o.LookupKeys, o.Lookups, o.StoreRounds = 512, 200, 20, 50
	r, err := RunCPU(context.Background(), o)
	require.NoError(t, err)
	for name, v := range map[string]float64{
		"p50": r.LookupP50us, "p99": r.LookupP99us, "lookups/s": r.KeyLookupsPerS,
		"stores/s": r.StoresPerS, "bare lookups/s": r.BareKeyLookupsPerS, "bare stores/s": r.BareStoresPerS,
	} {
		require.Greater(t, v, 0.0, name)
	}
	require.LessOrEqual(t, r.LookupP50us, r.LookupP99us)
}

func TestRunCPURejectsOversizedLookups(t *testing.T) {
	o := DefaultCPUOptions()
	o.Slots, o.LookupKeys = 16, 2000
	_, err := RunCPU(context.Background(), o)
	require.Error(t, err)
}

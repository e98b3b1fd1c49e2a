package bench

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The idle scenario's processes are this test binary run again as a
// child (KVTIER_BENCH_IDLE_CHILD set), before any test or TestMain runs.
func init() {
	if os.Getenv("KVTIER_BENCH_IDLE_CHILD") == "1" {
		os.Exit(IdleChildMain(os.Args[1:], os.Stdin, os.Stdout))
	}
}

func testChild(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "KVTIER_BENCH_IDLE_CHILD=1")
	return cmd
}

// A short run of the whole scenario: every figure is produced, the peer
// fetches and verifies while the node is paused, the node's engine gets
// MISS meanwhile and has no pending work, and shutdown with the peer
// still fetching is clean. Rates and durations are not asserted.
func TestRunIdleSmall(t *testing.T) {
	o := DefaultIdleOptions()
	o.Window, o.Settle, o.Probes, o.ProbeGap, o.PauseWindow = 200*time.Millisecond, 0, 5, time.Millisecond, 200*time.Millisecond
	o.Blocks, o.BlockBytes, o.Slots, o.Timeout = 4, 4096, 16, 2*time.Minute
	o.Child = testChild
	r, err := RunIdle(context.Background(), o)
	require.NoError(t, err)
	require.Len(t, r.PeerCtxswPerS, o.Peers)
	require.Equal(t, o.Probes, r.PeerLookupSamples)
	require.Positive(t, r.PeerLookupP50us)
	require.Positive(t, r.RawTCPRTTP50us)
	require.Positive(t, r.PeerFetchesDuring, "a paused node keeps serving its peers")
	require.Positive(t, r.BlocksServedPaused)
	require.False(t, r.PendingWhileServing, "serving peers is not engine work")
	require.True(t, r.PausedLookupMiss, "the paused node's engine gets MISS")
	require.Empty(t, r.ShutdownErr, "graceful shutdown under peer load")
	require.GreaterOrEqual(t, r.PeerRoundsTotal, r.PeerFetchesDuring)
	require.Positive(t, r.NodeThreads)
	require.True(t, r.Standalone, "an idle engine was connected to the node")
}

func TestRunIdleRejectsBadOptions(t *testing.T) {
	o := DefaultIdleOptions()
	o.Slots, o.Blocks = 4, 8
	_, err := RunIdle(context.Background(), o)
	require.Error(t, err)
}

// A short run of the engine-poll scenario: both settings produce every
// figure from real processes (an engine over unix://, a peer), and the
// verdict follows from the ratios. Latencies are not asserted.
func TestRunEnginePollSmall(t *testing.T) {
	o := DefaultEnginePollOptions()
	o.Rounds, o.Probes, o.ProbeGap, o.BurstCalls, o.StepGap = 1, 5, time.Millisecond, 2, time.Millisecond
	o.BlockBytes, o.Slots, o.Timeout, o.Child = 4096, 32, 2*time.Minute, testChild
	r, err := RunEnginePoll(context.Background(), o)
	require.NoError(t, err)
	for _, s := range []EnginePollSide{r.Off, r.On} {
		require.Positive(t, s.EngineLookupP50us)
		require.Positive(t, s.PeerLookupP50us)
		require.Positive(t, s.IdlePeerLookupP50us)
		require.Equal(t, o.Probes, s.PeerLookups)
		require.Positive(t, s.EngineLookups)
	}
	require.Zero(t, r.Off.PollUs)
	require.Equal(t, float64(o.Poll.Microseconds()), r.On.PollUs)
	want := "off"
	if r.EngineSpeedup >= 1.2 && r.PeerP99Ratio <= 1.1 {
		want = "on"
	}
	require.Equal(t, want, r.Verdict)
}

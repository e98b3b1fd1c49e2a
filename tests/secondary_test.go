package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tierSummary is the part of `kvtier sim --json` this test reads.
type tierSummary struct {
	HitRate            float64           `json:"hit_rate"`
	IdealHitRate       float64           `json:"ideal_hit_rate"`
	FSHitRate          float64           `json:"fs_hit_rate"`
	BlocksLoaded       int               `json:"blocks_loaded"`
	BlocksVerified     int               `json:"blocks_verified"`
	CorruptBlocks      int               `json:"corrupt_blocks"`
	LeakedPins         int               `json:"leaked_pins"`
	LeakedLeases       int               `json:"leaked_leases"`
	LeakedWritePending int               `json:"leaked_write_pending"`
	PendingWorkAtEnd   bool              `json:"pending_work_at_end"`
	TierPromoted       map[string]uint64 `json:"tier_promoted_blocks"`
}

func runTierSim(t *testing.T, bin string, args ...string) tierSummary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, append([]string{"sim", "--json", "--no-progress"}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "kvtier sim %v: %s", args, stderr.String())
	lines := bytes.Split(bytes.TrimSpace(stdout.Bytes()), []byte("\n"))
	var s tierSummary
	require.NoError(t, json.Unmarshal(lines[len(lines)-1], &s))
	return s
}

// The reason secondary tiers exist, on the real conversation trace: with a
// 1,000-block GPU cache and a 5,000-block CPU tier, an fs tier with room
// for the whole trace brings the hit rate to within a few points of the
// ideal; the CPU tier alone does not. Every loaded byte is verified and
// nothing leaks. The first 3,000 requests keep it to seconds (ideal
// 31.4%); README.md gives the full-trace commands and figures (36.5% with
// fs vs 11.2% CPU only, ideal 36.6%).
func TestSecondaryFSTierOnTheConversationTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("replays 3,000 trace requests through a filesystem tier")
	}
	bin := buildCLI(t)
	trace := filepath.Join("..", "testdata", "traces", "conversation_trace.jsonl")
	args := []string{"--trace", trace, "--trace-limit", "3000", "--gpu-blocks", "1000", "--cpu-blocks", "5000", "--block-bytes", "4096"}
	cpuOnly := runTierSim(t, bin, args...)
	withFS := runTierSim(t, bin, append(args, "--fs-root", t.TempDir())...)
	for _, s := range []tierSummary{cpuOnly, withFS} {
		require.Zero(t, s.CorruptBlocks)
		require.Equal(t, s.BlocksLoaded, s.BlocksVerified)
		require.Zero(t, s.LeakedPins+s.LeakedLeases+s.LeakedWritePending)
		require.False(t, s.PendingWorkAtEnd)
	}
	t.Logf("CPU only: hit %.4f; with fs: hit %.4f (fs %.4f); ideal %.4f", cpuOnly.HitRate, withFS.HitRate, withFS.FSHitRate, withFS.IdealHitRate)
	require.Less(t, cpuOnly.HitRate, withFS.IdealHitRate-0.15, "the CPU tier alone is far from the ideal")
	require.Greater(t, withFS.HitRate, withFS.IdealHitRate-0.03, "with fs: within a few points of the ideal")
	require.Positive(t, withFS.FSHitRate)
	require.Positive(t, withFS.TierPromoted["fs"])
}

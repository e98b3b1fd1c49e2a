package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/internal/testutil/gobuild"
)

// buildCLI compiles ./cmd/kvtier into a temporary directory.
func buildCLI(t *testing.T) string {
	t.Helper()
	return gobuild.Command(t, "github.com/kvtier/kvtier/cmd/kvtier", "kvtier")
}

// simSummary is the part of `kvtier sim --json`'s last line this test reads.
type simSummary struct {
	Requests           int     `json:"requests"`
	BlocksLoaded       int     `json:"blocks_loaded"`
	BlocksVerified     int     `json:"blocks_verified"`
	CorruptBlocks      int     `json:"corrupt_blocks"`
	HitRate            float64 `json:"hit_rate"`
	IdealHitRate       float64 `json:"ideal_hit_rate"`
	LeakedPins         int     `json:"leaked_pins"`
	LeakedLeases       int     `json:"leaked_leases"`
	LeakedWritePending int     `json:"leaked_write_pending"`
}

func runSim(t *testing.T, bin string, args ...string) simSummary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, append([]string{"sim", "--json"}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = waitDelay
	require.NoError(t, cmd.Run(), "kvtier sim %v: %s", args, stderr.String())
	lines := bytes.Split(bytes.TrimSpace(stdout.Bytes()), []byte("\n"))
	var s simSummary
	require.NoError(t, json.Unmarshal(lines[len(lines)-1], &s), "last line: %s", lines[len(lines)-1])
	return s
}

// TestSimulatorEndToEnd runs the real CLI on its defaults and with a second
// seed: every loaded block verified, none corrupt, nothing leaked once the
// node is quiet, a hit rate between zero and the ideal, and the same seed
// giving the same counts.
func TestSimulatorEndToEnd(t *testing.T) {
	bin := buildCLI(t)
	a := runSim(t, bin, "--seed", "7", "--no-progress")
	require.Positive(t, a.Requests)
	require.Positive(t, a.BlocksLoaded, "the default workload must exercise loads from the CPU tier")
	require.Equal(t, a.BlocksLoaded, a.BlocksVerified)
	require.Zero(t, a.CorruptBlocks)
	require.Zero(t, a.LeakedPins+a.LeakedLeases+a.LeakedWritePending)
	require.Greater(t, a.HitRate, 0.0)
	require.LessOrEqual(t, a.HitRate, a.IdealHitRate+1e-9)

	b := runSim(t, bin, "--seed", "7", "--no-progress")
	require.Equal(t, a, b, "same seed, same summary")

	arc := runSim(t, bin, "--seed", "7", "--policy", "arc", "--cpu-blocks", "512", "--no-progress")
	require.Zero(t, arc.CorruptBlocks)
	require.Equal(t, arc.BlocksLoaded, arc.BlocksVerified)
}

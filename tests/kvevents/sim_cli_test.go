package kvevents

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/internal/testutil/freeport"
)

// freeAddr is a loopback TCP address nobody listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := freeport.Port()
	require.NoError(t, err)
	return "tcp://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// TestSimCLIEventsMatchItsInventory is the must-hold with real
// processes only: `kvtier sim` with events on and an fs tier that evicts
// writes its node's inventory and holds the node; a late `kvtier events
// tail --replay-from 0 --json` rebuilds stored-minus-removed per medium
// (CPU and STORAGE); the two sets are equal.
func TestSimCLIEventsMatchItsInventory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildCLI(ctx, t)

	pub, rep := freeAddr(t), freeAddr(t)
	invPath := filepath.Join(t.TempDir(), "inventory.json")
	sim := exec.CommandContext(ctx, bin, "sim", "--no-progress", "--requests", "400", "--cpu-blocks", "600",
		"--block-bytes", "16384", "--fs-root", t.TempDir(), "--fs-blocks", "300", "--events-endpoint", pub, "--events-replay", rep,
		"--inventory", invPath, "--events-hold")
	sim.WaitDelay = 10 * time.Second
	stderr, err := sim.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, sim.Start())
	exited := make(chan error, 1)
	held := make(chan struct{})
	var lines []string // the sim's stderr, for failure messages; written only before exited is sent
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if strings.Contains(sc.Text(), "holding the node") {
				close(held)
			}
		}
		exited <- sim.Wait()
	}()
	t.Cleanup(func() { _ = sim.Process.Kill() })
	select {
	case <-held:
	case err := <-exited:
		t.Fatalf("sim exited before holding its node: %v\n%s", err, strings.Join(lines, "\n"))
	case <-ctx.Done():
		t.Fatal("sim never held its node")
	}

	got := tailJSON(ctx, t, pub, rep)
	require.NoError(t, sim.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "sim exits 0 on SIGTERM: the run was clean; stderr:\n%s", strings.Join(lines, "\n"))
	case <-ctx.Done():
		t.Fatal("sim did not stop on SIGTERM")
	}

	data, err := os.ReadFile(invPath)
	require.NoError(t, err)
	var want map[string][]uint64
	require.NoError(t, json.Unmarshal(data, &want))
	require.NotEmpty(t, want["CPU"])
	require.NotEmpty(t, want["STORAGE"])
	for medium, hashes := range want {
		sort.Slice(hashes, func(i, j int) bool { return hashes[i] < hashes[j] })
		require.Equal(t, hashes, got.sorted(medium), "medium %s", medium)
	}
	for medium := range got {
		if len(got[medium]) > 0 {
			require.Contains(t, want, medium, "events announce blocks in a medium the node does not hold")
		}
	}
}

package kvevents

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
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
	addr, err := freeport.Addr()
	require.NoError(t, err)
	return "tcp://" + addr
}

// heldSim is a `kvtier sim --events-hold` process: it runs its requests,
// then holds its node (its publisher and replay) until SIGTERM.
type heldSim struct {
	cmd   *exec.Cmd
	done  chan struct{} // closed once the process has ended: err and lines are final then
	err   error         // the process's Wait
	lines []string      // its stderr, for failure messages
}

// startHeldSim runs `bin sim --no-progress --events-hold` with args and
// returns once the sim says it holds its node, failing t if it exits first
// or ctx ends; the tests that read a held node's events share it. The
// process is killed, and reaped, at t's end.
func startHeldSim(ctx context.Context, t *testing.T, bin string, args ...string) *heldSim {
	t.Helper()
	s := &heldSim{done: make(chan struct{})}
	s.cmd = exec.CommandContext(ctx, bin, append([]string{"sim", "--no-progress", "--events-hold"}, args...)...)
	s.cmd.WaitDelay = 10 * time.Second
	stderr, err := s.cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, s.cmd.Start())
	held := make(chan struct{})
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(stderr)
		for said := false; sc.Scan(); {
			s.lines = append(s.lines, sc.Text())
			if !said && strings.Contains(sc.Text(), "holding the node") {
				said = true
				close(held)
			}
		}
		s.err = s.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.done
	})
	select {
	case <-held:
	case <-s.done:
		t.Fatalf("sim exited before holding its node: %v\n%s", s.err, s.stderr())
	case <-ctx.Done():
		t.Fatal("sim never held its node")
	}
	return s
}

// stop ends the sim with SIGTERM and requires it to exit 0 (a clean run).
func (s *heldSim) stop(ctx context.Context, t *testing.T) {
	t.Helper()
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-s.done:
		require.NoError(t, s.err, "sim exits 0 on SIGTERM: the run was clean; stderr:\n%s", s.stderr())
	case <-ctx.Done():
		t.Fatal("sim did not stop on SIGTERM")
	}
}

// stderr is what the sim wrote to stderr; read it only once it has ended.
func (s *heldSim) stderr() string { return strings.Join(s.lines, "\n") }

// TestSimCLIEventsMatchItsInventory is the must-hold with real
// processes only: `kvtier sim` with events on and an fs tier that evicts
// writes its node's inventory and holds the node; a late `kvtier events
// tail --replay-from 0 --json` rebuilds stored-minus-removed per medium
// (CPU and STORAGE); the two sets are equal.
func TestSimCLIEventsMatchItsInventory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildCLI(t)

	pub, rep := freeAddr(t), freeAddr(t)
	invPath := filepath.Join(t.TempDir(), "inventory.json")
	sim := startHeldSim(ctx, t, bin, "--requests", "400", "--cpu-blocks", "600",
		"--block-bytes", "16384", "--fs-root", t.TempDir(), "--fs-blocks", "300", "--events-endpoint", pub, "--events-replay", rep,
		"--inventory", invPath)

	got := tailJSON(ctx, t, pub, rep)
	sim.stop(ctx, t)

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

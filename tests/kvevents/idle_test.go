package kvevents

// No idle wakeups (docs/DESIGN.md §2.2, the must-hold): a node that
// published its events and has a subscriber connected and a replay served
// sleeps. Measured on a real process: the context switches of every thread
// of `kvtier sim --events-hold`, from /proc, over windows of 2 s once the
// run is over. A polling publisher (a 100 ms loop) would switch 20 times a
// window, every window; the Go runtime's own background work (the scavenger
// returning memory after the run, a forced GC every 2 minutes) can touch a
// window or two, so the test asks for one quiet window among ten.

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ctxSwitches sums voluntary and involuntary context switches over pid's
// threads.
func ctxSwitches(t *testing.T, pid int) int {
	t.Helper()
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "status"))
	require.NoError(t, err)
	require.NotEmpty(t, tasks)
	total := 0
	for _, f := range tasks {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that just exited
		}
		for _, line := range strings.Split(string(data), "\n") {
			if name, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(name, "ctxt_switches") {
				n, err := strconv.Atoi(strings.TrimSpace(v))
				require.NoError(t, err)
				total += n
			}
		}
	}
	return total
}

func TestIdleNodeWithSubscriberMakesNoWakeups(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildCLI(t)
	pub, rep := freeAddr(t), freeAddr(t)
	sim := startHeldSim(ctx, t, bin, "--requests", "100", "--cpu-blocks", "300",
		"--block-bytes", "16384", "--events-endpoint", pub, "--events-replay", rep)
	pid := sim.cmd.Process.Pid

	subCtx, stopSub := context.WithCancel(ctx)
	defer stopSub()
	_, waitSub := liveSub(subCtx, t, pub)
	require.NotEmpty(t, replay(ctx, t, rep, 0), "a replay is served")

	var seen []int
	for range 10 {
		before := ctxSwitches(t, pid)
		window := time.NewTimer(2 * time.Second) // the measurement window, not a synchronisation
		<-window.C
		n := ctxSwitches(t, pid) - before
		seen = append(seen, n)
		if n <= 1 {
			t.Logf("context switches per 2 s window while idle: %v", seen)
			stopSub()
			waitSub()
			sim.stop(ctx, t)
			return
		}
	}
	t.Fatalf("no quiet 2 s window in 20 s: context switches per window %v", seen)
}

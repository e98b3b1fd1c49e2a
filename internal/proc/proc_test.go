package proc

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The helper is the harness: it starts a long sleep with DieWithParent,
// says its pid, and waits to be killed.
func TestHelperHarness(t *testing.T) {
	if os.Getenv("KVTIER_PROC_HELPER") != "1" {
		t.Skip("helper process only")
	}
	cmd := exec.Command("sleep", "600")
	DieWithParent(cmd)
	require.NoError(t, cmd.Start())
	fmt.Println(cmd.Process.Pid)
	select {}
}

func TestChildDiesWhenItsHarnessIsKilled(t *testing.T) {
	harness := exec.Command(os.Args[0], "-test.run=^TestHelperHarness$")
	harness.Env = append(os.Environ(), "KVTIER_PROC_HELPER=1")
	out, err := harness.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, harness.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	pid, err := strconv.Atoi(line[:len(line)-1])
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, 0), "the child runs")

	require.NoError(t, harness.Process.Kill()) // SIGKILL: no cleanup code of the harness runs
	_ = harness.Wait()
	deadline := time.Now().Add(30 * time.Second) // a liveness bound, not a timing
	for syscall.Kill(pid, 0) == nil {
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && zombie(st) {
			break // dead, waiting for init to reap it
		}
		require.True(t, time.Now().Before(deadline), "the child outlived its harness")
		time.Sleep(10 * time.Millisecond)
	}
}

// zombie reports whether a /proc/<pid>/stat line says the process is dead.
func zombie(stat []byte) bool {
	for i := len(stat) - 1; i > 0; i-- {
		if stat[i] == ')' && i+2 < len(stat) {
			return stat[i+2] == 'Z' || stat[i+2] == 'X'
		}
	}
	return false
}

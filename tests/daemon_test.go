// Package tests holds black-box suites that drive kvtier through its public
// API and real processes.
package tests

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/internal/testutil/gobuild"
	"github.com/kvtier/kvtier/internal/testutil/proclog"
	"github.com/kvtier/kvtier/internal/testutil/tempfile"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// buildDaemon compiles ./cmd/kvtierd into a temporary directory.
func buildDaemon(t *testing.T) string {
	t.Helper()
	return gobuild.Command(t, "github.com/kvtier/kvtier/cmd/kvtierd", "kvtierd")
}

// Bounds on the waits of these tests: none may hang until the test
// binary's timeout, where one stuck test costs the whole run.
const (
	// waitDelay is exec.Cmd.WaitDelay for every command: once the process
	// is gone (or killed at its context's end), Wait gives up on pipes a
	// grandchild still holds after this long.
	waitDelay = 5 * time.Second
	// exitBound is how long a killed process may take to be reaped
	// (WaitDelay included) before the test fails with a goroutine dump.
	exitBound = 30 * time.Second
)

// awaitClosed waits for ch to close within d. Past d the test fails with
// every goroutine's stack (what a hang would have shown, minutes earlier)
// and awaitClosed returns false; it never waits longer.
func awaitClosed(t testing.TB, ch <-chan struct{}, d time.Duration, what string) bool {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ch:
		return true
	case <-timer.C:
		t.Errorf("%s: still waiting after %v; goroutines:\n%s", what, d, allStacks())
		return false
	}
}

// allStacks is every goroutine's stack.
func allStacks() []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}

// poolPath is a unique pool file under /dev/shm (or the test's temp dir
// where there is no /dev/shm), removed at cleanup if the daemon left it.
func poolPath(t *testing.T) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	dir := "/dev/shm"
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		dir = t.TempDir()
	}
	p := filepath.Join(dir, fmt.Sprintf("kvtier-test-%d-%s.pool", os.Getpid(), hex.EncodeToString(b[:])))
	t.Cleanup(func() { _ = os.Remove(p) })
	return p
}

// daemon is a running kvtierd.
type daemon struct {
	cmd    *exec.Cmd
	stderr *proclog.Log
	exited chan struct{} // closed once Wait returned
	err    error         // Wait's result, set before exited closes
}

// startDaemon starts bin with args in this process's environment (a test
// may hand a daemon KVTIER_ variables, e.g. the NIXL library's path); the
// process is killed at cleanup if the test did not stop it.
func startDaemon(t *testing.T, bin string, args ...string) *daemon {
	t.Helper()
	return launchDaemon(t, exec.Command(bin, args...))
}

// wait returns the exit code, or an error if the process outlives ctx.
func (d *daemon) wait(ctx context.Context) (int, error) {
	select {
	case <-d.exited:
		var ee *exec.ExitError
		if d.err != nil && !errors.As(d.err, &ee) {
			return -1, d.err
		}
		return d.cmd.ProcessState.ExitCode(), nil
	case <-ctx.Done():
		return -1, fmt.Errorf("kvtierd still running: %w", ctx.Err())
	}
}

// get fetches url and returns the status and body.
func get(ctx context.Context, client *http.Client, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// metricValue finds an unlabelled sample of name in a text exposition.
func metricValue(body, name string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		rest, ok := strings.CutPrefix(line, name+" ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		return v, err == nil
	}
	return 0, false
}

func TestDaemonServesMetricsAndShutsDown(t *testing.T) {
	bin := buildDaemon(t)
	pool := poolPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	d := startDaemon(t, bin,
		"--pool-path", pool,
		"--pool-bytes", "16MiB",
		"--block-bytes", "64KiB",
		"--metrics-listen", "127.0.0.1:0",
		"--log-format", "json",
		"--shutdown-timeout", "10s",
		"--engine-listen", "none", // no default socket shared with other runs
	)

	rec, err := d.stderr.WaitJSON(ctx, "kvtierd listening")
	require.NoError(t, err)
	addr, _ := rec["metrics_addr"].(string)
	require.NotEmpty(t, addr, "listening line has metrics_addr: %v", rec)
	require.NotEqual(t, "127.0.0.1:0", addr, "the bound port is logged")
	require.EqualValues(t, 256, rec["slots"])
	require.EqualValues(t, 64<<10, rec["block_bytes"])
	require.Equal(t, pool, rec["pool_path"])

	_, err = os.Stat(pool)
	require.NoError(t, err, "pool file exists while the daemon runs")

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	base := "http://" + addr
	for _, path := range []string{"/healthz", "/readyz"} {
		code, body, err := get(ctx, client, base+path)
		require.NoError(t, err, path)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
	}

	code, body, err := get(ctx, client, base+"/metrics")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, body)
	for name, want := range map[string]float64{
		"kvtier_pool_slots":       256,
		"kvtier_pool_block_bytes": 64 << 10,
		"kvtier_pool_slots_free":  256,
		"kvtier_pool_bytes_used":  0,
		"kvtier_paused":           0,
	} {
		got, ok := metricValue(body, name)
		require.True(t, ok, "%s missing from /metrics:\n%s", name, body)
		require.Equal(t, want, got, name)
	}
	require.Contains(t, body, "go_goroutines ")
	require.Contains(t, body, "kvtier_lookup_duration_seconds_bucket")

	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
	defer wcancel()
	exit, err := d.wait(wctx)
	require.NoError(t, err)
	require.Equal(t, 0, exit, "clean shutdown exits 0")
	_, err = os.Stat(pool)
	require.ErrorIs(t, err, os.ErrNotExist, "pool file removed on shutdown")
	_, err = d.stderr.WaitJSON(ctx, "kvtierd stopped")
	require.NoError(t, err)
}

func TestDaemonRejectsBadConfig(t *testing.T) {
	bin := buildDaemon(t)
	badYAML := tempfile.Write(t, "bad.yaml", "pool_bytes: 16MiB\npool_bytez: 1\n")
	badSize := tempfile.Write(t, "badsize.yaml", "pool_bytes: -16MiB\n")

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"negative pool-bytes flag", []string{"--pool-bytes", "-1"}, "pool_bytes"},
		{"zero pool-bytes flag", []string{"--pool-bytes", "0"}, "pool_bytes"},
		{"block larger than pool", []string{"--pool-bytes", "64KiB", "--block-bytes", "1MiB"}, "pool_bytes"},
		{"unknown yaml key", []string{"--config", badYAML}, "pool_bytez"},
		{"negative size in file", []string{"--config", badSize}, "pool_bytes"},
		{"bad policy", []string{"--policy", "fifo"}, "policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			args := append([]string{
				"--pool-path", poolPath(t), "--metrics-listen", "127.0.0.1:0", "--log-format", "json", "--engine-listen", "none",
			}, tc.args...)
			d := startDaemon(t, bin, args...)
			exit, err := d.wait(ctx)
			require.NoError(t, err)
			require.Equal(t, 2, exit, "bad config exits 2; stderr:\n%s", d.stderr)
			rec, err := d.stderr.WaitJSON(ctx, "bad configuration")
			require.NoError(t, err)
			msg, _ := rec["error"].(string)
			require.Contains(t, msg, "bad config")
			require.Contains(t, msg, tc.want)
		})
	}
}

func TestDaemonOpenFailureExits2(t *testing.T) {
	bin := buildDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The pool's directory is a regular file, so Open cannot create the pool.
	notDir := tempfile.Write(t, "file", "")
	d := startDaemon(t, bin, "--pool-path", filepath.Join(notDir, "x.pool"),
		"--pool-bytes", "1MiB", "--block-bytes", "64KiB",
		"--metrics-listen", "127.0.0.1:0", "--log-format", "json", "--engine-listen", "none")
	exit, err := d.wait(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, exit, "failed Open exits 2; stderr:\n%s", d.stderr)
	rec, err := d.stderr.WaitJSON(ctx, "cannot open node")
	require.NoError(t, err)
	require.Contains(t, rec["error"], "pool")
}

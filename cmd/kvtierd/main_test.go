package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/internal/testutil/tempfile"
	"github.com/kvtier/kvtier/messages"
)

func parse(t *testing.T, args ...string) options {
	t.Helper()
	o, err := parseFlags(args, io.Discard)
	require.NoError(t, err)
	return o
}

func TestFlagsOverrideFile(t *testing.T) {
	p := tempfile.Write(t, "c.yaml", "pool_path: /dev/shm/from-file.pool\npool_bytes: 1GiB\nblock_bytes: 1MiB\npolicy: arc\nlease_ttl: 7s\n")

	cfg, err := buildConfig(parse(t, "--config", p, "--pool-bytes", "16MiB", "--block-bytes", "64KiB"))
	require.NoError(t, err)
	require.Equal(t, "/dev/shm/from-file.pool", cfg.PoolPath, "file value kept when the flag is absent")
	require.EqualValues(t, 16<<20, cfg.PoolBytes)
	require.Equal(t, 64<<10, cfg.BlockBytes)
	require.Equal(t, "arc", cfg.Policy)
	require.Equal(t, 7*time.Second, cfg.LeaseTTL)

	cfg, err = buildConfig(parse(t, "--config", p, "--policy", "lru", "--pool-path", "/dev/shm/x.pool"))
	require.NoError(t, err)
	require.Equal(t, "lru", cfg.Policy)
	require.Equal(t, "/dev/shm/x.pool", cfg.PoolPath)
	require.Zero(t, cfg.EnginePoll, "engine polling is off unless asked for")

	cfg, err = buildConfig(parse(t, "--config", p, "--engine-poll", "100us"))
	require.NoError(t, err)
	require.Equal(t, 100*time.Microsecond, cfg.EnginePoll)
}

func TestPoolPathDefaults(t *testing.T) {
	cfg, err := buildConfig(parse(t))
	require.NoError(t, err)
	require.Equal(t, defaultPoolPath(), cfg.PoolPath)
	require.Zero(t, cfg.PoolBytes, "unset sizes are left to Open's defaults")

	cfg, err = buildConfig(parse(t, "--pool-path="))
	require.NoError(t, err)
	require.Empty(t, cfg.PoolPath, "explicit empty path selects the memfd")
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--pool-bytes", "lots"},
		{"--shutdown-timeout", "soon"},
		{"stray-arg"},
	} {
		_, err := parseFlags(args, io.Discard)
		require.Error(t, err, "%v", args)
	}
	for _, args := range [][]string{
		{"--pool-bytes", "0"},
		{"--block-bytes", "-1"},
		{"--policy", "fifo"},
		{"--engine-poll", "1s"},
	} {
		_, err := buildConfig(parse(t, args...))
		require.ErrorIs(t, err, messages.ErrBadConfig, "%v", args)
	}
	_, err := newLogger(os.Stderr, "info", "xml")
	require.Error(t, err)
	_, err = newLogger(os.Stderr, "loud", "json")
	require.Error(t, err)
	_, err = newLogger(os.Stderr, "", "json")
	require.Error(t, err)
}

func TestProbes(t *testing.T) {
	var ready atomic.Bool
	var metrics atomic.Pointer[http.Handler]
	h := probes(&ready, &metrics)
	code := func(path string) int {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		return w.Code
	}
	require.Equal(t, http.StatusOK, code("/healthz"))
	require.Equal(t, http.StatusServiceUnavailable, code("/readyz"))
	require.Equal(t, http.StatusServiceUnavailable, code("/metrics"))

	var m http.Handler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "m 1\n") })
	metrics.Store(&m)
	ready.Store(true)
	require.Equal(t, http.StatusOK, code("/readyz"))
	require.Equal(t, http.StatusOK, code("/metrics"))

	ready.Store(false) // shutdown began
	require.Equal(t, http.StatusServiceUnavailable, code("/readyz"))
	require.Equal(t, http.StatusOK, code("/healthz"))
}

// TestPrintTopology: --print-topology prints the actors the flags and the
// config file turn on, without opening anything (the pool, the socket and
// the peer address here could not be opened).
func TestPrintTopology(t *testing.T) {
	p := tempfile.Write(t, "c.yaml", "secondary_tiers:\n  - kind: fs\n    root: /nonexistent/kvtier\n")
	o := parse(t, "--config", p, "--print-topology", "--engine-listen", "unix:///nonexistent/engine.sock",
		"--pool-path", "/nonexistent/pool", "--peer-listen", "tcp://192.0.2.1:7600", "--node-id", "a", "--peer-secret-file", p)
	require.True(t, o.printTopology)
	cfg, err := buildConfig(o)
	require.NoError(t, err)
	var out strings.Builder
	require.Equal(t, exitOK, printTopology(&out, cfg))
	var order []string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 1 && f[0] != "stop" {
			order = append(order, f[1])
		}
	}
	require.Equal(t, []string{"cpu", "tier-fs", "p2p", "tiering", "bridge", "endpoint", "peers"}, order)
	require.Contains(t, out.String(), "tiering      cpu, tier-fs, p2p")
}

package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/internal/testutil/tempfile"
	"github.com/kvtier/kvtier/internal/testutil/testnet"
	"github.com/kvtier/kvtier/internal/version"
	"github.com/kvtier/kvtier/messages"
)

// TestHelpListsLongFlagsWithTwoDashes: --help is not an error, and lists
// every flag as an operator types it.
func TestHelpListsLongFlagsWithTwoDashes(t *testing.T) {
	for _, arg := range []string{"--help", "-h"} {
		var out bytes.Buffer
		_, err := parseFlags([]string{arg}, &out)
		require.ErrorIs(t, err, pflag.ErrHelp, arg)
		for _, name := range []string{"config", "pool-bytes", "engine-listen", "events-endpoint", "peer", "version"} {
			require.Contains(t, out.String(), "--"+name+" ", "%s lists --%s", arg, name)
			require.NotContains(t, out.String(), " -"+name+" ", "%s lists -%s with one dash", arg, name)
		}
		require.Contains(t, out.String(), "KVTIER_<KEY>")
	}
}

// TestSingleDashLongFlagsAreRefused: pflag reads -pool-bytes as shorthands;
// the error says what to type instead.
func TestSingleDashLongFlagsAreRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		bad  string
	}{
		{[]string{"-pool-bytes", "16MiB"}, "-pool-bytes"},
		{[]string{"-engine-listen=none"}, "-engine-listen=none"},
		{[]string{"--policy", "lru", "-config", "x.yaml"}, "-config"},
	} {
		var out bytes.Buffer
		_, err := parseFlags(tc.args, &out)
		require.Error(t, err, "%v", tc.args)
		require.Contains(t, out.String(), "two dashes: -"+tc.bad+", not "+tc.bad, "%v", tc.args)
	}
	var out bytes.Buffer
	o, err := parseFlags([]string{"--pool-bytes", "16MiB", "--engine-listen=unix:///x.sock", "--print-topology"}, &out)
	require.NoError(t, err)
	require.EqualValues(t, 16<<20, o.poolBytes)
	require.Equal(t, "unix:///x.sock", o.engineListen)
	require.True(t, o.printTopology)
	require.Empty(t, out.String())
}

// TestVersion: --version prints the build on stdout and exits 0 before
// reading any config (a bad one included).
func TestVersion(t *testing.T) {
	t.Setenv("KVTIER_POOL_BYTE", "1GiB") // a typo that would stop the daemon
	var out bytes.Buffer
	require.Equal(t, exitOK, run([]string{"--version", "--config", "/nonexistent.yaml"}, &out, os.Stderr))
	require.Equal(t, "kvtierd "+version.Get().String()+"\n", out.String())
}

// TestSourcesOverrideInOrder: flags override the environment, which
// overrides the file, which overrides the defaults; each key on its own.
func TestSourcesOverrideInOrder(t *testing.T) {
	p := tempfile.Write(t, "c.yaml", "pool_path: /dev/shm/from-file.pool\npool_bytes: 1GiB\nblock_bytes: 1MiB\npolicy: arc\nlease_ttl: 7s\n"+
		"events:\n  endpoint: tcp://*:5557\n")
	env := []string{"KVTIER_POOL_BYTES=64MiB", "KVTIER_BLOCK_BYTES=128KiB", "KVTIER_LEASE_TTL=9s", "KVTIER_EVENTS_TOPIC=env-topic"}
	o := parse(t, "--config", p, "--block-bytes", "64KiB", "--events-topic", "flag-topic")
	o.environ = env
	cfg, err := buildConfig(o)
	require.NoError(t, err)
	require.Equal(t, "/dev/shm/from-file.pool", cfg.PoolPath, "file: no variable or flag")
	require.Equal(t, "arc", cfg.Policy, "file: no variable or flag")
	require.EqualValues(t, 64<<20, cfg.PoolBytes, "environment over the file")
	require.Equal(t, 9*time.Second, cfg.LeaseTTL, "environment over the file")
	require.Equal(t, 64<<10, cfg.BlockBytes, "flag over the environment and the file")
	require.Equal(t, "flag-topic", cfg.Events.Topic, "flag over the environment")
	require.Equal(t, "tcp://*:5557", cfg.Events.Endpoint)
	require.Zero(t, cfg.JobWorkers, "no source: left to Open's default")

	// A variable alone, with no file.
	o = parse(t)
	o.environ = []string{"KVTIER_POLICY=prefix", "KVTIER_POOL_PATH=/dev/shm/env.pool"}
	cfg, err = buildConfig(o)
	require.NoError(t, err)
	require.Equal(t, "prefix", cfg.Policy)
	require.Equal(t, "/dev/shm/env.pool", cfg.PoolPath)

	// The flag's --pool-path= (memfd) beats the environment's file.
	o = parse(t, "--pool-path=", "--engine-listen", "none")
	o.environ = []string{"KVTIER_POOL_PATH=/dev/shm/env.pool"}
	cfg, err = buildConfig(o)
	require.NoError(t, err)
	require.Empty(t, cfg.PoolPath)
}

// TestBadEnvironmentIsABadConfig: a bad value or a mistyped key stops the
// daemon (exit 2, as a bad file does), naming the variable.
func TestBadEnvironmentIsABadConfig(t *testing.T) {
	for env, want := range map[string]string{
		"KVTIER_POOL_BYTES=lots":          "KVTIER_POOL_BYTES",
		"KVTIER_POOL_BYTE=1GiB":           "did you mean KVTIER_POOL_BYTES?",
		"KVTIER_POLICY=fifo":              "policy",
		"KVTIER_EVENTS_REPLAY=tcp://*:58": "needs an endpoint",
	} {
		o := parse(t)
		o.environ = []string{env}
		_, err := buildConfig(o)
		require.ErrorIs(t, err, messages.ErrBadConfig, env)
		require.ErrorContains(t, err, want, env)
	}
	// The flag fixes what the environment got wrong only by overriding it.
	o := parse(t, "--policy", "lru")
	o.environ = []string{"KVTIER_POLICY=fifo"}
	_, err := buildConfig(o)
	require.NoError(t, err)
}

// TestEngineListenResolution: the default address when no source gives
// one, "none" from any source (or an empty flag) for no endpoint.
func TestEngineListenResolution(t *testing.T) {
	t.Setenv(config.EnvAddress, "unix:///srv/kvtier-test/engine.sock")
	p := tempfile.Write(t, "c.yaml", "engine_listen: none\n")
	pq := tempfile.Write(t, "q.yaml", "engine_listen: ipc:///from/file.sock\n")
	for _, tc := range []struct {
		name    string
		args    []string
		environ []string
		want    string
	}{
		{"no source: the default address", nil, nil, "unix:///srv/kvtier-test/engine.sock"},
		{"flag", []string{"--engine-listen", "tcp://127.0.0.1:7000"}, nil, "tcp://127.0.0.1:7000"},
		{"flag none", []string{"--engine-listen", "none"}, nil, ""},
		{"empty flag", []string{"--engine-listen="}, nil, ""},
		{"environment", nil, []string{"KVTIER_ENGINE_LISTEN=ipc:///e.sock"}, "ipc:///e.sock"},
		{"environment none", nil, []string{"KVTIER_ENGINE_LISTEN=none"}, ""},
		{"empty variable: unset", nil, []string{"KVTIER_ENGINE_LISTEN="}, "unix:///srv/kvtier-test/engine.sock"},
		{"file none", []string{"--config", p}, nil, ""},
		{"file", []string{"--config", pq}, nil, "ipc:///from/file.sock"},
		{"environment over file none", []string{"--config", p}, []string{"KVTIER_ENGINE_LISTEN=unix:///e.sock"}, "unix:///e.sock"},
		{"flag over environment", []string{"--engine-listen", "unix:///f.sock"}, []string{"KVTIER_ENGINE_LISTEN=none"}, "unix:///f.sock"},
		{"memfd pool: no engine could map it", []string{"--pool-path="}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := parse(t, tc.args...)
			o.environ = tc.environ
			cfg, err := buildConfig(o)
			require.NoError(t, err)
			require.Equal(t, tc.want, cfg.EngineListen)
		})
	}
}

// TestEnsureSocketDir: the user's socket directory is created private (or
// group-reachable), an existing one of ours is made so, and one that is
// not ours, a symlink or a file is refused.
func TestEnsureSocketDir(t *testing.T) {
	base := t.TempDir()
	mode := func(p string) os.FileMode {
		st, err := os.Stat(p)
		require.NoError(t, err)
		return st.Mode().Perm()
	}

	dir := filepath.Join(base, "kvtier-u")
	require.NoError(t, ensureSocketDir(dir, false, -1))
	require.Equal(t, os.FileMode(0o700), mode(dir))
	require.NoError(t, os.Chmod(dir, 0o777))
	require.NoError(t, ensureSocketDir(dir, false, -1), "an existing one is ours")
	require.Equal(t, os.FileMode(0o700), mode(dir), "and made private again")

	gid := os.Getegid()
	if os.Geteuid() == 0 {
		gid = 65534 // a group the directory is not already in
	}
	require.NoError(t, ensureSocketDir(dir, false, gid))
	require.Equal(t, os.FileMode(0o750), mode(dir), "the engine group may reach the socket")
	st, err := os.Stat(dir)
	require.NoError(t, err)
	require.EqualValues(t, gid, st.Sys().(*syscall.Stat_t).Gid)

	shared := filepath.Join(base, "run-kvtier")
	require.NoError(t, ensureSocketDir(shared, true, -1))
	require.Equal(t, os.FileMode(0o755), mode(shared), "created for every engine's user")
	require.NoError(t, os.Chmod(shared, 0o750))
	require.NoError(t, ensureSocketDir(shared, true, -1))
	require.Equal(t, os.FileMode(0o750), mode(shared), "an existing one is the operator's")

	link := filepath.Join(base, "kvtier-link")
	require.NoError(t, os.Symlink(dir, link))
	require.ErrorIs(t, ensureSocketDir(link, false, -1), messages.ErrBadConfig, "a symlink planted in /tmp")
	file := filepath.Join(base, "kvtier-file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	require.ErrorIs(t, ensureSocketDir(file, false, -1), messages.ErrBadConfig)
	require.Error(t, ensureSocketDir(filepath.Join(base, "missing", "kvtier-u"), false, -1), "the temp dir itself is not created")

	if os.Geteuid() == 0 {
		theirs := filepath.Join(base, "kvtier-theirs")
		require.NoError(t, os.Mkdir(theirs, 0o700))
		require.NoError(t, os.Chmod(theirs, 0o777))
		require.NoError(t, os.Chown(theirs, 65534, 65534))
		err := ensureSocketDir(theirs, false, -1)
		require.ErrorIs(t, err, messages.ErrBadConfig, "another user's directory")
		require.ErrorContains(t, err, "belongs to uid 65534")
		require.Equal(t, os.FileMode(0o777), mode(theirs), "and left alone")
	}
}

// TestLiveSocketStopsTheDaemonStaleOneDoesNot: with real sockets, a live
// listener on the engine address is refused with the operator's message;
// the file a dead listener left is not (the endpoint replaces it).
func TestLiveSocketStopsTheDaemonStaleOneDoesNot(t *testing.T) {
	for _, scheme := range []string{"unix://", "ipc://"} {
		path := filepath.Join(testnet.SocketDir(t), "engine.sock")
		addr := scheme + path
		require.NoError(t, prepareEngineListen(addr, ""), "no file yet")

		ln, err := net.Listen("unix", path)
		require.NoError(t, err)
		ln.(*net.UnixListener).SetUnlinkOnClose(false) // as a killed daemon leaves it
		err = prepareEngineListen(addr, "")
		require.ErrorContains(t, err, "another kvtierd serves "+addr+"; give --engine-listen")

		require.NoError(t, ln.Close())
		_, err = os.Lstat(path)
		require.NoError(t, err, "the stale socket file is still there")
		require.NoError(t, prepareEngineListen(addr, ""), "a stale socket does not stop a restart")
	}
	for _, addr := range []string{"", "tcp://127.0.0.1:0", "unix://"} {
		require.NoError(t, prepareEngineListen(addr, ""), "%q: nothing to prepare", addr)
	}
}

// TestDefaultSocketDirIsCreated: with the default address (no
// KVTIER_ADDRESS), its directory is made before the bind; not as root,
// whose default is /run/kvtier, which tests must leave alone.
func TestDefaultSocketDirIsCreated(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root's default is /run/kvtier (TestEnsureSocketDir covers the directory)")
	}
	tmp := testnet.SocketDir(t)
	t.Setenv("TMPDIR", tmp)
	t.Setenv(config.EnvAddress, "")
	addr := config.DefaultEngineAddress()
	require.True(t, strings.HasPrefix(addr, "unix://"+tmp+"/kvtier-"), addr)
	require.NoError(t, prepareEngineListen(addr, ""))
	st, err := os.Stat(filepath.Dir(strings.TrimPrefix(addr, "unix://")))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
}

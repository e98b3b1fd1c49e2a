package tests

// kvtierd's command line as an operator meets it: long flags, --version,
// KVTIER_<KEY> variables, and the default engine socket with a live or a
// stale daemon behind it.

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/internal/testutil/proclog"
	"github.com/kvtier/kvtier/internal/testutil/tempfile"
	"github.com/kvtier/kvtier/internal/testutil/testnet"
)

// startDaemonEnv is startDaemon with env added to a copy of this process's
// environment in which no KVTIER_ variable and no TMPDIR is set, run as
// the user as says (nil: this process's).
func startDaemonEnv(t *testing.T, bin string, env []string, as *syscall.Credential, args ...string) *daemon {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(cleanEnv(), env...)
	if as != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: as}
	}
	return launchDaemon(t, cmd)
}

// launchDaemon starts cmd, a kvtierd; it is killed at cleanup if the test
// did not stop it.
func launchDaemon(t *testing.T, cmd *exec.Cmd) *daemon {
	t.Helper()
	d := &daemon{cmd: cmd, stderr: proclog.New(), exited: make(chan struct{})}
	d.cmd.Stderr = d.stderr
	d.cmd.WaitDelay = waitDelay
	require.NoError(t, d.cmd.Start())
	go func() {
		d.err = d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-d.exited:
		default:
			_ = d.cmd.Process.Kill()
			awaitClosed(t, d.exited, exitBound, "kvtierd killed at cleanup")
		}
		if t.Failed() {
			t.Logf("kvtierd stderr:\n%s", d.stderr)
		}
	})
	return d
}

func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVTIER_") && !strings.HasPrefix(kv, "TMPDIR=") {
			out = append(out, kv)
		}
	}
	return out
}

// TestDaemonDefaultEngineSocket: given no engine address, kvtierd serves on
// the default one. A second daemon there fails at start naming the address
// and leaves the first serving; once the first is killed (its socket file
// left behind), a third starts on the same address.
func TestDaemonDefaultEngineSocket(t *testing.T) {
	bin := buildDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := testnet.SocketDir(t)
	// The default rule for a user: the directory kvtier-<uid> under
	// $TMPDIR. Root's default is /run/kvtier, which tests leave alone: as
	// root the daemons run as nobody, or, where that cannot be,
	// KVTIER_ADDRESS (the rule's first step) points into dir.
	env := []string{"TMPDIR=" + dir}
	uid, as := os.Geteuid(), (*syscall.Credential)(nil)
	if uid == 0 {
		uid, as, bin = asNobody(t, ctx, bin, dir)
	}
	sock := filepath.Join(dir, "kvtier-"+strconv.Itoa(uid), "engine.sock")
	if uid == 0 {
		sock = filepath.Join(dir, "engine.sock")
		env = append(env, "KVTIER_ADDRESS=unix://"+sock)
	}
	addr := "unix://" + sock
	start := func() *daemon {
		pool := poolPath(t)
		t.Cleanup(func() { _ = os.Remove(pool + ".index") }) // what the killed one leaves
		return startDaemonEnv(t, bin, env, as, "--pool-path", pool, "--pool-bytes", "4MiB", "--block-bytes", "64KiB",
			"--metrics-listen", "127.0.0.1:0", "--log-format", "json")
	}

	first := start()
	rec, err := first.stderr.WaitJSON(ctx, "kvtierd listening")
	require.NoError(t, err)
	require.Equal(t, addr, rec["engine_listen"])
	if uid != 0 {
		st, err := os.Stat(filepath.Dir(sock))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "the user's socket directory is private")
		require.EqualValues(t, uid, st.Sys().(*syscall.Stat_t).Uid, "and the user's")
	}

	second := start()
	exit, err := second.wait(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, exit, "a second daemon on a live socket fails at start")
	rec, err = second.stderr.WaitJSON(ctx, "cannot serve engines")
	require.NoError(t, err)
	require.Contains(t, rec["error"], "another kvtierd serves "+addr+"; give --engine-listen")
	c, err := net.Dial("unix", sock)
	require.NoError(t, err, "the first daemon still serves its socket")
	require.NoError(t, c.Close())

	require.NoError(t, first.cmd.Process.Kill())
	require.True(t, awaitClosed(t, first.exited, exitBound, "killed kvtierd"))
	_, err = os.Lstat(sock)
	require.NoError(t, err, "a killed daemon leaves its socket file")

	third := start()
	rec, err = third.stderr.WaitJSON(ctx, "kvtierd listening")
	require.NoError(t, err, "a stale socket does not stop a restart")
	require.Equal(t, addr, rec["engine_listen"])
	c, err = net.Dial("unix", sock)
	require.NoError(t, err)
	require.NoError(t, c.Close())

	require.NoError(t, third.cmd.Process.Signal(syscall.SIGTERM))
	exit, err = third.wait(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, exit)
	_, err = os.Lstat(sock)
	require.ErrorIs(t, err, os.ErrNotExist, "a clean shutdown removes the socket")
}

// nobody is the uid and gid root's tests run a daemon as.
const nobody = 65534

// asNobody readies bin to run as nobody from dir (opened to it) and returns
// nobody's uid, the credential and the binary's copy there; or, where this
// process cannot run a program as nobody, uid 0, nil and bin unchanged.
func asNobody(t *testing.T, ctx context.Context, bin, dir string) (int, *syscall.Credential, string) {
	t.Helper()
	require.NoError(t, os.Chmod(dir, 0o777))
	data, err := os.ReadFile(bin)
	require.NoError(t, err)
	copied := filepath.Join(dir, "kvtierd")
	require.NoError(t, os.WriteFile(copied, data, 0o755))
	as := &syscall.Credential{Uid: nobody, Gid: nobody}
	cmd := exec.CommandContext(ctx, copied, "--version")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: as}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Logf("cannot run kvtierd as nobody (%v: %s); KVTIER_ADDRESS instead", err, out)
		return 0, nil, bin
	}
	return nobody, as, copied
}

// TestDaemonEnvironment: KVTIER_<KEY> variables override the file and
// flags override them; a mistyped one stops the daemon; /metrics carries
// the build.
func TestDaemonEnvironment(t *testing.T) {
	bin := buildDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	file := tempfile.Write(t, "c.yaml", "pool_bytes: 1GiB\nblock_bytes: 1MiB\npolicy: arc\n")

	d := startDaemonEnv(t, bin, []string{"KVTIER_POOL_BYTES=16MiB", "KVTIER_BLOCK_BYTES=256KiB", "KVTIER_ENGINE_LISTEN=none"}, nil,
		"--config", file, "--block-bytes", "64KiB", "--pool-path", poolPath(t), "--metrics-listen", "127.0.0.1:0", "--log-format", "json")
	rec, err := d.stderr.WaitJSON(ctx, "kvtierd listening")
	require.NoError(t, err)
	require.EqualValues(t, 16<<20, rec["pool_bytes"], "the environment over the file")
	require.EqualValues(t, 64<<10, rec["block_bytes"], "the flag over the environment")
	require.Equal(t, "arc", rec["policy"], "the file where nothing overrides it")
	require.Equal(t, "", rec["engine_listen"], "KVTIER_ENGINE_LISTEN=none: no engine endpoint")

	client := noKeepAlive()
	code, body, err := get(ctx, client, "http://"+rec["metrics_addr"].(string)+"/metrics")
	require.NoError(t, err)
	require.Equal(t, 200, code)
	require.Contains(t, body, `kvtier_build_info{go_version="go`)
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	exit, err := d.wait(ctx)
	require.NoError(t, err)
	require.Equal(t, 0, exit)

	bad := startDaemonEnv(t, bin, []string{"KVTIER_POOL_BYTE=16MiB"}, nil,
		"--pool-path", poolPath(t), "--metrics-listen", "127.0.0.1:0", "--log-format", "json", "--engine-listen", "none")
	exit, err = bad.wait(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, exit, "a mistyped variable is a bad config")
	rec, err = bad.stderr.WaitJSON(ctx, "bad configuration")
	require.NoError(t, err)
	require.Contains(t, rec["error"], "KVTIER_POOL_BYTE: no config key spells it (did you mean KVTIER_POOL_BYTES?)")
}

// TestDaemonCommandLine: --version, --help and a one-dash long flag, as a
// shell runs them.
func TestDaemonCommandLine(t *testing.T) {
	bin := buildDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := func(args ...string) (stdout, stderr string, exit int) {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = cleanEnv()
		cmd.WaitDelay = waitDelay
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil {
			require.ErrorAs(t, err, &ee)
		}
		return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
	}

	out, _, exit := run("--version")
	require.Equal(t, 0, exit)
	require.Regexp(t, `^kvtierd \S+ \(rev \S+, go\S+\)\n$`, out)

	_, errOut, exit := run("--help")
	require.Equal(t, 0, exit)
	require.Contains(t, errOut, "--engine-listen address")
	require.Contains(t, errOut, "--pool-bytes size")

	_, errOut, exit = run("-pool-bytes", "16MiB")
	require.Equal(t, 2, exit, "bad flags exit 2")
	require.Contains(t, errOut, "long flags take two dashes: --pool-bytes, not -pool-bytes")
}

func noKeepAlive() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
}

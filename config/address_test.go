package config

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

func TestDefaultEngineAddressRule(t *testing.T) {
	for _, tc := range []struct {
		env  string
		euid int
		tmp  string
		want string
	}{
		{"tcp://127.0.0.1:7000", 1000, "/tmp", "tcp://127.0.0.1:7000"},
		{"unix:///srv/e.sock", 0, "/tmp", "unix:///srv/e.sock"},
		{"", 0, "/tmp", "unix:///run/kvtier/engine.sock"},
		{"", 1000, "/tmp", "unix:///tmp/kvtier-1000/engine.sock"},
		{"", 1000, "/tmp/", "unix:///tmp/kvtier-1000/engine.sock"},
		{"", 42, "/var//tmp/./x/..", "unix:///var/tmp/kvtier-42/engine.sock"},
	} {
		require.Equal(t, tc.want, defaultEngineAddress(tc.env, tc.euid, tc.tmp), "%+v", tc)
	}
}

func TestDefaultEngineAddressReadsTheProcess(t *testing.T) {
	t.Setenv("TMPDIR", "/tmp/kvtier-test-tmpdir")
	t.Setenv(EnvAddress, "")
	want := "unix:///tmp/kvtier-test-tmpdir/kvtier-" + strconv.Itoa(os.Geteuid()) + "/engine.sock"
	if os.Geteuid() == 0 {
		want = RootEngineAddress
	}
	require.Equal(t, want, DefaultEngineAddress(), "an empty KVTIER_ADDRESS is unset")
	t.Setenv(EnvAddress, "ipc:///x/e.sock")
	require.Equal(t, "ipc:///x/e.sock", DefaultEngineAddress())
}

// TestDefaultEngineAddressMatchesThePythonClient: the Python client's
// default_address gives the daemon's address for the same environment and
// uid (its file is loaded alone: no pyzmq needed).
func TestDefaultEngineAddressMatchesThePythonClient(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	src, err := filepath.Abs(filepath.Join("..", "clients", "python", "kvtier_client", "address.py"))
	require.NoError(t, err)
	if _, err := os.Stat(src); err != nil {
		t.Skipf("no Python client here: %v", err)
	}
	const script = `
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("address", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
os.geteuid = lambda: int(sys.argv[2])
print(m.default_address())
`
	for _, tc := range []struct {
		env, tmp string
		euid     int
	}{
		{"", "/tmp", 1000}, {"", "/tmp/", 1000}, {"", "/var//tmp/x/..", 7}, {"", "", 1000},
		{"", "/tmp", 0}, {"unix:///srv/e.sock", "/tmp", 1000},
	} {
		cmd := exec.Command(py, "-c", script, src, strconv.Itoa(tc.euid))
		cmd.Env = append(os.Environ(), "TMPDIR="+tc.tmp, EnvAddress+"="+tc.env)
		out, err := cmd.Output()
		require.NoError(t, err, "%+v", tc)
		tmp := tc.tmp
		if tmp == "" {
			tmp = "/tmp" // os.TempDir's rule
		}
		require.Equal(t, defaultEngineAddress(tc.env, tc.euid, tmp), strings.TrimSpace(string(out)), "%+v", tc)
	}
}

func TestEngineGroupID(t *testing.T) {
	gid, err := EngineGroupID("")
	require.NoError(t, err)
	require.Equal(t, -1, gid)
	gid, err = EngineGroupID("1234")
	require.NoError(t, err)
	require.Equal(t, 1234, gid)
	gid, err = EngineGroupID("root")
	require.NoError(t, err)
	require.Equal(t, 0, gid, "a name resolves to its gid")
	_, err = EngineGroupID("no-such-group-kvtier")
	require.ErrorIs(t, err, messages.ErrBadConfig)
}

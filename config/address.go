package config

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"

	"github.com/kvtier/kvtier/messages"
)

// Where kvtierd serves engines when nobody says, and where an engine looks
// when given no address: one rule, kept the same on both sides (Python:
// clients/python/kvtier_client/address.py).

// EnvAddress names the environment variable that overrides the default
// engine address, for kvtierd and its engines alike. It is reserved: FromEnv
// does not read it as a config key.
const EnvAddress = "KVTIER_ADDRESS"

// RootEngineAddress is the default engine address of a daemon running as
// root (kvtierd creates /run/kvtier, mode 0755).
const RootEngineAddress = "unix:///run/kvtier/engine.sock"

// DefaultEngineAddress is where kvtierd serves engines when no
// engine_listen is given (flag, KVTIER_ENGINE_LISTEN or config file), and
// where a client given no address dials. The rule, exactly:
//
//  1. $KVTIER_ADDRESS when it is set and not empty, verbatim (any address
//     engine_listen takes: unix://, ipc:// or tcp://);
//  2. else, when the effective uid is 0, "unix:///run/kvtier/engine.sock";
//  3. else "unix://" + filepath.Join(os.TempDir(), "kvtier-<euid>",
//     "engine.sock"), with <euid> the effective uid in decimal and
//     os.TempDir() $TMPDIR, or "/tmp" when $TMPDIR is unset or empty;
//     filepath.Join cleans the path (repeated and trailing slashes, "."
//     and ".." elements), e.g. TMPDIR=/tmp/ and euid 1000 give
//     "unix:///tmp/kvtier-1000/engine.sock".
//
// It reads the environment and the process's credentials; it creates
// nothing (kvtierd creates the directory of rules 2 and 3).
func DefaultEngineAddress() string {
	return defaultEngineAddress(os.Getenv(EnvAddress), os.Geteuid(), os.TempDir())
}

// defaultEngineAddress is DefaultEngineAddress's rule over its inputs.
func defaultEngineAddress(env string, euid int, tmp string) string {
	switch {
	case env != "":
		return env
	case euid == 0:
		return RootEngineAddress
	}
	return "unix://" + filepath.Join(tmp, "kvtier-"+strconv.Itoa(euid), "engine.sock")
}

// EngineGroupID resolves engine_group, a group name or a numeric gid, to
// the gid given the engine socket, its directory and the pool file; -1 for
// none ("").
func EngineGroupID(group string) (int, error) {
	if group == "" {
		return -1, nil
	}
	if gid, err := strconv.Atoi(group); err == nil {
		return gid, nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, fmt.Errorf("%w: engine_group %q: %w", messages.ErrBadConfig, group, err)
	}
	return strconv.Atoi(g.Gid)
}

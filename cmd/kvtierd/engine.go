package main

// The engine endpoint's socket file, before Open binds it: the directory
// of the default address, and a clear refusal when a live daemon already
// serves the socket. (Open's endpoint replaces a stale socket file, one no
// process accepts on, and refuses a live one too: this is the operator's
// message for it, and it keeps the check whatever the endpoint's wording.)

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/messages"
)

// probeTimeout bounds the connect that asks whether a socket is live.
const probeTimeout = 2 * time.Second

// prepareEngineListen readies addr, the engine address the node will bind
// ("" for none), for an engine group (engine_group; "" for none).
func prepareEngineListen(addr, group string) error {
	path, ok := socketPath(addr)
	if !ok {
		return nil
	}
	if os.Getenv(config.EnvAddress) == "" && addr == config.DefaultEngineAddress() {
		gid, err := config.EngineGroupID(group)
		if err != nil {
			return err
		}
		if err := ensureSocketDir(filepath.Dir(path), os.Geteuid() == 0, gid); err != nil {
			return err
		}
	}
	if socketLive(path) {
		return fmt.Errorf("another kvtierd serves %s; give --engine-listen another address (or --engine-listen=none for no engine endpoint)", addr)
	}
	return nil
}

// socketPath is the file of a unix:// or ipc:// address.
func socketPath(addr string) (string, bool) {
	for _, scheme := range []string{"unix://", "ipc://"} {
		if p, ok := strings.CutPrefix(addr, scheme); ok && p != "" {
			return p, true
		}
	}
	return "", false
}

// socketLive reports whether a process accepts connections on the socket
// file at path. A stale file (its daemon killed) refuses them; no file, or
// one that is no socket, is not live either (Open reports the latter).
func socketLive(path string) bool {
	c, err := net.DialTimeout("unix", path, probeTimeout)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// ensureSocketDir creates dir, the default socket's directory, if missing.
// shared: root's /run/kvtier, mode 0755 when created (an existing one is
// the operator's: left as it is). Otherwise the user's own directory under
// the world-writable temp dir: it must be a real directory this user owns
// (not a symlink, not someone else's planted ahead), and is made mode 0700,
// or 0750 in group gid (>= 0) so the engine group can reach the socket.
func ensureSocketDir(dir string, shared bool, gid int) error {
	mode := os.FileMode(0o700)
	switch {
	case shared:
		mode = 0o755
	case gid >= 0:
		mode = 0o750
	}
	err := os.Mkdir(dir, mode)
	created := err == nil
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("engine socket directory: %w", err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("engine socket directory: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("%w: engine socket directory %s is not a directory; give --engine-listen", messages.ErrBadConfig, dir)
	}
	if shared && !created {
		return nil
	}
	if !shared {
		if uid := ownerOf(st); uid != os.Geteuid() {
			return fmt.Errorf("%w: engine socket directory %s belongs to uid %d, not this user (%d); give --engine-listen",
				messages.ErrBadConfig, dir, uid, os.Geteuid())
		}
		if gid >= 0 {
			if err := os.Chown(dir, -1, gid); err != nil {
				return fmt.Errorf("engine socket directory: %w", err)
			}
		}
	}
	// NB: Mkdir's mode went through the umask; this one does not.
	if err := os.Chmod(dir, mode); err != nil {
		return fmt.Errorf("engine socket directory: %w", err)
	}
	return nil
}

// ownerOf is the uid owning the file st describes (-1 if unknown).
func ownerOf(st os.FileInfo) int {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(sys.Uid)
	}
	return -1
}

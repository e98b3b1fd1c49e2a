// Package version is what a kvtier binary says it is: the release set at
// link time (-ldflags "-X github.com/kvtier/kvtier/internal/version.Release=v…",
// as scripts/wheel.sh builds them), else the module version and VCS
// revision Go recorded in the binary. It owns nothing else and imports no
// other kvtier package.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Release is the release name set at link time; empty in a plain go build.
var Release string

// Info is a binary's build identity (also the labels of /metrics'
// kvtier_build_info gauge).
type Info struct {
	Version   string // Release, else the module version ("(devel)" from a work tree)
	Revision  string // VCS revision the binary was built from, "" if unknown
	Modified  bool   // the work tree had uncommitted changes
	GoVersion string // the Go toolchain that built it
}

// Get reads the running binary's build identity.
func Get() Info {
	info := Info{Version: Release, GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info.orUnknown()
	}
	if info.Version == "" {
		info.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info.orUnknown()
}

func (i Info) orUnknown() Info {
	if i.Version == "" {
		i.Version = "unknown"
	}
	return i
}

// String is the one line --version prints, e.g.
// "v0.4.0 (rev 0123abcd4567, go1.26.8)".
func (i Info) String() string {
	rev := i.Revision
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev == "" {
		rev = "unknown"
	}
	if i.Modified {
		rev += "+dirty"
	}
	return fmt.Sprintf("%s (rev %s, %s)", i.Version, rev, i.GoVersion)
}

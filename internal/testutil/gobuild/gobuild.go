// Package gobuild compiles this module's commands for the tests that run
// them as real processes (kvtierd, the kvtier CLI): the one place that
// knows how to call the go tool for a test, bounded in time and safe from
// the compiler's children holding its output open. It owns the binaries
// it writes only until the test's temporary directory is removed.
package gobuild

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Bounds on a build: no test may hang on the go tool until the test
// binary's timeout.
const (
	// buildTimeout bounds one go build (a cold cache builds the module).
	buildTimeout = 5 * time.Minute
	// waitDelay is exec.Cmd.WaitDelay: once go is gone, Wait gives up on
	// the output pipe a grandchild (the compiler's) may still hold.
	waitDelay = 5 * time.Second
)

// Command compiles the command pkg, with the build tags given, to a binary
// called name in a temporary directory of t's, and returns its path; a
// failed build fails t with the go tool's output.
func Command(t testing.TB, pkg, name string, tags ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	bin := filepath.Join(t.TempDir(), name)
	build := []string{"build"}
	if len(tags) > 0 {
		build = append(build, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.CommandContext(ctx, "go", append(build, "-o", bin, pkg)...)
	cmd.WaitDelay = waitDelay
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go %s %s:\n%s", strings.Join(build, " "), name, out)
	return bin
}

// Package tempfile writes the small files a test hands a program by path
// (a config file, a secret, a file where a directory is expected): each in
// a fresh temporary directory of the test's, removed when it ends, so no
// two tests or subtests share one. It owns nothing past the test.
package tempfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Write writes body to a file called name in a new temporary directory of
// t's, readable by its owner only (configs and secrets), and returns its
// path; a failed write fails t.
func Write(t testing.TB, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

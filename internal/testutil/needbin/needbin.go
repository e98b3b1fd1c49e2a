// Package needbin owns what the test helpers that run a server binary
// (testetcd's etcd, objtest's versitygw) share: TB, the part of testing.TB
// they use, and the rule for a test whose binary is missing or whose
// server cannot start: skipped, or failed when CI is "true" (CI must run
// those tests). It imports no testing package, so the shipped binaries
// that link those helpers (cmd/kvtier's bench) stay free of it.
package needbin

import "os"

// TB is the part of testing.TB the server helpers use: a test passes its
// *testing.T.
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// Need returns the binary find finds; when find fails, Unavailable ends
// the test.
func Need(t TB, find func() (string, error)) string {
	t.Helper()
	bin, err := find()
	if err != nil {
		Unavailable(t, err)
	}
	return bin
}

// Unavailable ends a test that cannot have its server because of err:
// skipped, or failed when CI is "true".
func Unavailable(t TB, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %v", err)
	}
	t.Skipf("skipping: %v", err)
}

package objtest

import (
	"context"
	"os"
	"testing"
	"time"
)

// Start launches a server over a temporary directory with bucket created,
// stopped when the test ends. Without the binary the test is skipped, or
// fails when CI is "true": CI must run these tests.
func Start(t testing.TB, bucket string) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and %v", err)
		}
		t.Skipf("skipping: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Launch(ctx, bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	if err := s.MakeBucket(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	return s
}

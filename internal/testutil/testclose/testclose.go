// Package testclose closes what a test opened (a node, a publisher) when
// the test ends, within a bound, and fails the test if the close fails: a
// test helper that opens something hands it back already scheduled to be
// closed, and no close may hang the test binary or hide an error. It owns
// nothing but the cleanup it registers.
package testclose

import (
	"context"
	"testing"
	"time"
)

// AtCleanup registers close to run when t ends, with a context that ends
// after within; an error from close fails t.
func AtCleanup(t testing.TB, within time.Duration, close func(context.Context) error) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		if err := close(ctx); err != nil {
			t.Errorf("close at the test's end: %v", err)
		}
	})
}

package testclose

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// recorder is the part of testing.TB AtCleanup uses, recording instead of
// failing, so a failing close can be checked without failing this test.
type recorder struct {
	testing.TB
	cleanups []func()
	errs     []string
}

func (r *recorder) Helper()          {}
func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

func TestAtCleanupClosesAtTheEndWithABoundedContext(t *testing.T) {
	r := &recorder{}
	var closed bool
	AtCleanup(r, time.Minute, func(ctx context.Context) error {
		deadline, ok := ctx.Deadline()
		require.True(t, ok, "the close is bounded")
		require.WithinDuration(t, time.Now().Add(time.Minute), deadline, 10*time.Second)
		closed = true
		return nil
	})
	require.False(t, closed, "nothing closes before the test ends")
	r.end()
	require.True(t, closed)
	require.Empty(t, r.errs)
}

func TestAtCleanupFailsTheTestWhenCloseFails(t *testing.T) {
	r := &recorder{}
	AtCleanup(r, time.Second, func(context.Context) error { return errors.New("stuck") })
	r.end()
	require.Len(t, r.errs, 1)
	require.Contains(t, r.errs[0], "stuck", "the close's error is reported")
}

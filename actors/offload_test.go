package actors

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Close waits for running work, refuses new work, and is bounded by ctx
// while work is stuck.
func TestOffloadCloseWaitsForRunningWork(t *testing.T) {
	var o Offload
	release := make(chan struct{})
	started := make(chan struct{})
	var finished atomic.Bool
	require.True(t, o.Go(func() { close(started); <-release; finished.Store(true) }))
	<-started

	stuck, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, o.Close(stuck), context.DeadlineExceeded, "work still running: Close says so")
	require.False(t, o.Go(func() { t.Error("work started after Close") }))

	closed := make(chan error, 1)
	go func() { closed <- o.Close(context.Background()) }()
	close(release)
	require.NoError(t, <-closed)
	require.True(t, finished.Load(), "Close returned only after the work did")
	require.NoError(t, o.Close(context.Background()), "idempotent")
}

func TestOffloadNilRunsUntracked(t *testing.T) {
	var o *Offload
	done := make(chan struct{})
	require.True(t, o.Go(func() { close(done) }))
	<-done
}

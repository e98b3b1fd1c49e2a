package gopool

import (
	"context"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hold hands p a closure that blocks until release is closed, retrying
// until a goroutine or the queue takes it, and returns once it is taken.
func hold(p *Pool, release <-chan struct{}) {
	for !p.TryRun(func() { <-release }) {
		runtime.Gosched()
	}
}

func TestPoolRunsAtMostNAndQueuesAtMostQueue(t *testing.T) {
	p := New(2, 1)
	release := make(chan struct{})
	running := make(chan struct{}, 2)
	for range 2 {
		for !p.TryRun(func() { running <- struct{}{}; <-release }) {
			runtime.Gosched()
		}
	}
	<-running
	<-running // both goroutines busy
	require.True(t, p.TryRun(func() {}), "the queue takes one")
	assert.Equal(t, 1, p.Queued())
	assert.False(t, p.TryRun(func() { t.Error("ran past the bound") }), "both busy and the queue full")
	close(release)
	require.NoError(t, p.Stop(context.Background()))
	assert.Zero(t, p.Queued())
}

func TestStopWaitsForARunningClosureUntilItsDeadline(t *testing.T) {
	p := New(1, 0)
	release := make(chan struct{})
	hold(p, release)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, p.Stop(ctx), context.Canceled, "a closure still runs")
	close(release)
	require.NoError(t, p.Stop(context.Background()))
	require.NoError(t, p.Stop(context.Background()), "idempotent")
	assert.False(t, p.TryRun(func() {}), "no goroutine left to take it")
}

func TestStopDropsQueuedClosures(t *testing.T) {
	p := New(1, 4)
	release := make(chan struct{})
	hold(p, release)
	for len(p.work) != 0 {
		runtime.Gosched() // NB: until the one goroutine took the holder
	}
	for range 4 {
		require.True(t, p.TryRun(func() { t.Error("a queued closure ran after Stop") }))
	}
	stopped := make(chan error)
	go func() { stopped <- p.Stop(context.Background()) }()
	for {
		select {
		case <-p.stop: // NB: stop is closed, and the goroutine is still held
		default:
			runtime.Gosched()
			continue
		}
		break
	}
	close(release)
	require.NoError(t, <-stopped)
	assert.Zero(t, p.Queued())
}

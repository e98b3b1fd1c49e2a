package schedbatch

import (
	"errors"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// By default (KVTIERD_SCHED unset, or batch) every thread of the process
// is under SCHED_BATCH once Apply returns, and a thread started afterwards
// inherits it; "normal" leaves the policy alone and a bad value is an
// error.
func TestApplyMovesEveryThreadAndNewOnesInheritIt(t *testing.T) {
	t.Setenv(Env, "bogus")
	_, err := Apply()
	require.Error(t, err)

	t.Setenv(Env, "normal")
	got, err := Apply()
	require.NoError(t, err)
	require.Equal(t, "normal", got)

	for _, v := range []string{"batch", ""} {
		t.Setenv(Env, v)
		got, err := Apply()
		if errors.Is(err, unix.EPERM) {
			t.Skip("sched_setattr is not permitted here (a seccomp profile):", err)
		}
		require.NoError(t, err)
		require.Equal(t, "batch", got)
		requireAllBatch(t)
	}

	// A thread the runtime starts now (a goroutine locked to its own
	// thread while others are locked too) is cloned from a moved one.
	const n = 4
	started, release := make(chan int, n), make(chan struct{})
	for range n {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			started <- unix.Gettid()
			<-release
		}()
	}
	for range n {
		tid := <-started
		p, err := Policy(tid)
		require.NoError(t, err)
		require.Equal(t, uint32(unix.SCHED_BATCH), p, "thread %d", tid)
	}
	close(release)
	requireAllBatch(t)
}

func requireAllBatch(t *testing.T) {
	t.Helper()
	tids, err := Threads()
	require.NoError(t, err)
	for _, tid := range tids {
		p, err := Policy(tid)
		if err != nil {
			continue // exited meanwhile
		}
		require.Equal(t, uint32(unix.SCHED_BATCH), p, "thread %d", tid)
	}
}

package tests

// Lifecycle across real processes (seed 002): a kvtierd that is paused
// keeps serving a peer daemon that fetches from it continuously, and shuts
// down on SIGTERM with that peer still fetching; a kvtierd whose peer is
// frozen mid-fetch (SIGSTOP) still shuts down within its bound. Behaviour
// is asserted, never a duration: "within its bound" is the process exiting
// before a liveness limit far beyond its --shutdown-timeout.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/internal/testutil/testloop"
	"github.com/kvtier/kvtier/messages"
)

// peerFetchLoop fetches keys from a daemon's peers through its engine over
// and over, verifying every byte and clearing the daemon's primary tier
// between rounds so each round goes to a peer.
type peerFetchLoop struct {
	*testloop.Loop
	verified, missed atomic.Int64
}

func startPeerFetchLoop(t *testing.T, ctx context.Context, p *peerDaemon, ks []messages.Key) *peerFetchLoop {
	t.Helper()
	l := &peerFetchLoop{}
	l.Loop = testloop.Start(t, func(n int, stopping <-chan struct{}) error { return l.round(ctx, p, n, ks, stopping) })
	return l
}

func (l *peerFetchLoop) round(ctx context.Context, p *peerDaemon, n int, ks []messages.Key, stopping <-chan struct{}) error {
	req := &messages.ReqContext{RequestID: fmt.Sprintf("loop-%d", n)}
	defer p.eng.RequestFinished(ctx, req) //nolint:errcheck // checked by requireQuiet
	var st []messages.LookupStatus
	for {
		var err error
		if st, err = p.eng.Lookup(ctx, req, ks, false); err != nil {
			return err
		}
		if !anyStatus(st, messages.Retry, messages.HitPending) {
			break
		}
		select {
		case <-stopping:
			return nil
		default:
		}
	}
	if anyStatus(st, messages.Miss) {
		l.missed.Add(1)
		return p.eng.ResetCache(ctx)
	}
	job, err := p.eng.PrepareLoad(ctx, req, ks)
	if err != nil {
		return err
	}
	want := make([]byte, len(p.eng.Pool().Slot(0)))
	for i, k := range ks {
		fillBlock(want, k)
		if !bytes.Equal(want, p.eng.Pool().Slot(job.Slots[i])) {
			return errors.New("a block fetched from a peer differs from what was stored")
		}
	}
	if err := p.eng.CompleteLoad(ctx, req, ks); err != nil {
		return err
	}
	l.verified.Add(1)
	return p.eng.ResetCache(ctx)
}

// terminate sends SIGTERM and requires a clean exit (0) before the
// liveness bound.
func (d *daemon) terminate(t *testing.T, what string) {
	t.Helper()
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	require.True(t, awaitClosed(t, d.exited, exitBound, what+" after SIGTERM"), "stderr:\n%s", d.stderr)
	require.Equal(t, 0, d.cmd.ProcessState.ExitCode(), "%s exits cleanly; stderr:\n%s", what, d.stderr)
	if rec, err := d.stderr.WaitJSON(context.Background(), "node closed"); err == nil {
		t.Logf("%s: shutdown took %.3f s", what, rec["shutdown_seconds"])
	}
}

func TestLifecyclePausedDaemonServesPeersAndShutsDownUnderLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := buildDaemon(t)
	a := startPeerDaemon(t, ctx, bin, "a", "--shutdown-timeout", "5s")
	b := startPeerDaemon(t, ctx, bin, "b", "--peer", "a="+a.peer)
	b.waitPeerReady(t, ctx, "a")
	ks := peerKeys(0, 32)
	a.storeBlocks(t, ctx, ks)

	loop := startPeerFetchLoop(t, ctx, b, ks)
	loop.Await(t, ctx, &loop.verified, 2, "verified round")

	require.NoError(t, a.eng.Pause(ctx, false))
	has, err := a.eng.HasPendingWork(ctx)
	require.NoError(t, err)
	require.False(t, has, "serving a peer is not engine work")
	loop.Await(t, ctx, &loop.verified, 3, "round verified while the producer is paused")
	st, err := a.eng.Lookup(ctx, &messages.ReqContext{RequestID: "own"}, ks[:1], false)
	require.NoError(t, err)
	require.Equal(t, messages.Miss, st[0], "the paused producer's own engine gets MISS")
	require.NoError(t, a.eng.Resume(ctx))
	loop.Await(t, ctx, &loop.verified, 1, "verified round after resume")

	pool := a.cmd.Args[2] // --pool-path's value
	a.terminate(t, "producer under peer load")
	_, err = a.stderr.WaitJSON(ctx, "kvtier peers drained")
	require.NoError(t, err)
	_, err = os.Stat(pool)
	require.ErrorIs(t, err, os.ErrNotExist, "the producer removed its pool")

	loop.Await(t, ctx, &loop.missed, 2, "round that recomputes once the producer is gone")
	require.NoError(t, loop.Halt())
	b.requireQuiet(t, ctx)
	b.terminate(t, "consumer")
}

func TestLifecycleDaemonShutsDownWithAStoppedPeer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := buildDaemon(t)
	a := startPeerDaemon(t, ctx, bin, "a")
	b := startPeerDaemon(t, ctx, bin, "b", "--peer", "a="+a.peer, "--shutdown-timeout", "3s")
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	b.waitPeerReady(t, ctx, "a")
	ks := peerKeys(0, 32)
	a.storeBlocks(t, ctx, ks)

	loop := startPeerFetchLoop(t, ctx, b, ks)
	loop.Await(t, ctx, &loop.verified, 2, "verified round")
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP)) // frozen mid-fetch: sockets open, nobody answers
	loop.Await(t, ctx, &loop.missed, 3, "round that gave up on the frozen producer")

	b.terminate(t, "consumer of a frozen peer")
	require.ErrorIs(t, loop.Halt(), messages.ErrClosed, "the engine learns the node closed")

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	a.terminate(t, "producer after SIGCONT")
}

package kvtier_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/internal/testutil/testloop"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/client"
	"github.com/kvtier/kvtier/supervision"
)

func sessionKeys(ids ...int) []messages.Key {
	out := make([]messages.Key, len(ids))
	for i, id := range ids {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(id))
		out[i] = messages.Key{Namespace: "ns", Hash: string(b[:])}
	}
	return out
}

// A session that falls silent is released when its grace period passes on
// the engine clock — leases, pins, pending writes and jobs — and one that
// keeps talking is not. The grace timer is driven by a manual clock: no
// sleeping, no wall-clock assertion.
func TestSilentSessionIsReleasedAtItsGrace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	engineClock := supervision.NewManualClock(time.Unix(1_700_000_000, 0))
	node := openStandalone(t, ctx, engineClock)
	local := node.Manager()

	c, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: "doomed"})
	require.NoError(t, err)
	defer c.Close(ctx) //nolint:errcheck // its session is gone: Bye answers NO_SESSION
	w := &messages.ReqContext{RequestID: "w"}
	plan, err := c.PrepareStore(ctx, w, sessionKeys(1, 2))
	require.NoError(t, err)
	require.NoError(t, c.JobDone(ctx, plan.Job, 0, true))
	r := &messages.ReqContext{RequestID: "r"}
	st, err := c.Lookup(ctx, r, sessionKeys(1, 2), true)
	require.NoError(t, err)
	require.Equal(t, []messages.LookupStatus{messages.Hit, messages.Hit}, st)
	load, err := c.PrepareLoad(ctx, r, sessionKeys(1))
	require.NoError(t, err)
	_, err = c.PrepareStore(ctx, w, sessionKeys(3))
	require.NoError(t, err)
	s, err := local.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{1, 1, 1, 2}, []int{s.Pinned, s.Leased, s.WritePending, s.JobsInFlight})

	engineClock.Advance(10*time.Second - time.Nanosecond)
	require.NoError(t, c.Ping(ctx), "alive one tick before its grace")
	engineClock.Advance(10 * time.Second) // the ping above was at the same engine time: silent for 10 s now
	// Readiness: the release is asynchronous. NB: one Stats snapshot may
	// show the bridge's jobs gone with the CPU tier's holds not yet (the
	// bridge reads its own counters when the tier's answer arrives), so wait
	// for all of them.
	for s.JobsInFlight+s.Pinned+s.Leased+s.WritePending > 0 {
		s, err = local.Stats(ctx)
		require.NoError(t, err)
		require.NoError(t, ctx.Err())
	}
	require.Equal(t, []int{0, 0, 0, 0}, []int{s.Pinned, s.Leased, s.WritePending, s.Requests}, "%+v", s)
	require.Equal(t, uint64(1), s.JobsReapedLoad)
	require.Equal(t, uint64(1), s.JobsReapedStore)
	require.ErrorIs(t, c.Ping(ctx), messages.ErrNoSession)
	require.ErrorIs(t, c.JobDone(ctx, load.ID, 0, true), messages.ErrNoSession)
	// NB: the release is counted when the bridge's answer reaches the
	// endpoint actor, which may be after the holds are gone and the session
	// refuses calls: wait for it.
	testloop.Poll(t, "the release counted", 30*time.Second, func() bool {
		n, err := testutil.GatherAndCount(node.Registry(), "kvtier_engine_sessions_released_total")
		require.NoError(t, err)
		require.LessOrEqual(t, n, 1, "one session released, once")
		return n == 1
	})

	// A reconnecting engine starts clean and finds the committed blocks.
	again, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: "again"})
	require.NoError(t, err)
	st, err = again.Lookup(ctx, r, sessionKeys(1, 2, 3), true)
	require.NoError(t, err)
	require.Equal(t, []messages.LookupStatus{messages.Hit, messages.Hit, messages.Miss}, st)
	require.NoError(t, again.RequestFinished(ctx, r))
	require.NoError(t, again.Close(ctx))
}

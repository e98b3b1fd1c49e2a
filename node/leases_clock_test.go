package node

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
)

// Leases are measured on the node clock's monotonic time, never on its wall
// time: a wall clock stepped by NTP (the chaos harness's clock-jump fault)
// must neither end a HIT's lease early nor keep it past its TTL. Both
// tests failed while the CPU tier's leases expired against Clock.Now.

// openJumping opens a node of slots slots whose clock's Now can be stepped.
func openJumping(t *testing.T, slots int) (*harness, *supervision.JumpClock) {
	var jc *supervision.JumpClock
	h := open(t, slots, func(c *config.Config) {
		c.LeaseTTL = time.Second
		jc = supervision.NewJumpClock(c.Clock)
		c.Clock = jc
	})
	return h, jc
}

func TestLeaseOutlivesAForwardClockStep(t *testing.T) {
	h, jc := openJumping(t, 4)
	h.store(&messages.ReqContext{RequestID: "w"}, 1, 2, 3, 4)
	reader := &messages.ReqContext{RequestID: "r"}
	require.Equal(t, messages.Hit, h.lookupUntilSettled(reader, keys(1))[0])

	jc.Jump(time.Hour) // no time passed: the lease has its whole TTL left

	plan, err := h.m.PrepareStore(h.ctx, &messages.ReqContext{RequestID: "w2"}, keys(5, 6, 7))
	require.NoError(t, err)
	require.ElementsMatch(t, keys(2, 3, 4), plan.Evicted, "the leased HIT is not evicted")
	require.NoError(t, h.m.JobDone(h.ctx, plan.Job, 0, true))
	job, err := h.m.PrepareLoad(h.ctx, reader, keys(1))
	require.NoError(t, err, "a leased HIT loads however the wall clock stepped")
	require.NoError(t, h.m.JobDone(h.ctx, job.ID, 0, true))
	require.Zero(t, h.stats().LeasesExpired)
}

func TestLeaseEndsAtItsTTLAfterABackwardClockStep(t *testing.T) {
	h, jc := openJumping(t, 2)
	h.store(&messages.ReqContext{RequestID: "w"}, 1)
	reader := &messages.ReqContext{RequestID: "r"}
	require.Equal(t, messages.Hit, h.lookupUntilSettled(reader, keys(1))[0])
	require.Equal(t, 1, h.stats().Leased)

	jc.Jump(-time.Hour)
	h.clock.Advance(time.Second) // the TTL, on the monotonic clock

	s := h.stats()
	require.Zero(t, s.Leased, "the lease ends at its TTL, not an hour later")
	require.Equal(t, uint64(1), s.LeasesExpired)
}

package supervision

import (
	"sync/atomic"
	"time"
)

// JumpClock is a Clock whose wall time can be stepped forward or backward at
// any moment, as NTP steps a machine's clock, while its monotonic time
// (Elapsed) and its timers keep running on the inner clock, as Go's runtime
// timers keep running on the monotonic clock. The chaos harness's
// clock-jump fault installs one per node: nothing a node keeps as a lease
// or deadline may depend on Now.
//
// NB: the step shows in every reading of Now, comparisons between readings
// included. That is stricter than Go's runtime, where a time.Now() reading
// carries a monotonic clock reading that hides a step from comparisons
// (but not from UnixNano, Round(0), a serialised time or another process):
// code that is immune here is immune there.
type JumpClock struct {
	inner  Clock
	offset atomic.Int64 // nanoseconds added to the inner clock's Now
}

// NewJumpClock wraps inner (nil: the real clock) with no offset.
func NewJumpClock(inner Clock) *JumpClock {
	if inner == nil {
		inner = RealClock{}
	}
	return &JumpClock{inner: inner}
}

// Now is the inner clock's Now plus every step so far.
func (c *JumpClock) Now() time.Time {
	return c.inner.Now().Add(time.Duration(c.offset.Load()))
}

// Elapsed is the inner clock's: steps never move it.
func (c *JumpClock) Elapsed() time.Duration { return c.inner.Elapsed() }

// AfterFunc arms a timer on the inner clock: it fires after d of monotonic
// time, however Now steps meanwhile.
func (c *JumpClock) AfterFunc(d time.Duration, f func()) Timer { return c.inner.AfterFunc(d, f) }

// Jump steps Now by d (negative: backward) and returns the offset from the
// inner clock's Now after the step. Safe for concurrent use.
func (c *JumpClock) Jump(d time.Duration) time.Duration {
	return time.Duration(c.offset.Add(int64(d)))
}

// Offset is how far Now is from the inner clock's Now.
func (c *JumpClock) Offset() time.Duration { return time.Duration(c.offset.Load()) }

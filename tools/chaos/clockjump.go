package chaos

import (
	"time"

	"github.com/kvtier/kvtier/supervision"
)

// Clock jumps: every node runs on a supervision.JumpClock (Config.Clock:
// its leases, job and drain deadlines, restart windows, negative-cache and
// retry budgets read it), kept across its incarnations as a machine's
// clock would be. Every clockJumpTick the plan may step a node's wall time
// by ±(1 s .. clockJumpMax), as NTP steps a machine's clock; its timers
// and its monotonic time run on.
//
// NB: the harness is not fooled by a step: its own times — when a call
// was sent, when a lease was taken, when a fault was injected, the quiet
// deadline — are read from time.Now, never from a node's clock.

const (
	clockJumpTick = 250 * time.Millisecond
	clockJumpMin  = time.Second
	clockJumpMax  = 30 * time.Second
)

// jumpOf is the step a clock-jump decision makes: its Arg's low bit picks
// the direction, the rest the size.
func jumpOf(arg uint64) time.Duration {
	d := clockJumpMin + time.Duration((arg>>1)%uint64(clockJumpMax-clockJumpMin+1))
	if arg&1 == 1 {
		return -d
	}
	return d
}

// startClockJumps steps the nodes' wall clocks whenever the plan says so
// (one decision per node per clockJumpTick); the returned func stops it.
// The steps stay: a node's clock is not set back when the run drains.
func startClockJumps(rs *runState, nodes []*nodeUnderTest) (stop func()) {
	if !rs.gate.enabled[supervision.FaultClockJump] {
		return func() {}
	}
	return everyTick(clockJumpTick, func(<-chan struct{}) bool {
		for _, n := range nodes {
			if d := rs.gate.decide("clock "+n.name, supervision.FaultClockJump); !d.None() {
				n.clock.Jump(jumpOf(d.Arg))
			}
		}
		return true
	})
}

package peer

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/peer/wire"
)

// readyOutbound is an outbound core through its handshake.
func readyOutbound(t *testing.T) (*outbound, uint64) {
	o := &outbound{}
	gen := o.begin(7, &wire.Hello{Epoch: 7})
	require.True(t, o.linkUp(gen))
	require.True(t, o.welcomed())
	require.True(t, o.ready())
	return o, gen
}

// The handshake moves one way, one step per expected frame: a frame or a
// link event out of turn, or of a replaced link, changes nothing.
func TestOutboundHandshakeStepsInOrder(t *testing.T) {
	o := &outbound{}
	require.Equal(t, outTimerDial, o.timerFired(0), "an idle session dials when its timer fires")
	gen := o.begin(7, &wire.Hello{Epoch: 7})
	require.Equal(t, outDialing, o.phase)
	require.False(t, o.ready(), "Ready before the Welcome")
	require.False(t, o.welcomed(), "Welcome before the Hello went out")
	require.False(t, o.linkUp(gen-1), "a replaced link came up")
	require.True(t, o.linkUp(gen))
	require.False(t, o.linkUp(gen), "the Hello goes out once")
	require.Equal(t, outTimerHandshakeTimeout, o.timerFired(gen))
	require.Equal(t, outTimerStale, o.timerFired(gen-1))
	require.True(t, o.welcomed())
	require.False(t, o.welcomed(), "a second Welcome")
	require.Equal(t, outTimerHandshakeTimeout, o.timerFired(gen))
	o.backoff = time.Second
	require.True(t, o.ready())
	require.False(t, o.ready(), "a second Ready")
	require.Zero(t, o.backoff, "a ready session's next loss starts the back-off over")
	require.Equal(t, outTimerStale, o.timerFired(gen), "nothing to time once ready")

	wasReady, _ := o.lost(false, time.Millisecond, time.Second)
	require.True(t, wasReady)
	require.Equal(t, outTimerStale, o.timerFired(gen), "the lost link's timers are stale")
	require.False(t, o.linkUp(gen), "the lost link's events are stale")
	wasReady, _ = o.lost(false, time.Millisecond, time.Second)
	require.False(t, wasReady, "lost twice: the tier heard Down once")
}

// Redials back off exponentially within [RetryMin, RetryMax]; a session
// that became ready starts over; a loss with nothing to redial leaves the
// back-off alone.
func TestOutboundBackoffDoublesWithinBounds(t *testing.T) {
	lo, hi := 100*time.Millisecond, time.Second
	o := &outbound{}
	var waits []time.Duration
	for range 6 {
		o.begin(1, &wire.Hello{})
		_, wait := o.lost(true, lo, hi)
		waits = append(waits, wait)
	}
	require.Equal(t, []time.Duration{lo, 2 * lo, 4 * lo, 8 * lo, hi, hi}, waits)
	_, wait := o.lost(false, lo, hi)
	require.Zero(t, wait, "no redial: no wait")
	require.Equal(t, hi, o.backoff)

	gen := o.begin(2, &wire.Hello{})
	require.True(t, o.linkUp(gen) && o.welcomed() && o.ready())
	_, wait = o.lost(true, lo, hi)
	require.Equal(t, lo, wait, "ready resets the back-off")
}

// A heartbeat tick runs only for a ready session with a round waiting on
// the peer; the timer is armed once until it ticks; a tick of a replaced
// link does nothing.
func TestOutboundHeartbeatTicksOnlyWhenReadyAndBusy(t *testing.T) {
	o := &outbound{}
	gen := o.begin(1, &wire.Hello{})
	require.True(t, o.armHeartbeat())
	require.False(t, o.armHeartbeat(), "armed already")
	require.Equal(t, hbStep{}, o.heartbeat(gen, true), "not ready: no Ping")
	require.True(t, o.armHeartbeat(), "the tick disarmed it")

	o, gen = readyOutbound(t)
	require.Equal(t, hbStep{}, o.heartbeat(gen, false), "idle: no Ping, no wake-ups")
	require.Equal(t, hbStep{ping: 1}, o.heartbeat(gen, true))
	require.Equal(t, hbStep{}, o.heartbeat(gen+1, true), "stale tick")
	require.Equal(t, uint64(1), o.pingSeq, "a stale tick sends nothing")
}

// Seeded schedules of heartbeat ticks (busy or idle), Pongs that come in
// time, late or never, Pongs for Pings never sent, liveness probes and
// their Pongs: the peer is declared dead exactly when missedToDead busy
// ticks in a row found the last Ping unanswered (a late Pong, newer than
// any before, proves it alive and starts the count over; an idle tick
// does too); probes never count. A peer that answers every Ping is never
// declared dead.
func TestOutboundHeartbeatSeeded(t *testing.T) {
	for seed := range uint64(300) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x4eb))
			answerP := []float64{1, 0.9, 0.5, 0}[seed%4]
			o, gen := readyOutbound(t)
			var (
				sent    uint64 // the last heartbeat Ping (0: none since the last idle tick)
				highest uint64 // the newest heartbeat Pong
				run     int    // busy ticks in a row that found the last Ping unanswered
			)
			pong := func(seq uint64) {
				o.pong(seq)
				if seq <= sent && seq > highest {
					highest, run = seq, 0
				}
			}
			for tick := range 200 {
				if rng.IntN(3) == 0 {
					seq := o.nextProbe()
					if rng.IntN(2) == 0 {
						o.pong(seq)
					}
				}
				busy := rng.IntN(8) != 0
				want := false
				switch {
				case !busy:
					sent, highest, run = 0, 0, 0
				case sent > highest:
					run++
					want = run >= missedToDead
				}
				step := o.heartbeat(gen, busy)
				require.Equal(t, want, step.dead, "tick %d: busy ticks that found the last Ping unanswered: %d", tick, run)
				if step.dead {
					require.Less(t, answerP, 1.0, "a peer that answers every Ping was declared dead")
					return
				}
				if !busy {
					require.Zero(t, step.ping, "an idle tick sends no Ping")
					continue
				}
				require.Equal(t, sent+1, step.ping, "tick %d: Pings are numbered in order", tick)
				sent = step.ping
				if rng.Float64() < answerP {
					pong(sent)
				}
				if sent > 1 && rng.IntN(4) == 0 {
					pong(1 + uint64(rng.IntN(int(sent-1)))) // a late or repeated Pong for an older Ping
				}
				if rng.IntN(10) == 0 {
					pong(sent + 1) // for a Ping never sent
				}
			}
		})
	}
}

package supervision

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestManualClockFiresDueTimersInDeadlineOrder(t *testing.T) {
	c := NewManualClock(time.Unix(0, 0))
	var fired []string
	var at []time.Duration
	record := func(name string) func() {
		return func() {
			fired = append(fired, name)
			at = append(at, c.Now().Sub(time.Unix(0, 0)))
		}
	}
	c.AfterFunc(3*time.Second, record("c"))
	c.AfterFunc(time.Second, record("a"))
	c.AfterFunc(time.Second, record("a2")) // same deadline: arming order
	stopped := c.AfterFunc(2*time.Second, record("b"))
	require.Equal(t, 4, c.Pending())

	require.True(t, stopped.Stop())
	require.False(t, stopped.Stop(), "second Stop reports it was not armed")

	c.Advance(999 * time.Millisecond)
	require.Empty(t, fired, "nothing is due before its deadline")
	c.Advance(5 * time.Second)
	require.Equal(t, []string{"a", "a2", "c"}, fired)
	require.Equal(t, []time.Duration{time.Second, time.Second, 3 * time.Second}, at, "each fires with the clock at its deadline")
	require.Equal(t, 5999*time.Millisecond, c.Now().Sub(time.Unix(0, 0)))
	require.Zero(t, c.Pending())
}

func TestManualClockTimerArmedByATimerFiresInTheSameAdvance(t *testing.T) {
	c := NewManualClock(time.Unix(0, 0))
	fired := 0
	c.AfterFunc(time.Second, func() {
		fired++
		c.AfterFunc(time.Second, func() { fired++ })
	})
	c.Advance(2 * time.Second)
	require.Equal(t, 2, fired)
}

func TestRealClockTimerStops(t *testing.T) {
	timer := RealClock{}.AfterFunc(time.Hour, func() { t.Error("fired") })
	require.True(t, timer.Stop())
}

func TestManualClockElapsedCountsAdvances(t *testing.T) {
	c := NewManualClock(time.Unix(1_700_000_000, 0))
	require.Zero(t, c.Elapsed())
	c.Advance(1500 * time.Millisecond)
	require.Equal(t, 1500*time.Millisecond, c.Elapsed())
}

func TestRealClockElapsedIsMonotonic(t *testing.T) {
	c := RealClock{}
	a := c.Elapsed()
	b := c.Elapsed()
	require.GreaterOrEqual(t, b, a)
	require.Positive(t, a, "the origin is the process's start")
}

func TestJumpClockStepsNowButNotElapsedNorTimers(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	inner := NewManualClock(start)
	c := NewJumpClock(inner)
	steady := Steady(c)
	s0 := steady()

	fired := 0
	c.AfterFunc(2*time.Second, func() { fired++ })

	require.Equal(t, 30*time.Second, c.Jump(30*time.Second))
	require.Equal(t, start.Add(30*time.Second), c.Now(), "a forward step moves Now at once")
	require.Equal(t, 0, fired, "a forward step fires no timer: timers run on monotonic time")
	require.Zero(t, c.Elapsed())
	require.Equal(t, s0, steady(), "Steady ignores the step")

	require.Equal(t, -10*time.Second, c.Jump(-40*time.Second))
	require.Equal(t, start.Add(-10*time.Second), c.Now(), "a backward step moves Now back")
	require.Equal(t, -10*time.Second, c.Offset())

	inner.Advance(2 * time.Second)
	require.Equal(t, 1, fired, "the timer fires after 2 s of monotonic time, whatever Now did")
	require.Equal(t, start.Add(-8*time.Second), c.Now())
	require.Equal(t, 2*time.Second, c.Elapsed())
	require.Equal(t, 2*time.Second, steady().Sub(s0))
}

func TestJumpClockOverTheRealClock(t *testing.T) {
	c := NewJumpClock(nil)
	before := time.Now()
	c.Jump(-time.Hour)
	require.True(t, c.Now().Before(before), "an hour back is before a reading taken before the step")
	timer := c.AfterFunc(time.Hour, func() { t.Error("fired") })
	require.True(t, timer.Stop())
	e := c.Elapsed()
	require.GreaterOrEqual(t, RealClock{}.Elapsed(), e, "Elapsed is the real clock's")
}

func TestJumpClockIsSafeForConcurrentUse(t *testing.T) {
	c := NewJumpClock(NewManualClock(time.Unix(0, 0)))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 1000 {
			c.Jump(time.Millisecond)
		}
	}()
	for range 1000 {
		_ = c.Now()
	}
	<-done
	require.Equal(t, time.Second, c.Offset())
}

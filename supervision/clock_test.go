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

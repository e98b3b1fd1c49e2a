package supervision

import (
	"container/heap"
	"sync"
	"time"
)

// Clock is the time source of every lease, deadline and restart window. The
// real clock arms runtime timers; the manual clock fires them only when a test
// advances it, so deadlines are tested without sleeping.
type Clock interface {
	// Now is the wall clock: what timestamps (event times, logs) read. It
	// may step forward or backward, as NTP steps a machine's clock
	// (JumpClock): a lease or deadline kept as a point in time is kept on
	// Elapsed, never on Now.
	Now() time.Time
	// Elapsed is monotonic time since the clock's origin: it never steps,
	// and it runs at the pace AfterFunc's timers fire at.
	Elapsed() time.Duration
	// AfterFunc calls f in its own goroutine once d has passed. f must only
	// send a message: it never touches actor state.
	AfterFunc(d time.Duration, f func()) Timer
}

// steadyEpoch is the arbitrary date Steady's readings count from.
var steadyEpoch = time.Unix(0, 0).UTC()

// Steady returns c's monotonic time (Elapsed) as a time.Time, for code that
// keeps expiries as times (the CPU tier's leases): it never steps when Now
// does. Its readings are not dates: compare them only with each other.
func Steady(c Clock) func() time.Time {
	return func() time.Time { return steadyEpoch.Add(c.Elapsed()) }
}

// Timer is an armed AfterFunc.
type Timer interface {
	// Stop disarms the timer; it reports whether it stopped it before it fired.
	Stop() bool
}

// RealClock is the wall clock.
type RealClock struct{}

// realOrigin is RealClock's origin; it carries a monotonic reading, so
// time.Since(realOrigin) never steps.
var realOrigin = time.Now()

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// Elapsed is the monotonic time since the process started.
func (RealClock) Elapsed() time.Duration { return time.Since(realOrigin) }

// AfterFunc arms a runtime timer.
func (RealClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// ManualClock is a clock that moves only when Advance is called. Timers that
// come due fire synchronously inside Advance, in deadline order.
type ManualClock struct {
	mu     sync.Mutex
	start  time.Time
	now    time.Time
	timers timerHeap
	seq    uint64
}

// NewManualClock starts a manual clock at start.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{start: start, now: start}
}

// Now returns the clock's current time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Elapsed is how far the clock was advanced since it started.
func (c *ManualClock) Elapsed() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now.Sub(c.start)
}

// AfterFunc arms a timer that fires when the clock is advanced past now+d.
func (c *ManualClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &manualTimer{clock: c, at: c.now.Add(d), f: f, seq: c.seq, index: -1}
	heap.Push(&c.timers, t)
	return t
}

// Pending reports how many timers are armed.
func (c *ManualClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Advance moves the clock forward by d and fires, in order, every timer that
// came due. Each fires with the clock set to its own deadline, then the
// clock settles at now+d.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	target := c.now.Add(d)
	for len(c.timers) > 0 && !c.timers[0].at.After(target) {
		t := heap.Pop(&c.timers).(*manualTimer)
		if t.at.After(c.now) {
			c.now = t.at
		}
		c.mu.Unlock()
		t.f()
		c.mu.Lock()
	}
	c.now = target
	c.mu.Unlock()
}

type manualTimer struct {
	clock *ManualClock
	at    time.Time
	f     func()
	seq   uint64
	index int
}

func (t *manualTimer) Stop() bool {
	c := t.clock
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.index < 0 {
		return false
	}
	heap.Remove(&c.timers, t.index)
	return true
}

type timerHeap []*manualTimer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].at.Equal(h[j].at) {
		return h[i].seq < h[j].seq
	}
	return h[i].at.Before(h[j].at)
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *timerHeap) Push(x any) {
	t := x.(*manualTimer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	n := len(old)
	t := old[n-1]
	old[n-1] = nil
	t.index = -1
	*h = old[:n-1]
	return t
}

package endpoint

import (
	"container/heap"
	"time"

	"github.com/kvtier/kvtier/scheduler/wire"
	"github.com/kvtier/kvtier/supervision"
)

// The endpoint's calls in flight: every call forwarded to the bridge and
// not yet over, with its deadline. A call ends exactly once: answered by
// the bridge (the answer comes back to the endpoint actor as a message) or
// expired at its deadline, whichever comes first; the other is then
// dropped. One structure for the whole endpoint, so a call costs no
// goroutine and no timer: the actor arms one timer for the earliest
// deadline (calls_test.go drives the table alone).
//
// Invariants:
//   - a call is in byID exactly while it is in the heap (not over);
//   - the heap is ordered by deadline, ties by id (the order calls came).

// flight is one call in flight.
type flight struct {
	id       uint64        // the endpoint's own number for the call
	session  uint64        // the session that made it
	peer     string        // the connection its reply goes to
	q        *wire.Request // the call as decoded
	timeout  time.Duration // the deadline's span, for the timeout's message
	deadline time.Duration // on the endpoint clock's Elapsed
	index    int           // its place in the heap
}

// flights is the endpoint's calls in flight. Owned by the endpoint actor.
type flights struct {
	byID   map[uint64]*flight
	queue  deadlineHeap
	nextID uint64
	// The deadline timer: the actor's handle, never read by the decisions
	// above. armedFor is the deadline it fires at; timerGen tells a fire
	// of a stopped timer from the armed one's.
	timer    supervision.Timer
	armedFor time.Duration
	timerGen uint64
}

func newFlights() *flights { return &flights{byID: map[uint64]*flight{}} }

// begin records a call forwarded at now (Elapsed) that expires after
// timeout.
func (f *flights) begin(session uint64, peer string, q *wire.Request, now, timeout time.Duration) *flight {
	f.nextID++
	c := &flight{id: f.nextID, session: session, peer: peer, q: q, timeout: timeout, deadline: now + timeout}
	f.byID[c.id] = c
	heap.Push(&f.queue, c)
	return c
}

// answered ends call id on its answer; nil when it is already over (it
// expired first: the answer is dropped).
func (f *flights) answered(id uint64) *flight {
	c := f.byID[id]
	if c == nil {
		return nil
	}
	delete(f.byID, id)
	heap.Remove(&f.queue, c.index)
	return c
}

// expire ends the calls whose deadline is at or before now, earliest first.
func (f *flights) expire(now time.Duration) []*flight {
	var out []*flight
	for len(f.queue) > 0 && f.queue[0].deadline <= now {
		c := heap.Pop(&f.queue).(*flight)
		delete(f.byID, c.id)
		out = append(out, c)
	}
	return out
}

// next is the earliest deadline of a call in flight; ok false when none.
func (f *flights) next() (deadline time.Duration, ok bool) {
	if len(f.queue) == 0 {
		return 0, false
	}
	return f.queue[0].deadline, true
}

// len is the number of calls in flight.
func (f *flights) len() int { return len(f.byID) }

// deadlineHeap orders calls by deadline, then by id.
type deadlineHeap []*flight

func (h deadlineHeap) Len() int { return len(h) }
func (h deadlineHeap) Less(i, j int) bool {
	if h[i].deadline != h[j].deadline {
		return h[i].deadline < h[j].deadline
	}
	return h[i].id < h[j].id
}
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *deadlineHeap) Push(x any) {
	c := x.(*flight)
	c.index = len(*h)
	*h = append(*h, c)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	c.index = -1
	return c
}

package sim

import (
	"container/heap"
	"time"

	"github.com/kvtier/kvtier/messages"
)

// job is an engine transfer job in flight: its workers report at due.
type job struct {
	id      messages.JobID
	kind    messages.JobKind
	due     time.Duration  // virtual time of the workers' reports
	seq     uint64         // issue order, to break ties deterministically
	workers int            // reports the node expects
	keys    []messages.Key // block per slot
	slots   []int
	owner   *running // the request waiting on a load; nil for stores
}

// jobQueue is a min-heap of jobs by (due, seq).
type jobQueue []*job

func (q jobQueue) Len() int { return len(q) }
func (q jobQueue) Less(i, j int) bool {
	if q[i].due != q[j].due {
		return q[i].due < q[j].due
	}
	return q[i].seq < q[j].seq
}
func (q jobQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *jobQueue) Push(x any)   { *q = append(*q, x.(*job)) }
func (q *jobQueue) Pop() any {
	old := *q
	j := old[len(old)-1]
	*q = old[:len(old)-1]
	return j
}

// popDue removes and returns the next job due at or before now, or nil.
func (q *jobQueue) popDue(now time.Duration) *job {
	if q.Len() == 0 || (*q)[0].due > now {
		return nil
	}
	return heap.Pop(q).(*job)
}

// nextDue is the earliest due time; ok is false when the queue is empty.
func (q jobQueue) nextDue() (time.Duration, bool) {
	if len(q) == 0 {
		return 0, false
	}
	return q[0].due, true
}

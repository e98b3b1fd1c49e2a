package sim

import (
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

// jobQueue is the jobs in flight, earliest due first (ties in issue order).
type jobQueue struct{ minHeap[*job] }

func newJobQueue() jobQueue {
	return jobQueue{minHeap[*job]{less: func(a, b *job) bool {
		if a.due != b.due {
			return a.due < b.due
		}
		return a.seq < b.seq
	}}}
}

// popDue removes and returns the next job due at or before now, or nil.
func (q *jobQueue) popDue(now time.Duration) *job {
	if next, ok := q.first(); !ok || next.due > now {
		return nil
	}
	return q.pop()
}

// nextDue is the earliest due time; ok is false when the queue is empty.
func (q *jobQueue) nextDue() (time.Duration, bool) {
	next, ok := q.first()
	if !ok {
		return 0, false
	}
	return next.due, true
}

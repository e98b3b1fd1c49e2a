package messages

import "time"

// Engine calls, sent by the manager facade (outside the actor system) or
// the engine endpoint to the bridge. Each carries a Reply the bridge
// answers exactly once, never blocking: a buffered channel its caller waits
// on with its own deadline (so a late answer never races a timed-out
// future, docs/DESIGN.md §10), or a function the endpoint gives, which
// turns the answer into a message to itself — no goroutine waits per call.

// Result is an engine call's answer.
type Result[T any] struct {
	Value T     // the answer when Err is nil
	Err   error // typed error (errors.Is with the sentinels in errors.go)
}

// Reply is where an engine call's answer goes. Its zero value discards the
// answer (a call nobody awaits).
type Reply[T any] struct {
	ch chan Result[T]  // NewReply's: room for its one answer
	fn func(Result[T]) // ReplyFunc's: called with it, on the answerer's goroutine
}

// NewReply makes a reply channel with room for its one answer; C receives it.
func NewReply[T any]() Reply[T] { return Reply[T]{ch: make(chan Result[T], 1)} }

// ReplyFunc makes a reply that calls fn with the answer, on the answering
// actor's goroutine: fn must not block (it sends a message, no more). fn is
// called once per Answer; the bridge answers once.
func ReplyFunc[T any](fn func(Result[T])) Reply[T] { return Reply[T]{fn: fn} }

// Answer delivers the answer without blocking; a channel's second answer
// is dropped.
func (r Reply[T]) Answer(v T, err error) {
	if r.fn != nil {
		r.fn(Result[T]{Value: v, Err: err})
		return
	}
	select {
	case r.ch <- Result[T]{Value: v, Err: err}:
	default:
	}
}

// AnswerAny is Answer for a caller that holds the answer untyped (an
// actor's shell delivering its core's answers, in order with its
// messages); a v that is not a T answers T's zero value.
func (r Reply[T]) AnswerAny(v any, err error) {
	t, _ := v.(T)
	r.Answer(t, err)
}

// C is where NewReply's answer arrives (nil, never ready, for a ReplyFunc
// or the zero Reply).
func (r Reply[T]) C() <-chan Result[T] { return r.ch }

// Lookup asks for Keys' status, leasing HITs to Req.
type Lookup struct {
	Req    *ReqContext           // the request
	Keys   []Key                 // keys in prefix order
	Prefix bool                  // stop at the first key that is not a HIT
	Reply  Reply[[]LookupStatus] // answer
	// WantSlots asks for each HIT's slot: Slots is filled, one per key (0
	// for a key not answered HIT), before Reply is answered — the reply's
	// receive is what makes it safe to read.
	WantSlots bool
	Slots     []int
}

// PrepareLoad pins Req's HITs and opens a load job.
type PrepareLoad struct {
	Req   *ReqContext    // the request
	Keys  []Key          // keys to load
	Reply Reply[LoadJob] // answer
}

// Touch marks keys recently used.
type Touch struct {
	Req   *ReqContext     // the request
	Keys  []Key           // keys to touch
	Reply Reply[struct{}] // answer
}

// CompleteLoad unpins keys Req loaded.
type CompleteLoad struct {
	Req   *ReqContext     // the request
	Keys  []Key           // keys loaded
	Reply Reply[struct{}] // answer
}

// PrepareStore reserves slots and opens a store job.
type PrepareStore struct {
	Req   *ReqContext      // the request
	Keys  []Key            // keys to store
	Reply Reply[StorePlan] // answer
}

// CompleteStore ends Req's writes of Keys.
type CompleteStore struct {
	Req   *ReqContext     // the request
	Keys  []Key           // keys written
	OK    bool            // whether the writes succeeded
	Reply Reply[struct{}] // answer, once the keys are readable (or freed)
}

// JobDone is one worker's report on a job.
type JobDone struct {
	Job    JobID           // the job
	Worker int             // worker index, 0..Workers-1
	OK     bool            // whether this worker's copy succeeded
	Reply  Reply[struct{}] // answer
}

// RequestFinished ends Req's submit-side calls.
type RequestFinished struct {
	Req   *ReqContext     // the request
	Reply Reply[struct{}] // answer
}

// TakeEvents drains announced events.
type TakeEvents struct {
	Reply Reply[[]Event] // answer
}

// HasPendingWork asks whether engine jobs await worker reports.
type HasPendingWork struct {
	Reply Reply[bool] // answer
}

// Pause stops engine intake; answered once engine jobs drained or were reaped.
type Pause struct {
	ClearCache bool            // also clear the primary tier
	Reply      Reply[struct{}] // answer
}

// Resume restores engine intake.
type Resume struct {
	Reply Reply[struct{}] // answer
}

// ResetCache drains engine jobs until Deadline, reaps the rest, then clears
// the primary tier.
type ResetCache struct {
	Deadline time.Time       // when to stop waiting and reap
	Reply    Reply[struct{}] // answer
}

// GetStats asks for a Stats snapshot.
type GetStats struct {
	Reply Reply[Stats] // answer
}

// Shutdown stops intake for good, drains engine jobs until Deadline and
// reaps the rest.
type Shutdown struct {
	Deadline time.Time       // when to stop waiting and reap
	Reply    Reply[struct{}] // answer
}

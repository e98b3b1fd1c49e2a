// Package modeltime is the time of a seeded model test: Run, its seeds
// and steps, and the deadlines — the timers an actor's core arms through
// its Effects, kept as data and fired when the test says, in a random
// order — stopped ones too, now and then, as a real timer can fire just as
// it is stopped — and Carry, which hands the world what a core decided and
// keeps its deadlines. It owns no clock: a test that needs time to pass
// advances its own. The world itself (what a step does, what settled
// means) is the test's.
package modeltime

import (
	"math/rand/v2"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/supervision"
)

// Timers are the timers armed so far.
type Timers struct{ armed []*timer }

type timer struct {
	msg            any
	stopped, fired bool
	deadline       *fx.Deadline // adopted from a core's fx.Out; nil for After's
}

// Stop disarms the timer; it reports whether it did before it fired.
func (t *timer) Stop() bool {
	was := !t.stopped && !t.fired
	t.stopped = true
	return was
}

func (t *timer) isStopped() bool {
	if t.deadline != nil {
		return t.deadline.Stopped()
	}
	return t.stopped
}

// After arms a timer that, fired, hands back msg.
func (ts *Timers) After(msg any) supervision.Timer {
	t := &timer{msg: msg}
	ts.armed = append(ts.armed, t)
	return t
}

// Adopt arms the deadlines a core decided (its fx.Out's): stopped through
// the core's own handle, fired here.
func (ts *Timers) Adopt(ds []*fx.Deadline) {
	for _, d := range ds {
		ts.armed = append(ts.armed, &timer{msg: d.Msg, deadline: d})
	}
}

// World is what a model test's world does with each message its core
// sent: checks it and keeps it to answer or deliver later.
type World interface {
	Request(to *actor.PID, msg any)
	Send(to *actor.PID, msg any)
	Respond(msg any) // an answer to the message being handled
}

// Carry hands what a core decided in o (its fx.Out) to w message by
// message, in the order the core decided it, answers the calls it held,
// adopts its deadlines, then resets o. o's offloads are the world's to
// take before.
func (ts *Timers) Carry(o *fx.Out, w World) {
	for _, s := range o.Sent {
		switch s.Kind {
		case fx.Request:
			w.Request(s.To.PID(), s.Msg)
		case fx.Send:
			w.Send(s.To.PID(), s.Msg)
		case fx.Reply:
			w.Respond(s.Msg)
		case fx.Answer:
			s.Reply.AnswerAny(s.Msg, s.Err)
		}
	}
	ts.Adopt(o.Deadlines)
	o.Reset()
}

// Fire picks a timer that has not fired yet and returns its message: an
// armed one, or a stopped one one time in ten (every stopped one when
// settling, to prove late firings harmless). False when there is none.
func (ts *Timers) Fire(rng *rand.Rand, settling bool) (any, bool) {
	var live []*timer
	for _, t := range ts.armed {
		if !t.fired && (!t.isStopped() || settling || rng.IntN(10) == 0) {
			live = append(live, t)
		}
	}
	if len(live) == 0 {
		return nil, false
	}
	t := live[rng.IntN(len(live))]
	t.fired = true
	if t.deadline != nil {
		t.deadline.Fire()
	}
	return t.msg, true
}

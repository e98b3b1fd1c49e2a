// Package fxlog records what an actor's core decided (its fx.Out) —
// requests and sends in order, in-place answers, the deadlines it arms, the
// work it offloads — for scenario tests that hand the core one message and
// check exactly what it did. It owns no clock and drives nothing: the test
// does.
package fxlog

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/supervision/modeltime"
)

// Sent is one message the core sent (Request or Send), and to whom.
type Sent struct {
	To  *actor.PID
	Msg any
}

// Log is the record. Embed it in a test's world and Take each Out the
// core fills.
type Log struct {
	Out   []Sent // requests and sends since the last Reset, in order
	Resp  []any  // in-place answers since the last Reset
	Armed []any  // every deadline message armed, in order (never reset)
	// Offloaded is the work handed off the mailbox (Take), in order, until
	// the test runs it.
	Offloaded []func() any
	timers    modeltime.Timers
}

// Take records what a core decided in o (its fx.Out: sends, requests and
// replies in order, deadlines armed), delivers its answers to held calls,
// then resets o.
func (l *Log) Take(o *fx.Out) {
	for _, s := range o.Sent {
		switch s.Kind {
		case fx.Reply:
			l.Resp = append(l.Resp, s.Msg)
		case fx.Answer:
			s.Reply.AnswerAny(s.Msg, s.Err) // NB: the test reads it from the call's Reply
		default:
			l.Out = append(l.Out, Sent{s.To.PID(), s.Msg})
		}
	}
	for _, d := range o.Deadlines {
		l.Armed = append(l.Armed, d.Msg)
	}
	l.Offloaded = append(l.Offloaded, o.Offloads...)
	l.timers.Adopt(o.Deadlines)
	o.Reset()
}

// Reset forgets what was sent and answered (before the next message).
func (l *Log) Reset() { l.Out, l.Resp = nil, nil }

// Step is one message's effects, for a test that hands a core one message
// at a time: it forgets what was sent before, lets the core decide into o,
// records that (Take) and returns what the core sent.
func (l *Log) Step(o *fx.Out, decide func(*fx.Out)) []Sent {
	l.Reset()
	decide(o)
	l.Take(o)
	return l.Out
}

// One is the single message of type M in out, which must have gone to to.
func One[M any](t testing.TB, out []Sent, to *actor.PID) M {
	t.Helper()
	got := All[M](out)
	if len(got) != 1 {
		t.Fatalf("want one %T in %v, got %d", *new(M), out, len(got))
	}
	for _, s := range out {
		if _, ok := s.Msg.(M); ok && s.To != to {
			t.Fatalf("%T sent to %v, want %v", s.Msg, s.To, to)
		}
	}
	return got[0]
}

// All are the messages of type M in out, in order.
func All[M any](out []Sent) []M {
	var got []M
	for _, s := range out {
		if m, ok := s.Msg.(M); ok {
			got = append(got, m)
		}
	}
	return got
}

// Armed is the last deadline of type M armed, if any.
func Armed[M any](l *Log) (M, bool) {
	for i := len(l.Armed) - 1; i >= 0; i-- {
		if m, ok := l.Armed[i].(M); ok {
			return m, true
		}
	}
	var zero M
	return zero, false
}

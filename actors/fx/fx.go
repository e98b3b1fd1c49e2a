// Package fx is the one way an actor's core says what it decided: handed
// one message, the core fills an Out — the messages to send, the requests
// whose answers come back as messages, the answer to the message being
// handled and to calls it held, the deadlines to arm and the work to run
// off the mailbox — addressed by Ref, never by an actor context or PID. The actor's shell is the only code that touches the
// actor system: it hands the core each message and carries the Out out
// (Carry). Tests hand the core messages and read its Outs.
//
// It owns no actor and no state beyond one message's decisions.
package fx

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/supervision"
)

// Ref is an actor a core addresses: opaque to the core (it can compare and
// keep one, and name it in an Out), resolved by the shell.
type Ref struct{ pid *actor.PID }

// RefOf is the Ref of pid (the zero Ref for nil).
func RefOf(pid *actor.PID) Ref { return Ref{pid: pid} }

// PID is the actor r names, for shells and tests (nil for the zero Ref).
func (r Ref) PID() *actor.PID { return r.pid }

// IsZero reports whether r names no actor.
func (r Ref) IsZero() bool { return r.pid == nil }

func (r Ref) String() string {
	if r.pid == nil {
		return "nobody"
	}
	return r.pid.Id
}

// Kind is how a message leaves.
type Kind uint8

const (
	// Send: a message the receiver does not answer.
	Send Kind = iota + 1
	// Request: a message whose answer comes back to the core as a message.
	Request
	// Reply: an answer to the sender of the message being handled.
	Reply
	// Answer: an answer to a call the core held (a messages.Reply), given
	// when what the call waited for came.
	Answer
)

// Replier is a held call's answer handle: a messages.Reply.
type Replier interface{ AnswerAny(v any, err error) }

// Sent is one message the core decided to send.
type Sent struct {
	Kind  Kind
	To    Ref // the zero Ref for a Reply or an Answer
	Msg   any
	Err   error   // an Answer's error
	Reply Replier // an Answer's call
}

// Deadline is a message the core has sent to itself once After has passed
// on the shell's clock: a deadline that ends a batch or a job, never a
// wait. Stopping it before it is carried out arms nothing.
type Deadline struct {
	After time.Duration
	Msg   any

	stopped, fired bool
	timer          supervision.Timer // once armed
}

// Stop disarms d; it reports whether it stopped d before it fired.
func (d *Deadline) Stop() bool {
	was := !d.stopped && !d.fired
	d.stopped = true
	if d.timer != nil {
		return d.timer.Stop()
	}
	return was
}

// Stopped reports whether d was stopped.
func (d *Deadline) Stopped() bool { return d.stopped }

// Fire marks d fired and returns its message: a model test's timer firing.
func (d *Deadline) Fire() any {
	d.fired = true
	return d.Msg
}

// Out is what a core decided while handling one message, in order.
type Out struct {
	Sent      []Sent
	Deadlines []*Deadline
	// Offloads is work to run off the mailbox (a checksum over slot
	// memory); each one's result comes back to the core as a message.
	Offloads []func() any
}

// Send sends msg to to; no answer is expected.
func (o *Out) Send(to Ref, msg any) { o.Sent = append(o.Sent, Sent{Kind: Send, To: to, Msg: msg}) }

// Request sends msg to to; its answer comes back to the core as a message.
func (o *Out) Request(to Ref, msg any) {
	o.Sent = append(o.Sent, Sent{Kind: Request, To: to, Msg: msg})
}

// Respond answers the message being handled.
func (o *Out) Respond(msg any) { o.Sent = append(o.Sent, Sent{Kind: Reply, Msg: msg}) }

// Answer answers a call the core held, in order with the messages around
// it: whoever waits on it sees what the core sent before it as sent.
func (o *Out) Answer(to Replier, v any, err error) {
	o.Sent = append(o.Sent, Sent{Kind: Answer, Msg: v, Err: err, Reply: to})
}

// After arms a deadline: msg comes back to the core once d has passed.
func (o *Out) After(d time.Duration, msg any) *Deadline {
	dl := &Deadline{After: d, Msg: msg}
	o.Deadlines = append(o.Deadlines, dl)
	return dl
}

// Offload runs work off the mailbox; its result comes back as a message.
func (o *Out) Offload(work func() any) { o.Offloads = append(o.Offloads, work) }

// Reset empties o for the next message.
func (o *Out) Reset() {
	clear(o.Sent)
	clear(o.Deadlines)
	clear(o.Offloads)
	o.Sent, o.Deadlines, o.Offloads = o.Sent[:0], o.Deadlines[:0], o.Offloads[:0]
}

// Shell is what an actor's shell carries its core's Outs out with.
type Shell struct {
	Clock supervision.Clock // deadlines
	// Go runs offloaded work off the mailbox (tracked: actors.Offload's Go,
	// which runs nothing once the node is closing); nil: a goroutine of
	// its own.
	Go func(func()) bool
}

// Carry carries out o through ctx with clock (no offloads expected).
func Carry(ctx actor.Context, clock supervision.Clock, o *Out) { Shell{Clock: clock}.Carry(ctx, o) }

// Carry carries out o through ctx, in order: its deadlines armed as
// messages to ctx's actor (first, so that whoever gets an answer of this
// Out finds its deadlines armed), its messages, then its offloads, whose
// results come back to ctx's actor; then resets o. A send to the zero Ref
// is dropped (an asker that is gone).
func (sh Shell) Carry(ctx actor.Context, o *Out) {
	sh.arm(ctx, o.Deadlines)
	for _, s := range o.Sent {
		switch {
		case s.Kind == Reply:
			ctx.Respond(s.Msg)
		case s.Kind == Answer:
			s.Reply.AnswerAny(s.Msg, s.Err)
		case s.To.pid == nil:
		case s.Kind == Request:
			ctx.Request(s.To.pid, s.Msg)
		default:
			ctx.Send(s.To.pid, s.Msg)
		}
	}
	sh.offload(ctx, o.Offloads)
	o.Reset()
}

// arm arms each deadline not stopped as a message to ctx's actor.
func (sh Shell) arm(ctx actor.Context, deadlines []*Deadline) {
	if len(deadlines) == 0 {
		return
	}
	self, root := ctx.Self(), ctx.ActorSystem().Root
	for _, d := range deadlines {
		if !d.stopped {
			msg := d.Msg
			d.timer = sh.Clock.AfterFunc(d.After, func() { root.Send(self, msg) })
		}
	}
}

// offload runs each work off the mailbox; its result comes back to ctx's
// actor.
func (sh Shell) offload(ctx actor.Context, works []func() any) {
	if len(works) == 0 {
		return
	}
	self, root := ctx.Self(), ctx.ActorSystem().Root
	for _, work := range works {
		run := func() { root.Send(self, work()) }
		if sh.Go != nil {
			sh.Go(run)
		} else {
			go run()
		}
	}
}

// Each is the messages of type M the core sent, in order.
func Each[M any](o *Out) []M {
	var got []M
	for _, s := range o.Sent {
		if m, ok := s.Msg.(M); ok {
			got = append(got, m)
		}
	}
	return got
}

// Only is the single message of type M in o, sent to to; an error says
// what o held instead.
func Only[M any](o *Out, to Ref) (M, error) {
	var zero M
	got := Each[M](o)
	if len(got) != 1 {
		return zero, fmt.Errorf("want one %T, got %d in %v", zero, len(got), o.Sent)
	}
	for _, s := range o.Sent {
		if _, ok := s.Msg.(M); ok && s.To != to {
			return zero, fmt.Errorf("%T sent to %v, want %v", s.Msg, s.To, to)
		}
	}
	return got[0], nil
}

package fx_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// journal records, in order, what reached the probe processes and the
// answers delivered: both are synchronous, so its order is Carry's.
type journal struct {
	mu  sync.Mutex
	got []string
}

func (j *journal) add(s string) {
	j.mu.Lock()
	j.got = append(j.got, s)
	j.mu.Unlock()
}

func (j *journal) all() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.got...)
}

// probe is a process that records each message as it is sent to it.
type probe struct{ j *journal }

func (p probe) SendUserMessage(_ *actor.PID, m any) {
	_, msg, _ := actor.UnwrapEnvelope(m)
	if s, ok := msg.(string); ok {
		p.j.add(s)
	}
}
func (p probe) SendSystemMessage(*actor.PID, any) {}
func (p probe) Stop(*actor.PID)                   {}

// core is an actor whose "core" decides out from each message it is given
// (a func(*fx.Out)) and whose shell carries it out; what comes back to it
// (a deadline) goes to the journal.
type core struct {
	j     *journal
	clock supervision.Clock
	out   fx.Out
}

func (c *core) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case func(*fx.Out):
		m(&c.out)
		fx.Carry(ctx, c.clock, &c.out)
	case string:
		c.j.add("self:" + m)
	}
}

func start(t *testing.T, clock supervision.Clock) (*actor.ActorSystem, *actor.PID, fx.Ref, *journal) {
	t.Helper()
	system := actors.NewSystem(zerolog.Nop())
	t.Cleanup(system.Shutdown)
	j := &journal{}
	pid, ok := system.ProcessRegistry.Add(probe{j}, "probe")
	require.True(t, ok)
	return system, system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &core{j: j, clock: clock} })), fx.RefOf(pid), j
}

// run hands decide to the core and waits until the journal holds n entries.
func run(t *testing.T, system *actor.ActorSystem, c *actor.PID, j *journal, n int, decide func(*fx.Out)) {
	t.Helper()
	system.Root.Send(c, decide)
	require.Eventually(t, func() bool { return len(j.all()) >= n }, 5*time.Second, time.Millisecond)
}

func TestCarryDeliversAnswersInOrderWithTheMessagesAroundThem(t *testing.T) {
	system, c, p, j := start(t, supervision.RealClock{})
	answered := messages.ReplyFunc(func(r messages.Result[int]) { j.add("answer") })
	run(t, system, c, j, 3, func(o *fx.Out) {
		o.Send(p, "before")
		o.Answer(answered, 7, nil)
		o.Request(p, "after")
		o.Send(fx.Ref{}, "to nobody") // an asker that is gone: dropped
	})
	require.Equal(t, []string{"before", "answer", "after"}, j.all(),
		"a caller woken by an answer finds what was decided before it sent")
}

// Whoever an answer wakes finds the deadlines the same Out armed: an
// engine told of its job finds the job's deadline running (a test that
// advances a manual clock right after the answer relies on it).
func TestCarryArmsDeadlinesBeforeItAnswers(t *testing.T) {
	clock := supervision.NewManualClock(time.Unix(1_700_000_000, 0))
	system, c, _, j := start(t, clock)
	answered := messages.ReplyFunc(func(r messages.Result[int]) { j.add(fmt.Sprintf("answer, %d armed", clock.Pending())) })
	run(t, system, c, j, 1, func(o *fx.Out) {
		o.Answer(answered, 7, nil)
		o.After(time.Second, "deadline")
	})
	require.Equal(t, []string{"answer, 1 armed"}, j.all())
}

func TestAnswerAnyGivesTheTypedValueOrItsZero(t *testing.T) {
	r := messages.NewReply[[]int]()
	r.AnswerAny([]int{1, 2}, nil)
	require.Equal(t, []int{1, 2}, (<-r.C()).Value)
	r = messages.NewReply[[]int]()
	r.AnswerAny(nil, messages.ErrClosed)
	got := <-r.C()
	require.Nil(t, got.Value)
	require.ErrorIs(t, got.Err, messages.ErrClosed)
}

func TestADeadlineStoppedBeforeItIsCarriedIsNeverArmed(t *testing.T) {
	clock := supervision.NewManualClock(time.Unix(1_700_000_000, 0))
	system, c, p, j := start(t, clock)
	var first, second bool
	run(t, system, c, j, 1, func(o *fx.Out) {
		d := o.After(time.Second, "stopped")
		first, second = d.Stop(), d.Stop()
		o.After(2*time.Second, "armed")
		o.Send(p, "sent")
	})
	require.True(t, first, "stopped before it fired")
	require.False(t, second, "stopped once")
	clock.Advance(3 * time.Second)
	require.Eventually(t, func() bool { return len(j.all()) == 2 }, 5*time.Second, time.Millisecond)
	require.Equal(t, []string{"sent", "self:armed"}, j.all())
}

func TestAnArmedDeadlineStopsThroughItsTimer(t *testing.T) {
	clock := supervision.NewManualClock(time.Unix(1_700_000_000, 0))
	system, c, p, j := start(t, clock)
	var d *fx.Deadline
	run(t, system, c, j, 1, func(o *fx.Out) {
		d = o.After(time.Second, "late")
		o.Send(p, "armed")
	})
	// NB: the next message is handled after Carry armed d (mailbox order).
	done := make(chan bool, 1)
	system.Root.Send(c, func(*fx.Out) { done <- d.Stop() })
	require.True(t, <-done, "stopped before it fired")
	clock.Advance(2 * time.Second)
	run(t, system, c, j, 2, func(o *fx.Out) { o.Send(p, "after") })
	require.Equal(t, []string{"armed", "after"}, j.all(), "a stopped deadline never comes back")
}

func TestOffloadedWorkComesBackAsAMessage(t *testing.T) {
	system, c, _, j := start(t, supervision.RealClock{})
	run(t, system, c, j, 1, func(o *fx.Out) {
		o.Offload(func() any { return "offloaded" })
	})
	require.Equal(t, []string{"self:offloaded"}, j.all())
}

func TestResetKeepsNoDecision(t *testing.T) {
	var o fx.Out
	o.Send(fx.Ref{}, 1)
	o.After(time.Second, 2)
	o.Offload(func() any { return 3 })
	o.Reset()
	require.Empty(t, o.Sent)
	require.Empty(t, o.Deadlines)
	require.Empty(t, o.Offloads)
}

func TestEachAndOnlyFindTheCoresMessages(t *testing.T) {
	a, b := fx.RefOf(actor.NewPID("x", "a")), fx.RefOf(actor.NewPID("x", "b"))
	var o fx.Out
	o.Send(a, "one")
	o.Request(b, 2)
	o.Send(a, "three")
	require.Equal(t, []string{"one", "three"}, fx.Each[string](&o))
	n, err := fx.Only[int](&o, b)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	_, err = fx.Only[int](&o, a)
	require.Error(t, err, "sent to b, not a")
	_, err = fx.Only[string](&o, a)
	require.Error(t, err, "two of them")
	require.Equal(t, "nobody", fx.Ref{}.String())
	require.True(t, fx.Ref{}.IsZero())
}

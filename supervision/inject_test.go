package supervision

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type note struct{ n int }

// recorder reports every note it handles, in order, and counts its starts.
type recorder struct {
	got    chan int
	starts chan struct{}
}

func (r *recorder) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		r.starts <- struct{}{}
	case *note:
		r.got <- m.n
	}
}

type harness struct {
	system *actor.ActorSystem
	pid    *actor.PID
	got    chan int
	starts chan struct{}
	clock  *ManualClock
	inj    *Injector
}

// newHarness spawns a recorder with the Faults middleware in a system the
// injector is attached to (nil cfg.Ledger: a fresh one).
func newHarness(t *testing.T, cfg InjectorConfig) *harness {
	t.Helper()
	h := &harness{system: actor.NewActorSystem(), got: make(chan int, 64), starts: make(chan struct{}, 8),
		clock: NewManualClock(time.Unix(0, 0))}
	cfg.Clock = h.clock
	h.inj = NewInjector(cfg)
	h.inj.Attach(h.system)
	props := actor.PropsFromProducer(func() actor.Actor { return &recorder{got: h.got, starts: h.starts} },
		actor.WithReceiverMiddleware(Faults))
	h.pid = h.system.Root.Spawn(props)
	h.started(t)
	t.Cleanup(func() {
		h.inj.Close()
		_ = h.system.Root.StopFuture(h.pid).Wait()
		h.system.Shutdown()
	})
	return h
}

// started waits for the actor's next start (first start or a restart).
func (h *harness) started(t *testing.T) {
	t.Helper()
	select {
	case <-h.starts:
	case <-time.After(5 * time.Second):
		t.Fatal("actor not (re)started")
	}
}

// noRestart checks the actor has not restarted since the last started.
func (h *harness) noRestart(t *testing.T) {
	t.Helper()
	select {
	case <-h.starts:
		t.Fatal("unexpected restart")
	default:
	}
}

// pending waits until the injector has n timers armed: the actor has
// handled what was sent (nothing else observable happens when a message is
// delayed or held). It polls: the injector offers no notification.
func (h *harness) pending(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return h.inj.Pending() == n }, 5*time.Second, 100*time.Microsecond)
}

func (h *harness) send(ns ...int) {
	for _, n := range ns {
		h.system.Root.Send(h.pid, &note{n: n})
	}
}

// expect reads the next notes the actor handled.
func (h *harness) expect(t *testing.T, want ...int) {
	t.Helper()
	for _, w := range want {
		select {
		case n := <-h.got:
			require.Equal(t, w, n)
		case <-time.After(5 * time.Second):
			t.Fatalf("note %d never handled", w)
		}
	}
}

// at is a rule injecting d at occurrence n of the note site.
func at(n uint64, d Decision) MessageRule {
	return func(del Delivery) Decision {
		if del.Type == "*supervision.note" && del.Point.N == n {
			return d
		}
		return Decision{}
	}
}

func TestInjectorDropsDuplicatesAndCounts(t *testing.T) {
	h := newHarness(t, InjectorConfig{})
	h.inj.Inject(at(1, Decision{Kind: FaultDrop}))
	h.inj.Inject(at(2, Decision{Kind: FaultDuplicate}))
	h.send(0, 1, 2, 3)
	h.expect(t, 0, 2, 2, 3) // FIFO: a dropped 1 would have come before 3
	led := h.inj.Ledger()
	assert.Equal(t, map[FaultKind]uint64{FaultDrop: 1, FaultDuplicate: 1}, led.Counts())
	faults := led.Faults()
	require.Len(t, faults, 2)
	assert.Equal(t, Point{Site: h.pid.Id + " *supervision.note", N: 1}, faults[0].Point)
	assert.Equal(t, uint64(2), faults[1].Seq)
}

func TestInjectorDelaysThroughTheMailboxOnItsClock(t *testing.T) {
	h := newHarness(t, InjectorConfig{})
	h.inj.Inject(at(0, Decision{Kind: FaultDelay, Delay: 50 * time.Millisecond}))
	h.send(0, 1)
	h.expect(t, 1)
	require.Equal(t, 1, h.inj.Pending(), "the delayed note waits on a timer, not in Receive")
	h.clock.Advance(49 * time.Millisecond)
	h.send(2)
	h.expect(t, 2)
	h.clock.Advance(time.Millisecond)
	h.expect(t, 0)
	assert.Zero(t, h.inj.Pending())
}

func TestInjectorReordersWithTheNextMessageOrItsHoldTimer(t *testing.T) {
	h := newHarness(t, InjectorConfig{MaxHold: 20 * time.Millisecond})
	h.inj.Inject(at(0, Decision{Kind: FaultReorder}))
	h.inj.Inject(at(2, Decision{Kind: FaultReorder}))
	h.send(0, 1)
	h.expect(t, 1, 0)
	assert.Zero(t, h.inj.Pending(), "the hold timer is disarmed once released")
	h.send(2) // held with nothing behind it: its timer lets it go
	h.clock.Advance(19 * time.Millisecond)
	h.send(3) // a successor releases it first
	h.expect(t, 3, 2)
	h.send(4)
	h.expect(t, 4)
	assert.Equal(t, uint64(2), h.inj.Ledger().Counts()[FaultReorder])

	h.inj.Inject(at(5, Decision{Kind: FaultReorder}))
	h.send(5)
	h.pending(t, 1)
	h.clock.Advance(20 * time.Millisecond)
	h.expect(t, 5)
}

func TestInjectorPanicsAfterHandlingWithinItsSpacing(t *testing.T) {
	h := newHarness(t, InjectorConfig{PanicSpacing: time.Minute})
	h.inj.Inject(func(d Delivery) Decision {
		if d.Type == "*supervision.note" {
			return Decision{Kind: FaultPanic}
		}
		return Decision{}
	})
	h.send(0, 1, 2)
	h.expect(t, 0) // nothing lost: the note is handled, then the actor fails
	h.started(t)
	h.expect(t, 1, 2) // the spacing refused the other panics
	h.noRestart(t)
	assert.Equal(t, uint64(1), h.inj.Ledger().Counts()[FaultPanic])
	h.clock.Advance(time.Minute)
	h.send(3)
	h.expect(t, 3)
	h.started(t)
}

func TestInjectPanicIsRecordedWhenAttached(t *testing.T) {
	h := newHarness(t, InjectorConfig{})
	h.system.Root.Send(h.pid, &InjectPanic{Reason: "test"})
	h.send(1)
	h.started(t)
	h.expect(t, 1)
	assert.Equal(t, uint64(1), h.inj.Ledger().Counts()[FaultPanic])
}

func TestInjectorCloseDropsPendingAndDetaches(t *testing.T) {
	h := newHarness(t, InjectorConfig{})
	h.inj.Inject(at(0, Decision{Kind: FaultDelay, Delay: time.Second}))
	h.inj.Inject(func(d Delivery) Decision { return Decision{Kind: FaultDrop} }) // everything else
	h.send(0, 1)
	h.send(2)
	h.pending(t, 1)
	require.Eventually(t, func() bool { return h.inj.Ledger().Total() == 3 }, 5*time.Second, 100*time.Microsecond)
	h.inj.Close()
	assert.Equal(t, 1, h.inj.Lost())
	assert.Nil(t, attached.Load(), "no injector attached anywhere any more")
	h.clock.Advance(time.Hour)
	h.send(3)
	h.expect(t, 3) // 0 was lost, 1 and 2 dropped, 3 passes untouched
}

func TestFaultsWithoutInjectorPassesEverything(t *testing.T) {
	system := actor.NewActorSystem()
	defer system.Shutdown()
	got, starts := make(chan int, 4), make(chan struct{}, 1)
	pid := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &recorder{got: got, starts: starts} },
		actor.WithReceiverMiddleware(Faults)))
	defer func() { _ = system.Root.StopFuture(pid).Wait() }()
	system.Root.Send(pid, &note{n: 7})
	system.Root.Send(pid, &redelivery{env: &actor.MessageEnvelope{Message: &note{n: 8}}})
	system.Root.Send(pid, &redelivery{hold: 3})
	system.Root.Send(pid, &note{n: 9})
	for _, w := range []int{7, 8, 9} {
		select {
		case n := <-got:
			require.Equal(t, w, n)
		case <-time.After(5 * time.Second):
			t.Fatal("not delivered")
		}
	}
}

func TestAttachIsPerSystem(t *testing.T) {
	a, b := actor.NewActorSystem(), actor.NewActorSystem()
	defer a.Shutdown()
	defer b.Shutdown()
	ia, ib := NewInjector(InjectorConfig{}), NewInjector(InjectorConfig{})
	AttachFaults(a, ia)
	AttachFaults(b, ib)
	AttachFaults(b, nil) // no-op
	require.Len(t, *attached.Load(), 2)
	assert.Same(t, ib, (*attached.Load())[b])
	DetachFaults(a)
	require.Len(t, *attached.Load(), 1)
	ia.Close() // not attached any more: leaves b's alone
	require.Len(t, *attached.Load(), 1)
	ib.Close()
	assert.Nil(t, attached.Load())
	DetachFaults(b) // nothing attached: nothing to do
}

// BenchmarkFaultsOff is the cost of the middleware when no injector is
// attached anywhere (production); compare BenchmarkBareReceiver.
func BenchmarkFaultsOff(b *testing.B) { benchDelivery(b, Faults) }

// BenchmarkBareReceiver is the same delivery with no middleware.
func BenchmarkBareReceiver(b *testing.B) {
	benchDelivery(b, func(next actor.ReceiverFunc) actor.ReceiverFunc { return next })
}

// benchDelivery delivers a message over and over to a counting receiver
// wrapped in middleware.
func benchDelivery(b *testing.B, middleware func(actor.ReceiverFunc) actor.ReceiverFunc) {
	var n, i int
	f := middleware(func(actor.ReceiverContext, *actor.MessageEnvelope) { n++ })
	env := &actor.MessageEnvelope{Message: &note{}}
	b.ReportAllocs()
	for b.Loop() {
		f(nil, env)
		i++
	}
	if n != i {
		b.Fatal("not delivered")
	}
}

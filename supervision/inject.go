package supervision

import (
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// Message fault injection (chaos tests, docs/DESIGN.md §2.4): an Injector attached
// to an actor system perturbs what the Faults middleware of its actors
// delivers — drop, delay, duplicate, reorder, or panic after handling — as
// its rules decide. Nothing is attached in production: the middleware then
// costs one atomic load and a nil check per message (BenchmarkFaultsOff).
//
// The injector knows nothing of kvtier's messages. Which message types may
// be perturbed in which way is the caller's catalogue, expressed as rules
// (tools/chaos documents the one the harness uses): a message whose loss
// the system is not designed to survive must never be dropped.

// Delivery is a message about to reach an actor spawned with Faults.
type Delivery struct {
	Target string // the receiving actor's PID id, e.g. "kvtier/bridge"
	Type   string // the message's Go type, e.g. "*messages.JobDone"
	Msg    any    // the message; read-only
	Point  Point  // Site is Target + " " + Type
}

// MessageRule decides the fault for one delivery; the zero Decision lets it
// through. Only the message kinds (drop, delay, duplicate, reorder, panic)
// apply; any other kind is ignored.
type MessageRule func(d Delivery) Decision

// InjectorConfig configures an Injector.
type InjectorConfig struct {
	// Ledger numbers deliveries and records injected faults (required).
	Ledger *Ledger
	// Clock arms delay and hold timers; nil is the wall clock.
	Clock Clock
	// MaxHold is how long a reordered message waits for the next message
	// before it is delivered anyway (default 10ms).
	MaxHold time.Duration
	// PanicSpacing allows at most one injected panic per actor per spacing,
	// so a run stays under the supervisor's restart limit (a child that
	// fails too often is stopped, not restarted). 0: no limit.
	PanicSpacing time.Duration
}

// DefaultMaxHold bounds how long a reordered message is held.
const DefaultMaxHold = 10 * time.Millisecond

// Injector perturbs the messages of the actor systems it is attached to.
// Rules run in the receiving actor's goroutine, one delivery at a time per
// actor; they must be quick and must not block.
type Injector struct {
	cfg   InjectorConfig
	rules Rules[MessageRule]
	types sync.Map // reflect.Type → string

	mu        sync.Mutex
	closed    bool
	systems   []*actor.ActorSystem
	timers    map[uint64]Timer // armed delay and hold timers
	seq       uint64
	held      map[string]*heldMessage // target → its reordered message
	lastPanic map[string]time.Time
	lost      int // delayed or held messages dropped by Close
}

type heldMessage struct {
	env   *actor.MessageEnvelope
	timer uint64
}

// redelivery brings a delayed or held message back to its actor through
// its own mailbox. hold ≠ 0 marks a hold timer's flush rather than a
// delayed message.
type redelivery struct {
	env  *actor.MessageEnvelope
	hold uint64
}

// NewInjector makes an injector with no rules.
func NewInjector(cfg InjectorConfig) *Injector {
	if cfg.Ledger == nil {
		cfg.Ledger = NewLedger(nil)
	}
	if cfg.Clock == nil {
		cfg.Clock = RealClock{}
	}
	if cfg.MaxHold <= 0 {
		cfg.MaxHold = DefaultMaxHold
	}
	return &Injector{cfg: cfg, timers: map[uint64]Timer{}, held: map[string]*heldMessage{},
		lastPanic: map[string]time.Time{}}
}

// Ledger is where the injector records.
func (inj *Injector) Ledger() *Ledger { return inj.cfg.Ledger }

// Inject adds a rule after the others (the first rule that decides wins);
// the returned func removes it.
func (inj *Injector) Inject(r MessageRule) (remove func()) { return inj.rules.Inject(r) }

// Lost is how many delayed or held messages Close dropped.
func (inj *Injector) Lost() int {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	return inj.lost
}

// Pending is how many delay or hold timers are armed.
func (inj *Injector) Pending() int {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	return len(inj.timers)
}

// Close detaches the injector from every system, stops its timers and
// drops the messages they would have delivered (counted in Lost). Later
// deliveries pass through untouched.
func (inj *Injector) Close() {
	inj.mu.Lock()
	inj.closed = true
	for id, t := range inj.timers {
		if t.Stop() {
			inj.lost++
		}
		delete(inj.timers, id)
	}
	clear(inj.held)
	systems := inj.systems
	inj.systems = nil
	inj.mu.Unlock()
	for _, s := range systems {
		detach(s, inj)
	}
}

// Attach makes the Faults middleware of system's actors consult inj; the
// returned func detaches it. A system has at most one injector.
func (inj *Injector) Attach(system *actor.ActorSystem) (detach func()) {
	inj.mu.Lock()
	inj.systems = append(inj.systems, system)
	inj.mu.Unlock()
	attach(system, inj)
	return func() { DetachFaults(system) }
}

// AttachFaults attaches inj to system (a node's Config.Faults); nil does
// nothing.
func AttachFaults(system *actor.ActorSystem, inj *Injector) {
	if inj != nil {
		inj.Attach(system)
	}
}

// DetachFaults detaches whatever injector system has; none: nothing.
func DetachFaults(system *actor.ActorSystem) { detach(system, nil) }

// attached maps actor systems to their injector; nil while none is
// attached anywhere in the process (always, in production). Copy on write.
var (
	attached atomic.Pointer[map[*actor.ActorSystem]*Injector]
	attachMu sync.Mutex
)

func attach(system *actor.ActorSystem, inj *Injector) {
	attachMu.Lock()
	defer attachMu.Unlock()
	next := map[*actor.ActorSystem]*Injector{system: inj}
	if cur := attached.Load(); cur != nil {
		for s, i := range *cur {
			if s != system {
				next[s] = i
			}
		}
	}
	attached.Store(&next)
}

// detach removes system's injector (only if it is inj, when inj ≠ nil).
func detach(system *actor.ActorSystem, inj *Injector) {
	attachMu.Lock()
	defer attachMu.Unlock()
	cur := attached.Load()
	if cur == nil {
		return
	}
	if got, ok := (*cur)[system]; !ok || (inj != nil && got != inj) {
		return
	}
	if len(*cur) == 1 {
		attached.Store(nil)
		return
	}
	next := make(map[*actor.ActorSystem]*Injector, len(*cur)-1)
	for s, i := range *cur {
		if s != system {
			next[s] = i
		}
	}
	attached.Store(&next)
}

// receive is the Faults middleware with an injector attached.
func (inj *Injector) receive(ctx actor.ReceiverContext, env *actor.MessageEnvelope, next actor.ReceiverFunc) {
	target := ctx.Self().Id
	switch m := env.Message.(type) {
	case *InjectPanic:
		inj.cfg.Ledger.Record(inj.cfg.Ledger.Next(target+" "+inj.typeName(m)), Decision{Kind: FaultPanic})
		panic(fmt.Sprintf("injected fault: %s", m.Reason))
	case *redelivery:
		if m.hold != 0 {
			if h := inj.unhold(target, m.hold); h != nil {
				next(ctx, h)
			}
			return
		}
		next(ctx, m.env)
		return
	}
	if infrastructure(env.Message) {
		next(ctx, env)
		return
	}
	d := inj.decide(target, env.Message)
	switch d.Kind {
	case FaultDrop:
	case FaultDelay:
		inj.later(ctx, d.Delay, func(uint64) *redelivery { return &redelivery{env: env} })
	case FaultReorder:
		inj.hold(ctx, target, env) // released after the next message, or by its timer
		return
	case FaultDuplicate:
		next(ctx, env)
		next(ctx, env)
	case FaultPanic:
		next(ctx, env)
		inj.release(ctx, target, next)
		panic(fmt.Sprintf("injected fault: panic after %T", env.Message))
	default:
		next(ctx, env)
	}
	inj.release(ctx, target, next)
}

// decide runs the rules for one delivery and records what is injected. A
// reorder while a message is already held for the target, or a panic
// within PanicSpacing of the last, is not injected (nor recorded).
func (inj *Injector) decide(target string, msg any) Decision {
	rules := inj.rules.Active()
	if len(rules) == 0 {
		return Decision{}
	}
	typ := inj.typeName(msg)
	p := inj.cfg.Ledger.Next(target + " " + typ)
	var d Decision
	for _, r := range rules {
		if d = r(Delivery{Target: target, Type: typ, Msg: msg, Point: p}); !d.None() {
			break
		}
	}
	if !inj.admit(target, d) {
		return Decision{}
	}
	inj.cfg.Ledger.Record(p, d)
	return d
}

func (inj *Injector) admit(target string, d Decision) bool {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	if inj.closed {
		return false
	}
	switch d.Kind {
	case FaultDrop, FaultDelay, FaultDuplicate:
		return true
	case FaultReorder:
		if inj.held[target] != nil {
			return false
		}
		// NB: reserved now, armed by hold below, so a second reorder
		// decided meanwhile for this target is refused.
		inj.held[target] = &heldMessage{}
		return true
	case FaultPanic:
		now := inj.cfg.Clock.Now()
		if last, ok := inj.lastPanic[target]; ok && inj.cfg.PanicSpacing > 0 && now.Sub(last) < inj.cfg.PanicSpacing {
			return false
		}
		inj.lastPanic[target] = now
		return true
	}
	return false
}

// later sends the redelivery build makes (given its timer id) to the
// actor after d, through its mailbox; 0 once the injector closed.
func (inj *Injector) later(ctx actor.ReceiverContext, d time.Duration, build func(id uint64) *redelivery) uint64 {
	self, root := ctx.Self(), ctx.ActorSystem().Root
	inj.mu.Lock()
	defer inj.mu.Unlock()
	if inj.closed {
		inj.lost++
		return 0
	}
	inj.seq++
	id := inj.seq
	r := build(id)
	// NB: armed under the lock, so fired (which takes it) cannot run before
	// the timer is in the map.
	inj.timers[id] = inj.cfg.Clock.AfterFunc(d, func() {
		if inj.fired(id) {
			root.Send(self, r)
		}
	})
	return id
}

// fired forgets a timer that went off; false once the injector closed.
func (inj *Injector) fired(id uint64) bool {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	if inj.closed {
		return false
	}
	delete(inj.timers, id)
	return true
}

// hold keeps a reordered message (decide reserved its place) until the
// next message to target, or its hold timer.
func (inj *Injector) hold(ctx actor.ReceiverContext, target string, env *actor.MessageEnvelope) {
	id := inj.later(ctx, inj.cfg.MaxHold, func(id uint64) *redelivery { return &redelivery{hold: id} })
	inj.mu.Lock()
	defer inj.mu.Unlock()
	switch h := inj.held[target]; {
	case id == 0: // closed meanwhile: the message is lost (counted)
		delete(inj.held, target)
	case h != nil:
		h.env, h.timer = env, id
	}
}

// unhold takes the held message of target if the flush id is its own.
func (inj *Injector) unhold(target string, id uint64) *actor.MessageEnvelope {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	h := inj.held[target]
	if h == nil || h.timer != id {
		return nil
	}
	delete(inj.held, target)
	return h.env
}

// release delivers target's held message, if any, after the one just
// handled.
func (inj *Injector) release(ctx actor.ReceiverContext, target string, next actor.ReceiverFunc) {
	inj.mu.Lock()
	h := inj.held[target]
	if h == nil || h.env == nil {
		inj.mu.Unlock()
		return
	}
	delete(inj.held, target)
	if t := inj.timers[h.timer]; t != nil {
		t.Stop()
		delete(inj.timers, h.timer)
	}
	inj.mu.Unlock()
	next(ctx, h.env)
}

func (inj *Injector) typeName(msg any) string {
	t := reflect.TypeOf(msg)
	if s, ok := inj.types.Load(t); ok {
		return s.(string)
	}
	s := fmt.Sprintf("%T", msg)
	inj.types.Store(t, s)
	return s
}

// infrastructure reports protoactor's own lifecycle and system messages,
// which are never perturbed.
func infrastructure(m any) bool {
	switch m.(type) {
	case actor.SystemMessage, actor.AutoReceiveMessage, actor.InfrastructureMessage, actor.MailboxMessage:
		return true
	}
	return false
}

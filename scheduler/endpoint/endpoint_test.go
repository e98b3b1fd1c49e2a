package endpoint

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
	"github.com/kvtier/kvtier/supervision"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// stallingBridge is a bridge that hands every Lookup to the test instead
// of answering it (a stalled bridge cannot be produced for real on demand),
// and releases sessions at once.
type stallingBridge struct{ lookups chan<- *messages.Lookup }

func (b stallingBridge) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *messages.Lookup:
		b.lookups <- m
	case *messages.ReleaseSession:
		m.Reply.Answer(messages.SessionReleased{Requests: len(m.Open)}, nil)
	}
}

// rawSession is an engine speaking frames on the endpoint's unix socket.
type rawSession struct {
	t    testing.TB
	conn net.Conn
	id   uint64
}

// call sends q and reads the next frame, which must be q's reply.
func (s *rawSession) call(q *wire.Request) *wire.Reply {
	s.t.Helper()
	s.send(q)
	rp := s.next(q.Op)
	require.Equal(s.t, q.ID, rp.ID, "the next frame answers %s", q.Op)
	return rp
}

func (s *rawSession) send(q *wire.Request) {
	s.t.Helper()
	s.id++
	q.ID = s.id
	require.NoError(s.t, wire.WriteFrame(s.conn, wire.EncodeRequest(q)))
}

// next reads the next frame, as a reply to op.
func (s *rawSession) next(op wire.Op) *wire.Reply {
	s.t.Helper()
	require.NoError(s.t, s.conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	frame, err := wire.ReadFrame(s.conn)
	require.NoError(s.t, err)
	rp, err := wire.DecodeReply(frame, op)
	require.NoError(s.t, err)
	return rp
}

// stalled starts an endpoint on a unix socket in front of a stalling
// bridge, its timers on a manual clock, and says hello: the session, the
// Lookups the bridge got, the clock.
func stalled(t *testing.T) (*rawSession, <-chan *messages.Lookup, *supervision.ManualClock) {
	system := actor.NewActorSystem()
	t.Cleanup(system.Shutdown)
	lookups := make(chan *messages.Lookup, 256)
	bridge := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return stallingBridge{lookups: lookups} }))
	clock := supervision.NewManualClock(time.Unix(1, 0))
	e, err := New(Config{Listen: ListenOptions{Addr: "unix://" + filepath.Join(t.TempDir(), "e.sock")},
		Clock: clock, Grace: time.Hour, CallTimeout: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	e.Start(system, system.Root.Spawn(e.Props()), bridge)
	conn, err := net.Dial("unix", strings.TrimPrefix(e.Addr(), "unix://"))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	s := &rawSession{t: t, conn: conn}
	require.Nil(t, s.call(&wire.Request{Op: wire.OpHello, Client: "test"}).Err)
	return s, lookups, clock
}

var twoKeys = []messages.Key{{Namespace: "ns", Hash: "a"}, {Namespace: "ns", Hash: "b"}}

// A call the bridge does not answer within its timeout is answered
// TIMEOUT by the endpoint, and counted as over: the session can still be
// released. The bridge's late answer then sends nothing.
func TestEndpointAnswersACallTheBridgeNeverAnswers(t *testing.T) {
	s, lookups, clock := stalled(t)
	s.send(&wire.Request{Op: wire.OpLookup, Req: &messages.ReqContext{RequestID: "r"}, Keys: twoKeys, Timeout: time.Second})
	late := <-lookups // NB: the call's timer is armed before the bridge has it
	clock.Advance(time.Second)
	rp := s.next(wire.OpLookup)
	require.NotNil(t, rp.Err, "the timer answers")
	require.Equal(t, wire.CodeTimeout, rp.Err.Code)
	late.Reply.Answer([]messages.LookupStatus{messages.Hit, messages.Hit}, nil) // NB: synchronous: a reply would be queued now

	require.Nil(t, s.call(&wire.Request{Op: wire.OpPing}).Err, "the next frame is the ping's: the late answer sent nothing")
	bye := s.call(&wire.Request{Op: wire.OpBye})
	require.Nil(t, bye.Err, "released: the timed-out call was counted as over")
	require.Equal(t, 1, bye.Released.Requests, "with the request the lookup opened")
}

// An answer in time is the reply, and the call's timer then answers
// nothing.
func TestEndpointRepliesWithTheBridgesAnswer(t *testing.T) {
	s, lookups, clock := stalled(t)
	s.send(&wire.Request{Op: wire.OpLookup, Req: &messages.ReqContext{RequestID: "r"}, Keys: twoKeys, Timeout: time.Second})
	(<-lookups).Reply.Answer([]messages.LookupStatus{messages.Hit, messages.Miss}, nil)
	rp := s.next(wire.OpLookup)
	require.Nil(t, rp.Err)
	require.Equal(t, []messages.LookupStatus{messages.Hit, messages.Miss}, rp.Status)

	clock.Advance(time.Minute) // past the call's timeout: its timer was stopped
	require.Nil(t, s.call(&wire.Request{Op: wire.OpPing}).Err, "the next frame is the ping's: no TIMEOUT")
	require.Nil(t, s.call(&wire.Request{Op: wire.OpBye}).Err)
}

// answeringBridge answers every Lookup at once, all HITs.
type answeringBridge struct{}

func (answeringBridge) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *messages.Lookup:
		m.Reply.Answer(make([]messages.LookupStatus, len(m.Keys)), nil)
	case *messages.ReleaseSession:
		m.Reply.Answer(messages.SessionReleased{}, nil)
	}
}

// BenchmarkEndpointLookupRoundTrip is one engine's 16-key Lookups, one at a
// time, over the unix transport, against a bridge that answers at once:
// the endpoint's own hops (reader, actor, reply, writer), no tier; the
// actors' mailboxes on protoactor's default dispatcher (a new goroutine per
// activation) and on the node's (actors.WarmDispatcher), the connection
// read plainly or polled for SuggestedEnginePoll after each reply (pollConn:
// with the client in the same process, polling makes it slower).
func BenchmarkEndpointLookupRoundTrip(b *testing.B) {
	b.Run("goroutine-per-activation", func(b *testing.B) { benchRoundTrip(b, 0) })
	for _, poll := range []time.Duration{0, SuggestedEnginePoll} {
		name := "warm-pool"
		if poll > 0 {
			name += "-polled"
		}
		b.Run(name, func(b *testing.B) {
			d := actors.NewWarmDispatcher(actors.WarmWorkers, actors.Throughput)
			defer func() { _ = d.Close(context.Background()) }()
			benchRoundTrip(b, poll, actor.WithDispatcher(d))
		})
	}
}

func benchRoundTrip(b *testing.B, poll time.Duration, opts ...actor.PropsOption) {
	system := actor.NewActorSystem()
	defer system.Shutdown()
	bridge := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return answeringBridge{} }, opts...))
	e, err := New(Config{Listen: ListenOptions{Addr: "unix://" + filepath.Join(b.TempDir(), "e.sock"), Poll: poll},
		Grace: time.Hour, CallTimeout: time.Hour})
	require.NoError(b, err)
	defer e.Close()
	e.Start(system, system.Root.Spawn(e.Props().Configure(opts...)), bridge)
	conn, err := net.Dial("unix", strings.TrimPrefix(e.Addr(), "unix://"))
	require.NoError(b, err)
	defer conn.Close()
	s := &rawSession{t: b, conn: conn}
	s.call(&wire.Request{Op: wire.OpHello, Client: "bench"})
	keys := make([]messages.Key, 16)
	for i := range keys {
		keys[i] = messages.Key{Namespace: "ns", Hash: string(rune('a' + i))}
	}
	q := &wire.Request{Op: wire.OpLookup, Req: &messages.ReqContext{RequestID: "r"}, Keys: keys}
	b.ResetTimer()
	for range b.N {
		s.call(q)
	}
}

// A batch's calls are served one by one, in order, each answered as if it
// had come alone; a quiet call is answered only when it fails, its error
// naming the op.
func TestEndpointServesABatchCallByCall(t *testing.T) {
	s, lookups, _ := stalled(t)
	req := &messages.ReqContext{RequestID: "r"}
	s.send(&wire.Request{Op: wire.OpBatch, Calls: []wire.Call{
		{Req: &wire.Request{Op: wire.OpLookup, ID: 101, Req: req, Keys: twoKeys, Quiet: true}},
		{Req: &wire.Request{Op: wire.OpLookup, ID: 102, Req: req, Keys: twoKeys}},
		{Req: &wire.Request{Op: wire.OpLookup, ID: 103, Req: req, Keys: twoKeys, Quiet: true}},
	}})
	first := <-lookups
	require.Equal(t, "r", stripSession(first.Req.RequestID))
	first.Reply.Answer([]messages.LookupStatus{messages.Hit, messages.Hit}, nil)
	(<-lookups).Reply.Answer([]messages.LookupStatus{messages.Miss, messages.Miss}, nil)
	rp := s.next(wire.OpLookup)
	require.EqualValues(t, 102, rp.ID, "the quiet call that succeeded sent nothing")
	require.Equal(t, []messages.LookupStatus{messages.Miss, messages.Miss}, rp.Status)

	(<-lookups).Reply.Answer(nil, messages.ErrBusy)
	rp = s.next(wire.OpLookup)
	require.EqualValues(t, 103, rp.ID, "the quiet call that failed is answered")
	require.NotNil(t, rp.Err)
	require.Equal(t, wire.CodeBusy, rp.Err.Code)
	require.Nil(t, s.call(&wire.Request{Op: wire.OpPing}).Err)
	require.Nil(t, s.call(&wire.Request{Op: wire.OpBye}).Err)
}

// TestEveryEngineOpHasARoute: each op of the wire's table but the
// session's own reaches the bridge through a route, and no route serves an
// op the table lacks.
func TestEveryEngineOpHasARoute(t *testing.T) {
	session := map[wire.Op]bool{wire.OpHello: true, wire.OpPing: true, wire.OpBye: true, wire.OpBatch: true}
	n := 0
	for o := wire.Op(1); !strings.HasPrefix(o.String(), "op("); o++ {
		n++
		_, routed := routes[o]
		require.Equal(t, !session[o], routed, "op %s", o)
	}
	require.Equal(t, n, len(routes)+len(session), "routes for ops the table lacks")
}

// Calls in flight cost no goroutine and no timer each: their deadlines are
// one heap with one timer armed for the earliest. Each ends once: the
// answered ones with their answers, the rest with TIMEOUT in deadline
// order, and answers that come after that send nothing.
func TestCallsInFlightCostNoGoroutineOrTimerEach(t *testing.T) {
	s, lookups, clock := stalled(t)
	const n = 200
	before := runtime.NumGoroutine()
	for i := range n {
		// NB: later calls expire earlier, so the heap, not the order sent,
		// decides which times out first.
		s.send(&wire.Request{Op: wire.OpLookup, Req: &messages.ReqContext{RequestID: fmt.Sprint("r", i)},
			Keys: twoKeys, Timeout: time.Second + time.Duration(n-i)*time.Millisecond})
	}
	asked := make([]*messages.Lookup, n)
	for i := range asked {
		asked[i] = <-lookups
	}
	require.Less(t, runtime.NumGoroutine()-before, n/4, "no goroutine per call in flight")
	require.LessOrEqual(t, clock.Pending(), 2, "one deadline timer (and the session's liveness timer)")

	for _, lk := range asked[:n/2] {
		lk.Reply.Answer([]messages.LookupStatus{messages.Hit, messages.Miss}, nil)
	}
	for i := range n / 2 {
		rp := s.next(wire.OpLookup)
		require.Nil(t, rp.Err)
		require.Equal(t, uint64(i+2), rp.ID, "answers in the order they came") // NB: the hello was 1
	}
	clock.Advance(time.Second + n*time.Millisecond)
	for i := n - 1; i >= n/2; i-- {
		rp := s.next(wire.OpLookup)
		require.NotNil(t, rp.Err)
		require.Equal(t, wire.CodeTimeout, rp.Err.Code)
		require.Equal(t, uint64(i+2), rp.ID, "the earliest deadline first")
	}
	for _, lk := range asked[n/2:] {
		lk.Reply.Answer([]messages.LookupStatus{messages.Hit, messages.Hit}, nil)
	}
	require.Nil(t, s.call(&wire.Request{Op: wire.OpPing}).Err, "the next frame is the ping's: late answers sent nothing")
	require.Equal(t, 1, clock.Pending(), "no deadline timer left, only the session's liveness timer")
}

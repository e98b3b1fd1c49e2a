package endpoint

import (
	"maps"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// routes: for each engine op, the bridge message a decoded call becomes
// and how the bridge's answer fills the wire reply (whose fields the op's
// row in scheduler/wire's op table encodes). hello, ping, bye and batch
// are the session's own (actor.go), not routed. The routes of calls that
// only carry the call are generated from the op table (routes_gen.go);
// ownRoutes are those that do more, and the credit calls beyond
// engine.Manager.
var routes = func() map[wire.Op]func(c *call) {
	all := maps.Clone(generatedRoutes)
	for op, r := range ownRoutes {
		if _, dup := all[op]; dup {
			panic("endpoint: op " + op.String() + " has a generated route and its own")
		}
		all[op] = r
	}
	return all
}()

var ownRoutes = map[wire.Op]func(c *call){
	wire.OpLookup: func(c *call) {
		var lk *messages.Lookup
		s, wants := c.s, c.q.WantSlots
		// NB: with several block sizes the slots are asked for anyway: a
		// HIT in another size's slots is answered MISS (Geometry.numbers).
		slots := wants || c.a.ep.mixedGeometries()
		via(c, func(r messages.Reply[[]messages.LookupStatus]) any {
			lk = &messages.Lookup{Req: c.req, Keys: c.q.Keys, Prefix: c.q.Prefix, Reply: r, WantSlots: slots}
			return lk
		}, func(rp *wire.Reply, v []messages.LookupStatus) {
			rp.Status = v
			if slots {
				rp.Slots = lk.Slots // NB: written before the answer was sent
				if rp.Slots == nil {
					rp.Slots = []int{}
				}
				s.geometry.lookupNumbers(rp)
			}
			if !wants {
				rp.Slots = nil
			}
			countLookup(s, rp.Status)
		})
	},
	wire.OpGrant: func(c *call) {
		via(c, func(r messages.Reply[messages.CreditGrant]) any {
			return &messages.Grant{Session: c.s.id, N: c.q.N, BlockBytes: c.s.geometry.BlockBytes, Reply: r}
		}, func(rp *wire.Reply, v messages.CreditGrant) { rp.Slots, rp.Evicted = v.Slots, v.Evicted })
	},
	wire.OpStoreCredited: func(c *call) {
		via(c, func(r messages.Reply[messages.StoreBound]) any {
			return &messages.StoreCredited{Req: c.req, Session: c.s.id, Keys: c.q.Keys, Slots: c.s.geometry.ids(c.q.Slots), Reply: r}
		}, func(rp *wire.Reply, v messages.StoreBound) { rp.Job, rp.Bound, rp.Workers = v.Job, v.Bound, v.Workers })
	},
	wire.OpResetCache: func(c *call) {
		// As the embedded manager does: the drain ends (and reaps) before
		// the caller's deadline, on the node's clock.
		deadline := c.a.ep.cfg.NodeClock.Now().Add(c.timeout * 9 / 10)
		via(c, func(r messages.Reply[struct{}]) any { return &messages.ResetCache{Deadline: deadline, Reply: r} }, noFill)
	},
	wire.OpStats: func(c *call) {
		open := len(c.s.open) // NB: read here, in the actor: the session's table is its state
		calls := c.s.inflight // NB: before this call counts itself
		engines := c.a.t.engines()
		via(c, func(r messages.Reply[messages.Stats]) any { return &messages.GetStats{Reply: r} },
			func(rp *wire.Reply, v messages.Stats) {
				rp.Stats = v
				rp.Stats.SessionOpen, rp.Stats.SessionCalls, rp.Stats.Sessions = open, calls, len(engines)
				rp.Stats.Engines = engines
			})
	},
}

// The fills of the kinds of answer the generated routes carry
// (scheduler/wire/ops.go, type result): each writes a successful reply's
// fields from the bridge's answer.

func noFill(*wire.Reply, struct{}) {}

func fillLoadJob(rp *wire.Reply, v messages.LoadJob) {
	rp.Job, rp.Slots, rp.Workers = v.ID, v.Slots, v.Workers
}

func fillStorePlan(rp *wire.Reply, v messages.StorePlan) {
	rp.Job, rp.Slots, rp.Workers, rp.ToStore, rp.Evicted = v.Job, v.Slots, v.Workers, v.ToStore, v.Evicted
}

func fillEvents(rp *wire.Reply, v []messages.Event) { rp.Events = v }

func fillPending(rp *wire.Reply, v bool) { rp.Pending = v }

// call is one decoded engine call on its way to the bridge: what a route
// reads. It lives for the route's run, inside the endpoint actor.
type call struct {
	a       *endpointActor
	ctx     actor.Context
	peer    string
	s       *session
	q       *wire.Request
	req     *messages.ReqContext // q.Req with the session's prefix, or nil
	timeout time.Duration
}

// via builds the call's bridge message around a reply that comes back to
// the endpoint actor as a message (answered), records the call and its
// deadline in the endpoint's calls in flight (first: the deadline runs from
// before the bridge can have it) and sends it — unless the endpoint is
// closing and nobody would read the answer. No goroutine or timer per call.
func via[T any](c *call, build func(messages.Reply[T]) any, fill func(*wire.Reply, T)) {
	a := c.a
	if a.ep.closed.Load() {
		return
	}
	f := a.begin(c)
	root, self, id, q := c.ctx.ActorSystem().Root, c.ctx.Self(), f.id, c.q
	reply := messages.ReplyFunc(func(r messages.Result[T]) {
		// NB: on the bridge's goroutine: only a message; the endpoint
		// actor encodes.
		root.Send(self, &answered{id: id, encode: func() ([]byte, bool) {
			if r.Err != nil {
				return wire.EncodeCallError(q.ID, q.Op, r.Err), q.RepliesOnError()
			}
			if !q.Replies() {
				return nil, false
			}
			rp := &wire.Reply{ID: q.ID}
			fill(rp, r.Value)
			if err := c.s.geometry.numbers(q.Op, rp); err != nil {
				return wire.EncodeCallError(q.ID, q.Op, err), q.RepliesOnError()
			}
			return wire.EncodeReply(q.Op, rp, stripSession), true
		}})
	})
	c.ctx.Send(a.ep.cfg.Bridge, build(reply))
}

// countLookup adds a lookup's keys and HITs to its session's counts (in
// the endpoint actor, as its answer is encoded).
func countLookup(s *session, st []messages.LookupStatus) {
	hits := 0
	for _, x := range st {
		if x == messages.Hit {
			hits++
		}
	}
	s.lookups.Add(uint64(len(st)))
	s.hits.Add(uint64(hits))
}

package tiering

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
)

type replyKind uint8

const (
	replyLookup replyKind = iota + 1
	replyReserve
	replyRead
	replyReadBatch
	replyCommit
	replyPin
	replyWrite
	replyStats
)

type pendingReply struct {
	kind  replyKind
	batch *batch
	tier  int
	prom  *promotion
	idx   int // key index within the promotion, or the pinned key
	cas   *cascade
	key   messages.Key
	stats *statsGather
}

// request sends msg built with a fresh corr to pid, remembering what its
// answer belongs to.
func (a *Actor) request(ctx actor.Context, pid *actor.PID, p pendingReply, build func(corr uint64) any) {
	a.corr++
	a.pending[a.corr] = p
	ctx.Request(pid, build(a.corr))
}

// answer hands reply m to on with what its request belongs to, once; an
// answer nothing waits for (its batch resolved at a deadline, its corr
// forgotten) is dropped here, so no handler sees it.
func answer[M any](a *Actor, ctx actor.Context, corr uint64, kind replyKind, m M, on func(actor.Context, pendingReply, M)) {
	if p, ok := a.take(corr, kind); ok {
		on(ctx, p, m)
	}
}

func (a *Actor) take(corr uint64, kind replyKind) (pendingReply, bool) {
	p, ok := a.pending[corr]
	if !ok || p.kind != kind {
		return pendingReply{}, false
	}
	delete(a.pending, corr)
	return p, true
}

// after sends the actor msg once d has passed on its clock: a deadline
// that ends a batch or a job, never a wait inside a handler.
func (a *Actor) after(ctx actor.Context, d time.Duration, msg any) supervision.Timer {
	self, root := ctx.Self(), ctx.ActorSystem().Root
	return a.cfg.Clock.AfterFunc(d, func() { root.Send(self, msg) })
}

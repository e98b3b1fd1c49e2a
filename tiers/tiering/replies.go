package tiering

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/messages"
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

func (a *Actor) take(corr uint64, kind replyKind) (pendingReply, bool) {
	p, ok := a.pending[corr]
	if !ok || p.kind != kind {
		return pendingReply{}, false
	}
	delete(a.pending, corr)
	return p, true
}

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
func (s *State) request(fx Effects, pid *actor.PID, p pendingReply, build func(corr uint64) any) {
	s.corr++
	s.pending[s.corr] = p
	fx.Request(pid, build(s.corr))
}

// answer hands reply m to on with what its request belongs to, once; an
// answer nothing waits for (its batch resolved at a deadline, its corr
// forgotten) is dropped here, so no handler sees it.
func answer[M any](s *State, fx Effects, corr uint64, kind replyKind, m M, on func(Effects, pendingReply, M)) {
	if p, ok := s.take(corr, kind); ok {
		on(fx, p, m)
	}
}

func (s *State) take(corr uint64, kind replyKind) (pendingReply, bool) {
	p, ok := s.pending[corr]
	if !ok || p.kind != kind {
		return pendingReply{}, false
	}
	delete(s.pending, corr)
	return p, true
}

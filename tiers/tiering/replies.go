package tiering

import (
	"github.com/kvtier/kvtier/actors/fx"
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

// reply answers a call the core held, through o: in order with the
// messages decided before it, so a caller that waits on the answer finds
// them sent (an idle probe answered before the commits it waited for were
// sent saw blocks still pending).
func reply[T any](o *fx.Out, r messages.Reply[T], v T, err error) { o.Answer(r, v, err) }

// request sends msg built with a fresh corr to to, remembering what its
// answer belongs to.
func (s *State) request(o *fx.Out, to fx.Ref, p pendingReply, build func(corr uint64) any) {
	s.corr++
	s.pending[s.corr] = p
	o.Request(to, build(s.corr))
}

// answer hands reply m to on with what its request belongs to, once; an
// answer nothing waits for (its batch resolved at a deadline, its corr
// forgotten) is dropped here, so no handler sees it.
func answer[M any](s *State, o *fx.Out, corr uint64, kind replyKind, m M, on func(*fx.Out, pendingReply, M)) {
	if p, ok := s.take(corr, kind); ok {
		on(o, p, m)
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

package node

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/cpu"
)

// embedded is the in-process Manager: each call is one message to the
// bridge carrying a buffered reply channel, awaited with the caller's
// deadline (or the node's call timeout when ctx has none). Its methods
// are generated from the op table (embedded_gen.go) but for the two here
// that do more than carry the call: a lookup's latency, a reset's drain
// deadline.
type embedded struct{ node *Node }

var _ Manager = (*embedded)(nil)

// call sends the message build makes to the bridge and waits for its answer.
func call[T any](ctx context.Context, n *Node, build func(messages.Reply[T]) any) (T, error) {
	return callActor(ctx, n, n.bridge, "kvtier call", build)
}

// callActor sends the message build makes to pid and waits for its answer
// with the caller's deadline (or the node's call timeout when ctx has none).
func callActor[T any](ctx context.Context, n *Node, pid *actor.PID, what string, build func(messages.Reply[T]) any) (T, error) {
	var zero T
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.CallTimeout)
		defer cancel()
	}
	select {
	case <-n.stopped:
		return zero, fmt.Errorf("%s: %w", what, messages.ErrClosed)
	default:
	}
	reply := messages.NewReply[T]()
	n.system.Root.Send(pid, build(reply))
	select {
	case r := <-reply.C():
		return r.Value, r.Err
	case <-ctx.Done():
		return zero, fmt.Errorf("%s: %w", what, ctx.Err())
	case <-n.stopped:
		// A reply sent before the actors stopped is still the answer.
		select {
		case r := <-reply.C():
			return r.Value, r.Err
		default:
			return zero, fmt.Errorf("%s: %w", what, messages.ErrClosed)
		}
	}
}

// intake refuses engine calls once Close began.
func (m *embedded) intake() error {
	select {
	case <-m.node.closing:
		return messages.ErrClosed
	default:
		return nil
	}
}

// Lookup implements engine.Manager, observing its latency.
func (m *embedded) Lookup(ctx context.Context, req *messages.ReqContext, keys []messages.Key, prefix bool) ([]messages.LookupStatus, error) {
	if err := m.intake(); err != nil {
		return nil, err
	}
	start := time.Now()
	st, err := call(ctx, m.node, func(r messages.Reply[[]messages.LookupStatus]) any {
		return &messages.Lookup{Req: req, Keys: keys, Prefix: prefix, Reply: r}
	})
	m.node.metrics.LookupLatency.Observe(time.Since(start).Seconds())
	return st, err
}

// ResetCache implements engine.Manager: the drain ends before ctx's
// deadline, on the node's clock.
func (m *embedded) ResetCache(ctx context.Context) error {
	deadline := m.node.drainDeadline(ctx)
	_, err := call(ctx, m.node, func(r messages.Reply[struct{}]) any {
		return &messages.ResetCache{Deadline: deadline, Reply: r}
	})
	return err
}

func (m *embedded) Pool() SlotMemory { return m.node.pool }

var _ SlotMemory = (*cpu.Pool)(nil)

// drainDeadline turns ctx's deadline into the node clock's time, keeping a
// margin so the drain ends (and reaps) before the caller gives up. Without
// a deadline the drain gets half the call timeout.
func (n *Node) drainDeadline(ctx context.Context) time.Time {
	left := n.cfg.CallTimeout / 2
	if d, ok := ctx.Deadline(); ok {
		left = time.Until(d) * 9 / 10
	}
	return n.cfg.Clock.Now().Add(left)
}

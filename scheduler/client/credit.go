package client

import (
	"context"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// The calls of an engine that does not wait on the daemon in its scheduler
// step (docs/VLLM.md, "The scheduler step"): slot credit for stores, and
// lookups that answer each HIT's slot. They are beyond engine.Manager.

// Grant asks for n more slots of credit for this session's stores; the
// daemon grants fewer when its tier is held (pinned, leased, written).
func (c *Client) Grant(ctx context.Context, n int) (messages.CreditGrant, error) {
	rp, err := c.do(ctx, &wire.Request{Op: wire.OpGrant, N: n})
	if err != nil {
		return messages.CreditGrant{}, err
	}
	if err := c.checkSlots(wire.OpGrant, rp.Slots, len(rp.Slots)); err != nil {
		return messages.CreditGrant{}, err
	}
	return messages.CreditGrant{Slots: rp.Slots, Evicted: rp.Evicted}, nil
}

// StoreCredited opens a store job over credited slots (slots[i] for
// keys[i]) that the engine is already copying into.
func (c *Client) StoreCredited(ctx context.Context, req *messages.ReqContext, keys []messages.Key, slots []int) (messages.StoreBound, error) {
	rp, err := c.do(ctx, &wire.Request{Op: wire.OpStoreCredited, Req: req, Keys: keys, Slots: slots})
	if err != nil {
		return messages.StoreBound{}, err
	}
	if len(rp.Bound) != len(keys) {
		return messages.StoreBound{}, wireErr(wire.OpStoreCredited, "%d answers for %d keys", len(rp.Bound), len(keys))
	}
	return messages.StoreBound{Job: rp.Job, Bound: rp.Bound, Workers: rp.Workers}, nil
}

// LookupSlots is Lookup that also answers each HIT's slot (0 for the
// others), so the engine may load from its leased HITs before its pin.
func (c *Client) LookupSlots(ctx context.Context, req *messages.ReqContext, keys []messages.Key, prefix bool) ([]messages.LookupStatus, []int, error) {
	rp, err := c.do(ctx, &wire.Request{Op: wire.OpLookup, Req: req, Keys: keys, Prefix: prefix, WantSlots: true})
	if err != nil {
		return nil, nil, err
	}
	if len(rp.Status) != len(keys) {
		return nil, nil, wireErr(wire.OpLookup, "%d answers for %d keys", len(rp.Status), len(keys))
	}
	if err := c.checkSlots(wire.OpLookup, rp.Slots, len(keys)); err != nil {
		return nil, nil, err
	}
	return rp.Status, rp.Slots, nil
}

package client

import (
	"context"

	"github.com/kvtier/kvtier/engine"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// The manager API over the socket: one request, one reply per call, the
// same semantics and errors as the embedded node. The methods are
// generated from the op table (manager_gen.go); what is written here is
// each kind of answer's reading of its reply, checked against the
// request (scheduler/wire/ops.go, type result).

var _ engine.Manager = (*Client)(nil)

func (c *Client) unpackStatus(q *wire.Request, rp *wire.Reply) ([]messages.LookupStatus, error) {
	if len(rp.Status) != len(q.Keys) {
		return nil, wireErr(q.Op, "%d answers for %d keys", len(rp.Status), len(q.Keys))
	}
	return rp.Status, nil
}

func (c *Client) unpackLoadJob(q *wire.Request, rp *wire.Reply) (messages.LoadJob, error) {
	if err := c.checkSlots(q.Op, rp.Slots, len(q.Keys)); err != nil {
		return messages.LoadJob{}, err
	}
	return messages.LoadJob{ID: rp.Job, Slots: rp.Slots, Workers: rp.Workers}, nil
}

func (c *Client) unpackStorePlan(q *wire.Request, rp *wire.Reply) (messages.StorePlan, error) {
	if err := c.checkSlots(q.Op, rp.Slots, len(rp.ToStore)); err != nil {
		return messages.StorePlan{}, err
	}
	if len(rp.ToStore) == 0 {
		rp.ToStore, rp.Slots = nil, nil
	}
	if len(rp.Evicted) == 0 {
		rp.Evicted = nil
	}
	return messages.StorePlan{Job: rp.Job, ToStore: rp.ToStore, Slots: rp.Slots, Evicted: rp.Evicted, Workers: rp.Workers}, nil
}

// unpackEvents: request ids in event contexts are the ids the engine used.
func (c *Client) unpackEvents(_ *wire.Request, rp *wire.Reply) ([]messages.Event, error) {
	if len(rp.Events) == 0 {
		return nil, nil
	}
	return rp.Events, nil
}

func (c *Client) unpackPending(_ *wire.Request, rp *wire.Reply) (bool, error) {
	return rp.Pending, nil
}

func (c *Client) unpackStats(_ *wire.Request, rp *wire.Reply) (messages.Stats, error) {
	return rp.Stats, nil
}

// Ping checks the session is alive (NO_SESSION once it was released).
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.do(ctx, &wire.Request{Op: wire.OpPing})
	return err
}

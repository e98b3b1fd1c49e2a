package client

import (
	"context"

	"github.com/kvtier/kvtier/engine"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/wire"
)

// The manager API over the socket: one request, one reply per call, the
// same semantics and errors as the embedded node (manager.go).

var _ engine.Manager = (*Client)(nil)

// Lookup implements engine.Manager.
func (c *Client) Lookup(ctx context.Context, req *messages.ReqContext, keys []messages.Key, prefix bool) ([]messages.LookupStatus, error) {
	rp, err := c.do(ctx, &wire.Request{Op: wire.OpLookup, Req: req, Keys: keys, Prefix: prefix})
	if err != nil {
		return nil, err
	}
	if len(rp.Status) != len(keys) {
		return nil, wireErr(wire.OpLookup, "%d answers for %d keys", len(rp.Status), len(keys))
	}
	return rp.Status, nil
}

// PrepareLoad implements engine.Manager.
func (c *Client) PrepareLoad(ctx context.Context, req *messages.ReqContext, keys []messages.Key) (messages.LoadJob, error) {
	rp, err := c.do(ctx, &wire.Request{Op: wire.OpPrepareLoad, Req: req, Keys: keys})
	if err != nil {
		return messages.LoadJob{}, err
	}
	if err := c.checkSlots(wire.OpPrepareLoad, rp.Slots, len(keys)); err != nil {
		return messages.LoadJob{}, err
	}
	return messages.LoadJob{ID: rp.Job, Slots: rp.Slots, Workers: rp.Workers}, nil
}

// Touch implements engine.Manager.
func (c *Client) Touch(ctx context.Context, req *messages.ReqContext, keys []messages.Key) error {
	_, err := c.do(ctx, &wire.Request{Op: wire.OpTouch, Req: req, Keys: keys})
	return err
}

// CompleteLoad implements engine.Manager.
func (c *Client) CompleteLoad(ctx context.Context, req *messages.ReqContext, keys []messages.Key) error {
	_, err := c.do(ctx, &wire.Request{Op: wire.OpCompleteLoad, Req: req, Keys: keys})
	return err
}

// PrepareStore implements engine.Manager.
func (c *Client) PrepareStore(ctx context.Context, req *messages.ReqContext, keys []messages.Key) (messages.StorePlan, error) {
	rp, err := c.do(ctx, &wire.Request{Op: wire.OpPrepareStore, Req: req, Keys: keys})
	if err != nil {
		return messages.StorePlan{}, err
	}
	if err := c.checkSlots(wire.OpPrepareStore, rp.Slots, len(rp.ToStore)); err != nil {
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

// CompleteStore implements engine.Manager.
func (c *Client) CompleteStore(ctx context.Context, req *messages.ReqContext, keys []messages.Key, ok bool) error {
	_, err := c.do(ctx, &wire.Request{Op: wire.OpCompleteStore, Req: req, Keys: keys, OK: ok})
	return err
}

// JobDone implements engine.Manager.
func (c *Client) JobDone(ctx context.Context, job messages.JobID, worker int, ok bool) error {
	if worker < 0 || worker >= wire.MaxWorkers {
		// NB: the wire cannot carry it; answer as the node would.
		return wireErrIs(messages.ErrBadWorker, wire.OpJobDone, "worker %d", worker)
	}
	_, err := c.do(ctx, &wire.Request{Op: wire.OpJobDone, Job: job, Worker: worker, OK: ok})
	return err
}

// RequestFinished implements engine.Manager.
func (c *Client) RequestFinished(ctx context.Context, req *messages.ReqContext) error {
	_, err := c.do(ctx, &wire.Request{Op: wire.OpRequestFinished, Req: req})
	return err
}

// TakeEvents implements engine.Manager. Request ids in event contexts are
// the ids the engine used.
func (c *Client) TakeEvents(ctx context.Context) ([]messages.Event, error) {
	rp, err := c.do(ctx, &wire.Request{Op: wire.OpTakeEvents})
	if err != nil {
		return nil, err
	}
	if len(rp.Events) == 0 {
		return nil, nil
	}
	return rp.Events, nil
}

// HasPendingWork implements engine.Manager.
func (c *Client) HasPendingWork(ctx context.Context) (bool, error) {
	rp, err := c.do(ctx, &wire.Request{Op: wire.OpHasPendingWork})
	if err != nil {
		return false, err
	}
	return rp.Pending, nil
}

// Pause implements engine.Manager.
func (c *Client) Pause(ctx context.Context, clearCache bool) error {
	_, err := c.do(ctx, &wire.Request{Op: wire.OpPause, Clear: clearCache})
	return err
}

// Resume implements engine.Manager.
func (c *Client) Resume(ctx context.Context) error {
	_, err := c.do(ctx, &wire.Request{Op: wire.OpResume})
	return err
}

// ResetCache implements engine.Manager; the daemon drains until just before
// ctx's deadline.
func (c *Client) ResetCache(ctx context.Context) error {
	_, err := c.do(ctx, &wire.Request{Op: wire.OpResetCache})
	return err
}

// Stats implements engine.Manager.
func (c *Client) Stats(ctx context.Context) (messages.Stats, error) {
	rp, err := c.do(ctx, &wire.Request{Op: wire.OpStats})
	if err != nil {
		return messages.Stats{}, err
	}
	return rp.Stats, nil
}

// Ping checks the session is alive (NO_SESSION once it was released).
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.do(ctx, &wire.Request{Op: wire.OpPing})
	return err
}

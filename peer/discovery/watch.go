package discovery

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Why a watch ended (the watcher lists and watches again after them).
var (
	errWatchClosed = errors.New("discovery: watch closed")
	errRelist      = errors.New("discovery: registered again; listing afresh")
)

// watch is the watcher goroutine: list the members, watch from the
// listing's revision on, and list again whenever the watch breaks (a
// compacted revision, a lost leader) or the registrar asks.
func (r *Registry) watch(ctx context.Context) {
	defer r.wg.Done()
	b := backoff{min: r.cfg.RetryMin, max: r.cfg.RetryMax}
	for ctx.Err() == nil {
		watched, err := r.watchOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if watched {
			b.reset()
		}
		if errors.Is(err, errRelist) {
			continue
		}
		r.health.failed(membership, err)
		sleep(ctx, b.next())
	}
}

// watchOnce lists, then follows the watch until it fails; watched reports
// whether it got as far as watching.
func (r *Registry) watchOnce(ctx context.Context) (watched bool, err error) {
	drain(r.relist) // this listing is the fresh one asked for
	// NB: a member cut off from the cluster's leader cancels the watch
	// instead of keeping it silently open.
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	rev, err := r.list(ctx)
	if err != nil {
		return false, err
	}
	w := r.cli.Watch(ctx, r.cfg.Prefix+nodesDir, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	r.health.ok(membership)
	for {
		select {
		case resp, ok := <-w:
			if !ok {
				return true, errWatchClosed
			}
			if err := resp.Err(); err != nil {
				return true, fmt.Errorf("discovery: watch: %w", err)
			}
			r.apply(resp.Events)
		case <-r.relist:
			return true, errRelist
		case <-ctx.Done():
			return true, ctx.Err()
		}
	}
}

// list reads every member and makes the view exactly that; it returns the
// listing's revision.
func (r *Registry) list(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	resp, err := r.cli.Get(ctx, r.cfg.Prefix+nodesDir, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("discovery: list %s: %w", r.cfg.Prefix+nodesDir, err)
	}
	var members []Member
	for _, kv := range resp.Kvs {
		if m, ok := r.member(kv.Key, kv.Value); ok {
			members = append(members, m)
		}
	}
	r.update(func(v *view) []Event { return v.reset(members) })
	r.log.Debug().Int("members", len(members)).Int64("revision", resp.Header.Revision).Msg("peer discovery: listed")
	return resp.Header.Revision, nil
}

// apply folds watch events into the view. Our own key deleted while we
// run (etcd expired our lease behind our back, or someone deleted it)
// makes the registrar register again.
func (r *Registry) apply(events []*clientv3.Event) {
	for _, ev := range events {
		node, ok := nodeOf(r.cfg.Prefix, string(ev.Kv.Key))
		if !ok {
			continue
		}
		switch {
		case ev.Type == mvccpb.DELETE && node == r.cfg.Self.Node:
			signal(r.renew)
		case ev.Type == mvccpb.DELETE:
			r.update(func(v *view) []Event { return v.del(node) })
		case ev.Type == mvccpb.PUT:
			if m, ok := r.member(ev.Kv.Key, ev.Kv.Value); ok {
				r.update(func(v *view) []Event { return v.put(m) })
			}
		}
	}
}

// member decodes a member's key and record; a bad one is logged and
// skipped (it is not a node this one can dial).
func (r *Registry) member(key, value []byte) (Member, bool) {
	node, ok := nodeOf(r.cfg.Prefix, string(key))
	if !ok {
		return Member{}, false
	}
	m, err := decode(node, value)
	if err != nil {
		r.log.Warn().Err(err).Str("key", string(key)).Msg("peer discovery: skipped a bad member record")
		return Member{}, false
	}
	return m, true
}

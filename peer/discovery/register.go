package discovery

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Why a registration ended (the registrar registers again after them).
var (
	errLeaseLost = errors.New("discovery: lease lost (etcd unreachable past the ttl, or restarted without it)")
	errNoAck     = errors.New("discovery: etcd stopped answering keep-alives")
	errKeyLost   = errors.New("discovery: this node's key was deleted while it runs")
	errRace      = errors.New("discovery: this node's key changed during registration")
)

// register is the registrar goroutine: it keeps this node's key under a
// live lease, registering again under a new lease whenever the old one is
// lost, with backoff while etcd does not answer.
func (r *Registry) register(ctx context.Context, lease clientv3.LeaseID) {
	defer r.wg.Done()
	b := backoff{min: r.cfg.RetryMin, max: r.cfg.RetryMax}
	for ctx.Err() == nil {
		if lease == 0 {
			var err error
			if lease, err = r.claim(ctx); err != nil {
				r.retry(ctx, &b, err)
				continue
			}
			r.lease.Store(int64(lease))
			drain(r.renew)   // about the key this claim replaced
			signal(r.relist) // a new lease: what happened meanwhile is best listed afresh
		}
		r.registrations.Add(1)
		r.log.Info().Str("key", r.key).Dur("ttl", r.cfg.TTL).Msg("peer discovery: registered")
		b.reset()
		err := r.keepAlive(ctx, lease)
		if ctx.Err() != nil {
			return
		}
		r.health.failed(registration, err)
		// NB: once per lost lease (at most one per ttl): worth a line each.
		r.log.Info().Str("reason", err.Error()).Msg("peer discovery: registration lost; registering again under a new lease")
		lease = 0
		r.lease.Store(0)
	}
}

// retry logs a failed registration and waits its backoff.
func (r *Registry) retry(ctx context.Context, b *backoff, err error) {
	if ctx.Err() != nil {
		return
	}
	if errors.Is(err, ErrDuplicateNode) {
		// NB: after an outage another node took our id; keep trying, loudly
		// (each time: an operator must act).
		r.log.Error().Err(err).Msg("peer discovery: cannot register")
	}
	r.health.failed(registration, err)
	sleep(ctx, b.next())
}

// claim grants a lease and registers our key under it, bounded by
// cfg.Timeout. ErrDuplicateNode when another live node holds the id.
func (r *Registry) claim(ctx context.Context) (clientv3.LeaseID, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	g, err := r.cli.Grant(ctx, r.ttlSeconds())
	if err != nil {
		return 0, fmt.Errorf("discovery: grant a lease: %w", err)
	}
	if err := r.put(ctx, g.ID); err != nil {
		_, _ = r.cli.Revoke(ctx, g.ID) // NB: it would expire anyway; no key holds it
		return 0, err
	}
	return g.ID, nil
}

// put creates our key under lease, only if no key of that name exists (a
// transaction on its create revision). A key that exists is another
// node's — ErrDuplicateNode — unless it is ours from before an outage (same
// instance), which moves to the new lease.
func (r *Registry) put(ctx context.Context, lease clientv3.LeaseID) error {
	resp, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(r.key), "=", 0)).
		Then(clientv3.OpPut(r.key, r.value, clientv3.WithLease(lease))).
		Else(clientv3.OpGet(r.key)).Commit()
	if err != nil {
		return fmt.Errorf("discovery: register %s: %w", r.key, err)
	}
	if resp.Succeeded {
		return nil
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return errRace // deleted between the compare and the get: try again
	}
	held := kvs[0]
	holder, err := decode(r.cfg.Self.Node, held.Value)
	if err != nil || holder.Instance != r.cfg.Self.Instance {
		return duplicate(r.key, holder, err)
	}
	return r.takeOver(ctx, lease, held.ModRevision, clientv3.LeaseID(held.Lease))
}

// duplicate describes the live holder of our id.
func duplicate(key string, holder Member, bad error) error {
	if bad != nil {
		return fmt.Errorf("%w: %s holds a record that is not a kvtier member's (%v)", ErrDuplicateNode, key, bad)
	}
	return fmt.Errorf("%w: %s is held by the node at %s (instance %s, started %s); stop it, or wait for its lease to lapse",
		ErrDuplicateNode, key, holder.Control, holder.Instance, holder.Started.Format(time.RFC3339))
}

// takeOver moves our own surviving key to lease, unless it changed since
// we read it, and revokes the old lease.
func (r *Registry) takeOver(ctx context.Context, lease clientv3.LeaseID, rev int64, old clientv3.LeaseID) error {
	resp, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(r.key), "=", rev)).
		Then(clientv3.OpPut(r.key, r.value, clientv3.WithLease(lease))).Commit()
	if err != nil {
		return fmt.Errorf("discovery: take over %s: %w", r.key, err)
	}
	if !resp.Succeeded {
		return errRace
	}
	if old != 0 && old != lease {
		_, _ = r.cli.Revoke(ctx, old) // NB: holds no key of ours now; it would expire anyway
	}
	return nil
}

// keepAlive keeps lease alive until it is lost, our key is deleted, or ctx
// ends. Keep-alives are answered every ttl/3; two missed mark etcd down
// (the lease itself lapses only at the ttl, when the client closes the
// channel).
func (r *Registry) keepAlive(ctx context.Context, lease clientv3.LeaseID) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	acks, err := r.cli.KeepAlive(ctx, lease)
	if err != nil {
		return fmt.Errorf("discovery: keep-alive: %w", err)
	}
	patience := 2 * r.cfg.TTL / 3
	stale := time.NewTimer(patience)
	defer stale.Stop()
	for {
		select {
		case _, ok := <-acks:
			if !ok {
				return errLeaseLost
			}
			r.health.ok(registration)
			stale.Reset(patience)
		case <-stale.C:
			r.health.failed(registration, errNoAck)
		case <-r.renew:
			return errKeyLost
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

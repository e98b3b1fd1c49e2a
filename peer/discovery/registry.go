package discovery

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kvtier/kvtier/internal/defaults"
)

// ErrDuplicateNode: another live node holds this node's id in etcd. Start
// returns it (wrapped, with the holder's record) and registers nothing.
var ErrDuplicateNode = errors.New("discovery: node id already registered by another live node")

// errConfig marks a Config Start cannot run with.
var errConfig = errors.New("discovery: bad config")

// Defaults for Config's zero fields.
const (
	DefaultPrefix   = "/kvtier/"
	DefaultTTL      = 10 * time.Second
	DefaultTimeout  = 2 * time.Second
	DefaultRetryMin = 200 * time.Millisecond
	DefaultRetryMax = 5 * time.Second
)

// Config is what a Registry needs.
type Config struct {
	Endpoints []string      // etcd client URLs (http://host:2379 or host:2379)
	Prefix    string        // members live under Prefix+"nodes/" (DefaultPrefix)
	TTL       time.Duration // the lease: whole seconds, at least 2s (DefaultTTL)
	Timeout   time.Duration // bound on each etcd request, and on Start's registration (DefaultTimeout)
	RetryMin  time.Duration // first retry after a failure (DefaultRetryMin)
	RetryMax  time.Duration // retry cap (DefaultRetryMax, at most TTL/2: a node re-registers before its old lease lapses)
	Self      Member        // this node's record; Started and Instance are filled when zero
	Log       zerolog.Logger
}

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	defaults.Fill(&c, Config{Prefix: DefaultPrefix, TTL: DefaultTTL, Timeout: DefaultTimeout, RetryMin: DefaultRetryMin})
	if c.RetryMax == 0 { // NB: after TTL's default: it is bounded by it
		c.RetryMax = min(DefaultRetryMax, c.TTL/2)
	}
	if c.Self.Started.IsZero() {
		c.Self.Started = time.Now().UTC()
	}
	if c.Self.Instance == "" {
		var b [8]byte
		_, _ = rand.Read(b[:]) // crypto/rand never fails on Linux
		c.Self.Instance = hex.EncodeToString(b[:])
	}
	return c
}

// Validate reports a config a Registry cannot run with.
func (c Config) Validate() error {
	switch {
	case len(c.Endpoints) == 0:
		return fmt.Errorf("%w: no etcd endpoints", errConfig)
	case c.Self.Node == "" || c.Self.Control == "":
		return fmt.Errorf("%w: this node's id and control address are required", errConfig)
	case !strings.HasPrefix(c.Prefix, "/") || !strings.HasSuffix(c.Prefix, "/"):
		return fmt.Errorf("%w: prefix %q: want /…/", errConfig, c.Prefix)
	case c.TTL < 2*time.Second || c.TTL%time.Second != 0:
		return fmt.Errorf("%w: ttl %v: want whole seconds, at least 2s", errConfig, c.TTL)
	case c.Timeout <= 0 || c.RetryMin <= 0 || c.RetryMax < c.RetryMin:
		return fmt.Errorf("%w: timeout %v, retry %v..%v", errConfig, c.Timeout, c.RetryMin, c.RetryMax)
	}
	return nil
}

// Registry is this node's membership: its registration and its view of
// the others.
//
// Invariants:
//   - two goroutines, the registrar (lease, key, keep-alive) and the
//     watcher (list, watch, the view), both ended and waited for by Close;
//   - the view and the subscriber change only under mu, so a subscriber
//     replayed by Subscribe never sees an event out of order;
//   - lease is the lease our key is under now (0: none known), set by Start
//     and the registrar; Close reads it once the registrar ended.
type Registry struct {
	cfg   Config
	cli   *clientv3.Client
	key   string
	value string // our record, as registered
	log   zerolog.Logger

	cancel context.CancelFunc
	wg     sync.WaitGroup
	relist chan struct{} // registrar → watcher: registered under a new lease; list again
	renew  chan struct{} // watcher → registrar: our key went away while we live
	lease  atomic.Int64
	health health
	// registrations counts the leases our key was registered under.
	registrations atomic.Uint64

	mu   sync.Mutex
	view view
	sub  func(Event)

	closeOnce sync.Once
	closeErr  error
}

// Start registers this node, bounded by cfg.Timeout, and starts keeping
// the registration and watching the members. It fails only for a bad
// config or ErrDuplicateNode; an unreachable etcd is logged and retried in
// the background.
func Start(ctx context.Context, cfg Config) (*Registry, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	value, err := json.Marshal(cfg.Self)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errConfig, err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: cfg.Timeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("%w: etcd client: %w", errConfig, err)
	}
	r := &Registry{cfg: cfg, cli: cli, key: nodeKey(cfg.Prefix, cfg.Self.Node), value: string(value),
		log: cfg.Log, relist: make(chan struct{}, 1), renew: make(chan struct{}, 1), view: newView(cfg.Self.Node)}
	r.health.log = cfg.Log
	lease, err := r.claim(ctx)
	if errors.Is(err, ErrDuplicateNode) {
		_ = cli.Close()
		return nil, err
	}
	if err != nil {
		r.health.failed(registration, err)
	}
	run, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.lease.Store(int64(lease))
	r.wg.Add(2)
	go r.register(run, lease)
	go r.watch(run)
	return r, nil
}

// Subscribe makes fn the one receiver of events, replacing any earlier
// one, and replays every known member to it as Joined; nil unsubscribes.
// fn is called one event at a time, with the registry's lock held: it must
// not block nor call back into the registry.
func (r *Registry) Subscribe(fn func(Event)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sub = fn
	if fn == nil {
		return
	}
	for _, node := range r.view.nodes() {
		fn(Event{Kind: Joined, Member: r.view.members[node]})
	}
}

// update applies a change to the view and hands its events to the
// subscriber.
func (r *Registry) update(change func(v *view) []Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range change(&r.view) {
		r.log.Debug().Str("member", ev.Member.Node).Str("control", ev.Member.Control).Msg("peer discovery: member " + string(ev.Kind))
		if r.sub != nil {
			r.sub(ev)
		}
	}
}

// Members is how many members this node knows, itself excluded.
func (r *Registry) Members() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.view.members)
}

// Registrations is how many times this node registered, each under a new
// lease: more than one means etcd lost it (an outage past the ttl).
func (r *Registry) Registrations() uint64 { return r.registrations.Load() }

// Up reports whether this node is registered and watching: etcd answers.
func (r *Registry) Up() bool { return r.health.up() }

// Self is this node's record.
func (r *Registry) Self() Member { return r.cfg.Self }

// Close stops keeping the registration and watching, then deletes this
// node's key and revokes its lease, bounded by ctx and cfg.Timeout: peers
// watching see it leave at once. With etcd known unreachable (its latest
// answer was a failure) the key is left to expire with its lease rather
// than spending the timeout. Idempotent; the first call's result.
func (r *Registry) Close(ctx context.Context) error {
	r.closeOnce.Do(func() { r.closeErr = r.close(ctx) })
	return r.closeErr
}

func (r *Registry) close(ctx context.Context) error {
	r.cancel()
	r.wg.Wait()
	r.Subscribe(nil)
	var err error
	lease := clientv3.LeaseID(r.lease.Load())
	if lease != 0 && !r.health.failing() {
		ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		err = r.deregister(ctx, lease)
		cancel()
	} else if lease != 0 {
		r.log.Info().Dur("ttl", r.cfg.TTL).Msg("peer discovery: etcd unreachable at close; this node's key expires with its lease")
	}
	return errors.Join(err, r.cli.Close())
}

// deregister deletes our key, if it is still ours, and revokes the lease.
func (r *Registry) deregister(ctx context.Context, lease clientv3.LeaseID) error {
	_, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(r.key), "=", lease)).
		Then(clientv3.OpDelete(r.key)).Commit()
	if err != nil {
		return fmt.Errorf("discovery: delete %s: %w", r.key, err)
	}
	if _, err := r.cli.Revoke(ctx, lease); err != nil {
		return fmt.Errorf("discovery: revoke lease %x: %w", int64(lease), err)
	}
	r.log.Info().Str("key", r.key).Msg("peer discovery: deregistered")
	return nil
}

// ttlSeconds is the lease TTL in etcd's unit.
func (r *Registry) ttlSeconds() int64 { return int64(math.Ceil(r.cfg.TTL.Seconds())) }

// signal pokes a goroutine's channel without blocking (a poke pending is
// as good as two).
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// drain takes a pending poke off ch.
func drain(ch chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// backoff doubles from min to max, with ±20% jitter so a fleet that lost
// etcd at once does not come back at once.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	b.cur = min(max(2*b.cur, b.min), b.max)
	var r [1]byte
	_, _ = rand.Read(r[:])
	return b.cur + b.cur*time.Duration(int(r[0])-128)/640
}

func (b *backoff) reset() { b.cur = 0 }

package obj

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/internal/defaults"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/blockfmt"
)

// Config configures an obj tier.
type Config struct {
	Name     string   // tier name in stats and filters (default "obj")
	Endpoint Endpoint // where the store is (ignored with Client set)
	Prefix   string   // prepended to every object name ("node-a/")
	// MaxBlockBytes bounds the blocks the tier stores: any length from 1
	// to it (blocks of several sizes, one per namespace, share a bucket); a
	// write of another length is ErrSize, and an object that cannot hold
	// one is not found. 0: blockfmt.MaxBlockBytes.
	MaxBlockBytes int
	Workers       int // concurrent S3 calls (default 16)
	Queue         int // writes queued or running before more are shed (default 256)
	// MaxLookupKeys bounds the keys one tiermsg.Lookup HEADs (default 256);
	// keys past it are answered absent.
	MaxLookupKeys int

	// LookupTimeout bounds one HEAD or GET attempt (real time) and, on
	// Clock, the retries of one (default 2s: the node's lookup deadline).
	// WriteTimeout does the same for a PUT (default 10s).
	LookupTimeout time.Duration
	WriteTimeout  time.Duration
	// MaxAttempts bounds the tries of one call (default 3); retries wait
	// RetryBase, 2×RetryBase, ... (default 50ms) on Clock.
	MaxAttempts int
	RetryBase   time.Duration
	// UnhealthyAfter transient failures in a row make the tier unhealthy
	// (default 3); a refused connection does at once.
	UnhealthyAfter int
	// ProbeMin and ProbeMax bound the backoff between health probes while
	// unhealthy (defaults 100ms and 5s).
	ProbeMin, ProbeMax time.Duration
	// KnownKeys bounds the set of keys known stored (default 100,000), and
	// the set of blocks the tier's KV events announce (owned).
	KnownKeys int
	// Locality is the `locality` of the tier's KV events: "REMOTE" (the
	// default: an object store is reached over the network and shared).
	Locality string

	Clock  supervision.Clock // retries and probes; nil is the wall clock
	Client Client            // nil: NewMinio(Endpoint)
	Log    zerolog.Logger
}

// Defaults for Config.
const (
	DefaultWorkers        = 16
	DefaultQueue          = 256
	DefaultMaxLookupKeys  = 256
	DefaultLookupTimeout  = 2 * time.Second
	DefaultWriteTimeout   = 10 * time.Second
	DefaultMaxAttempts    = 3
	DefaultRetryBase      = 50 * time.Millisecond
	DefaultUnhealthyAfter = 3
	DefaultProbeMin       = 100 * time.Millisecond
	DefaultProbeMax       = 5 * time.Second
	DefaultKnownKeys      = 100_000
	DefaultLocality       = "REMOTE"
)

// maxBlock is the longest block the tier stores.
func (c Config) maxBlock() int {
	if c.MaxBlockBytes > 0 {
		return c.MaxBlockBytes
	}
	return blockfmt.MaxBlockBytes
}

func (c Config) withDefaults() Config {
	defaults.FillNonPositive(&c, Config{
		Name:           tiers.KindObj,
		Workers:        DefaultWorkers,
		Queue:          DefaultQueue,
		MaxLookupKeys:  DefaultMaxLookupKeys,
		LookupTimeout:  DefaultLookupTimeout,
		WriteTimeout:   DefaultWriteTimeout,
		MaxAttempts:    DefaultMaxAttempts,
		RetryBase:      DefaultRetryBase,
		UnhealthyAfter: DefaultUnhealthyAfter,
		ProbeMin:       DefaultProbeMin,
		KnownKeys:      DefaultKnownKeys,
		Locality:       DefaultLocality,
		Clock:          supervision.RealClock{},
	})
	if c.ProbeMax <= 0 {
		c.ProbeMax = max(DefaultProbeMax, c.ProbeMin)
	}
	return c
}

// Tier is an opened obj tier: its client and I/O workers. The actor (Props)
// serves it; the node closes it after the actor stopped.
type Tier struct {
	cfg     Config
	store   *Store
	workers *tiers.Workers
	base    context.Context // every S3 call's parent; cancelled by Close
	cancel  context.CancelFunc
	actor   *Actor
}

// Open makes the client and starts the workers. It does no I/O: the actor
// probes the endpoint when it starts, and an endpoint that is down then
// only makes the tier start unhealthy.
func Open(cfg Config) (*Tier, error) {
	cfg = cfg.withDefaults()
	if cfg.MaxBlockBytes < 0 || cfg.maxBlock() > blockfmt.MaxBlockBytes {
		return nil, fmt.Errorf("%w: obj tier block bound %d: want 1..%d", messages.ErrBadConfig, cfg.maxBlock(), blockfmt.MaxBlockBytes)
	}
	if strings.HasPrefix(cfg.Prefix, "/") {
		return nil, fmt.Errorf("%w: obj tier prefix %q must not start with /", messages.ErrBadConfig, cfg.Prefix)
	}
	if cfg.Client == nil {
		if cfg.Endpoint.Endpoint == "" || cfg.Endpoint.Bucket == "" {
			return nil, fmt.Errorf("%w: obj tier needs an endpoint and a bucket", messages.ErrBadConfig)
		}
		cfg.Endpoint.Conns = cfg.Workers
		c, err := NewMinio(cfg.Endpoint)
		if err != nil {
			return nil, err
		}
		cfg.Client = c
	}
	t := &Tier{cfg: cfg, store: &Store{c: cfg.Client, prefix: cfg.Prefix},
		workers: tiers.NewWorkers(cfg.Workers, cfg.Workers+1)} // NB: +1: room for a probe beside a full pump
	t.base, t.cancel = context.WithCancel(context.Background())
	t.actor = newActor(t)
	cfg.Log.Info().Str("tier", cfg.Name).Str("endpoint", cfg.Endpoint.Endpoint).Str("bucket", cfg.Endpoint.Bucket).
		Str("prefix", cfg.Prefix).Int("workers", cfg.Workers).Msg("obj tier: opened")
	return t, nil
}

// Name is the tier's name.
func (t *Tier) Name() string { return t.cfg.Name }

// Close aborts running S3 calls, stops the workers (waiting for them until
// ctx ends) and closes the client's idle connections. Call it after the
// actor stopped.
func (t *Tier) Close(ctx context.Context) error {
	t.cancel()
	err := t.workers.Close(ctx)
	t.cfg.Client.Close()
	return err
}

// Props builds the tier's actor over t (its state survives restarts); it
// announces what the tier holds to hub (nil: events off, nothing announced).
func (t *Tier) Props(hub *actor.PID) *actor.Props {
	a := t.actor
	a.hub = hub
	return actor.PropsFromProducer(func() actor.Actor { return a },
		actor.WithReceiverMiddleware(supervision.Faults))
}

// AwaitHealth is answered once the tier's health is Healthy (at once when
// it is). For tests and tools that must see a transition; the engine never
// waits on it.
type AwaitHealth struct {
	Healthy bool
	Reply   messages.Reply[struct{}]
}

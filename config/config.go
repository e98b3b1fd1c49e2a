// Package config is a node's configuration: the Config a Go program passes
// to kvtier.Open and the daemon reads from YAML (LoadConfigFile) and flags,
// its defaults and its validation (every fault wraps messages.ErrBadConfig).
// It describes what to build; it starts nothing and never touches an actor.
package config

import (
	"cmp"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/cpu"
)

// Config configures a node. Zero values take the defaults below; negative
// sizes and durations are rejected by Validate with ErrBadConfig.
type Config struct {
	// PoolPath is the shared-memory file of the CPU pool (under /dev/shm for
	// an out-of-process engine). Empty: an anonymous memfd.
	PoolPath string `yaml:"pool_path"`
	// PoolBytes is the pool's capacity; slots = PoolBytes / BlockBytes.
	PoolBytes int64 `yaml:"pool_bytes"`
	// BlockBytes is the size of one block (one slot).
	BlockBytes int `yaml:"block_bytes"`
	// Policy is the eviction policy: "lru" (default, vLLM's order), "arc" or
	// "prefix" (a chain's deepest blocks first; tiers/cpu/prefix.go).
	Policy string `yaml:"policy"`
	// LeaseTTL bounds how long a HIT stays leased to a request that never
	// calls PrepareLoad or RequestFinished.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// JobWorkers is how many worker reports an engine job expects by default
	// (one per tensor-parallel worker).
	JobWorkers int `yaml:"job_workers"`
	// LoadJobTimeout and StoreJobTimeout are engine job deadlines; a job not
	// completed by then is reaped.
	LoadJobTimeout  time.Duration `yaml:"load_job_timeout"`
	StoreJobTimeout time.Duration `yaml:"store_job_timeout"`
	// CallTimeout bounds a manager call whose ctx has no deadline.
	CallTimeout time.Duration `yaml:"call_timeout"`

	// Standalone mode (docs/PROTOCOL.md): the engine endpoint.

	// EngineListen is where the engine endpoint serves out-of-process
	// engines: "ipc:///path" or "tcp://127.0.0.1:PORT". Empty: no endpoint
	// (embedded use). It needs a PoolPath the engine can map.
	EngineListen string `yaml:"engine_listen"`
	// EngineAllowRemote permits a tcp EngineListen that is not loopback.
	EngineAllowRemote bool `yaml:"engine_allow_remote"`
	// EngineGrace is how long an engine connection holding requests may
	// stay silent (the client then pings at a third of it) before its
	// leases, pins, pending writes and jobs are released. A closed
	// connection is released at once; an idle one needs no ping.
	EngineGrace time.Duration `yaml:"engine_grace"`
	// EngineGroup, if set (a group name or numeric gid), may use the engine
	// socket and the pool file: both become mode 0660 in that group instead
	// of 0600.
	EngineGroup string `yaml:"engine_group"`
	// EnginePoll, if positive, is how long a unix:// engine connection is
	// polled after its last frame or reply before the daemon waits for the
	// next one in the network poller: the calls of an engine's step, back
	// to back, then find the daemon's reader awake instead of paying a
	// wake-up each (docs/PERFORMANCE.md, issue 17 "Round 4": with the
	// Python client polling too, its default, a 16-key Lookup 4.5× faster
	// than neither on a 2-vCPU VM). It costs up to one core per polling
	// connection for this long after each burst, none while engines idle,
	// and delays the node's other network I/O while both cores are busy:
	// for nodes with cores to spare. 0: off, the default by measurement
	// (`kvtier bench engine-poll`: on a 2-core box polling buys the engine
	// 9–14 % at p50 and costs the peers 20–42 % at p99). At most 10ms
	// (endpoint.SuggestedEnginePoll is 100µs).
	EnginePoll time.Duration `yaml:"engine_poll"`
	// Namespace, if set, is the only layout namespace the engine endpoint
	// accepts keys in; Hello tells engines.
	Namespace string `yaml:"namespace"`
	// EngineClock drives engine-session liveness and the endpoint's call
	// deadlines; nil is the wall clock. It is not Clock on purpose: a test
	// that advances lease and job time must not thereby declare its engine
	// connections dead, nor time out their calls.
	EngineClock supervision.Clock `yaml:"-"`

	// Events publishes KV events in vLLM's wire format (events_config.go).
	Events EventsConfig `yaml:"events"`

	// Secondary tiers (tiers_config.go): fs and obj tiers in lookup order,
	// the deadline of a secondary lookup, the cascade queue per tier.
	SecondaryTiers          []TierConfig  `yaml:"secondary_tiers"`
	SecondaryLookupDeadline time.Duration `yaml:"secondary_lookup_deadline"`
	CascadeQueue            int           `yaml:"cascade_queue"`

	// Peers turns on the P2P tier (peers_config.go).
	Peers PeersConfig `yaml:"peers"`

	// Clock drives leases and deadlines; nil is the wall clock.
	Clock supervision.Clock `yaml:"-"`
	// Logger receives the node's structured logs; nil discards them.
	Logger *zerolog.Logger `yaml:"-"`

	// Faults, for chaos tests only (tools/chaos), perturbs the messages
	// of every actor of the node as its rules decide (supervision/inject.go);
	// nil, always in production: no fault injection.
	Faults *supervision.Injector `yaml:"-"`
}

// Defaults: a laptop-sized pool.
const (
	DefaultPoolBytes        = 1 << 30
	DefaultBlockBytes       = 256 << 10
	DefaultLeaseTTL         = 30 * time.Second
	DefaultJobWorkers       = 1
	DefaultEngineJobTimeout = 300 * time.Second
	DefaultCallTimeout      = 10 * time.Second
	DefaultEngineGrace      = 10 * time.Second
	maxEnginePoll           = 10 * time.Millisecond
)

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.PoolBytes = cmp.Or(c.PoolBytes, DefaultPoolBytes)
	c.BlockBytes = cmp.Or(c.BlockBytes, DefaultBlockBytes)
	c.Policy = cmp.Or(c.Policy, "lru")
	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseTTL)
	c.JobWorkers = cmp.Or(c.JobWorkers, DefaultJobWorkers)
	c.LoadJobTimeout = cmp.Or(c.LoadJobTimeout, DefaultEngineJobTimeout)
	c.StoreJobTimeout = cmp.Or(c.StoreJobTimeout, DefaultEngineJobTimeout)
	c.CallTimeout = cmp.Or(c.CallTimeout, DefaultCallTimeout)
	c.EngineGrace = cmp.Or(c.EngineGrace, DefaultEngineGrace)
	c.Events = c.Events.withDefaults()
	if c.Clock == nil {
		c.Clock = supervision.RealClock{}
	}
	if c.Logger == nil {
		l := zerolog.Nop()
		c.Logger = &l
	}
	return c
}

// Validate reports the first invalid field, wrapping messages.ErrBadConfig.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{messages.ErrBadConfig}, a...)...)
	}
	switch {
	case c.PoolBytes <= 0:
		return bad("pool_bytes %d must be positive", c.PoolBytes)
	case c.BlockBytes <= 0:
		return bad("block_bytes %d must be positive", c.BlockBytes)
	case c.PoolBytes < int64(c.BlockBytes):
		return bad("pool_bytes %d holds no block of %d bytes", c.PoolBytes, c.BlockBytes)
	case c.PoolBytes/int64(c.BlockBytes) > 1<<31-1:
		return bad("pool_bytes/block_bytes = %d slots, too many", c.PoolBytes/int64(c.BlockBytes))
	case cpu.ValidPolicy(c.Policy) != nil:
		return bad("policy %q (want one of %v)", c.Policy, cpu.Policies)
	case c.LeaseTTL <= 0:
		return bad("lease_ttl %v must be positive", c.LeaseTTL)
	case c.JobWorkers <= 0 || c.JobWorkers > 1024:
		return bad("job_workers %d (want 1..1024)", c.JobWorkers)
	case c.LoadJobTimeout <= 0 || c.StoreJobTimeout <= 0:
		return bad("job timeouts must be positive (load %v, store %v)", c.LoadJobTimeout, c.StoreJobTimeout)
	case c.CallTimeout <= 0:
		return bad("call_timeout %v must be positive", c.CallTimeout)
	case c.EngineGrace < 0:
		return bad("engine_grace %v must be positive", c.EngineGrace)
	case c.EnginePoll < 0 || c.EnginePoll > maxEnginePoll:
		return bad("engine_poll %v (want 0, off, up to %v: longer is a spinning daemon)", c.EnginePoll, maxEnginePoll)
	case c.EngineListen != "" && c.PoolPath == "":
		return bad("engine_listen needs a pool_path engines can map (an anonymous memfd has no name)")
	case len(c.Namespace) > 64:
		return bad("namespace of %d bytes (max 64)", len(c.Namespace))
	}
	if err := validateTiers(c); err != nil {
		return err
	}
	if err := c.Peers.validate(); err != nil {
		return err
	}
	return c.Events.validate()
}

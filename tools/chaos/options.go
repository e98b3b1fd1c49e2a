package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/internal/defaults"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/fs"
	"github.com/kvtier/kvtier/tiers/obj/objtest"
)

// Options configure a run.
type Options struct {
	Scenario string        // "single" (default); the peer scenario plugs in here
	Seed     uint64        // workload and fault plan
	Duration time.Duration // how long faults are injected and requests admitted
	Kinds    []Kind        // fault kinds to inject (none: a clean run)
	// Rate multiplies every kind's default rate (0: 1); Rates overrides a
	// kind's rate outright.
	Rate  float64
	Rates map[Kind]float64
	// MaxDelay bounds message delays and slow I/O (default 50ms, well
	// inside every deadline, so a delay alone never fails a call).
	MaxDelay time.Duration
	// Spare names actors never made to panic ("bridge", "cpu", "tiering",
	// "tier-fs", "tier-obj" or "tier-*" for every secondary tier, "events").
	Spare  []string
	Engine EngineConfig
	// FSLayout is the fs tiers' layout (tiers/fs Config.Layout):
	// "segments" ("": the default; append-only segment files) or "files"
	// (one file per block).
	FSLayout string

	// Plan replaces the seeded plan (the shrinker replays a Script).
	Plan supervision.Plan

	// S3 is a running versitygw to use (tests share one); nil: the run
	// launches its own from Versitygw ("": objtest.Binary()).
	S3        *objtest.Server
	Versitygw string
	// Dir holds the fs tier's root and the S3 data; "": a temporary
	// directory, removed after the run.
	Dir string

	// QuietTimeout bounds the wait for the node to go quiet after the run
	// (default: the lease TTL plus 10 s). MemBound bounds the heap the run
	// may leave behind (default 64 MiB).
	QuietTimeout time.Duration
	MemBound     uint64
	// Shrink is the time allowed to shrink a violation to the smallest
	// fault sequence that reproduces it (0: no shrinking).
	Shrink time.Duration

	Hooks Hooks
	// Log receives the nodes' logs (nil: discarded).
	Log *zerolog.Logger
}

// Hooks are test seams: each breaks something on purpose so a self-test
// can prove the invariants notice. Never set outside tests.
type Hooks struct {
	// UnsafeRules run before the catalogue, outside it: they may perturb
	// anything (e.g. drop a CPU-tier release, which leaks its pins).
	UnsafeRules []supervision.MessageRule
	// BadStore, when it returns true for a key, makes the engine write
	// another block's bytes for it (and report the job done).
	BadStore func(messages.Key) bool
	// LeakGoroutine starts a goroutine that outlives the run (it ends when
	// the test closes the channel).
	LeakGoroutine <-chan struct{}
	// Mid runs once, half way through the run, with the first node and
	// its injector (e.g. to restart an actor by a one-shot rule).
	Mid func(ctx context.Context, n *kvtier.Node, inj *supervision.Injector)
}

// Defaults of Options.
const (
	DefaultMaxDelay = 50 * time.Millisecond
	DefaultMemBound = 64 << 20
)

func (o Options) withDefaults() Options {
	defaults.FillNonPositive(&o, Options{
		Scenario: "single",
		Duration: 10 * time.Second,
		Rate:     1,
		MaxDelay: DefaultMaxDelay,
		MemBound: DefaultMemBound,
	})
	defaults.FillNonPositive(&o.Engine, DefaultEngineConfig())
	return o
}

// rates is the per-kind rate of the seeded plan.
func (o Options) rates() map[Kind]float64 {
	out := map[Kind]float64{}
	for _, k := range o.Kinds {
		if r, ok := o.Rates[k]; ok {
			out[k] = r
		} else if i, ok := info(k); ok {
			out[k] = min(i.Rate*o.Rate, 1)
		}
	}
	return out
}

// plan is the run's fault plan.
func (o Options) plan() supervision.Plan {
	if o.Plan != nil {
		return o.Plan
	}
	return &supervision.Seeded{Seed: o.Seed, Rates: o.rates(), MinDelay: o.MaxDelay / 10, MaxDelay: o.MaxDelay}
}

// Command is the `kvtier chaos` command line that repeats the run.
func (o Options) Command() string {
	o = o.withDefaults()
	cmd := fmt.Sprintf("kvtier chaos --scenario %s --seed %d --duration %s --faults %s",
		o.Scenario, o.Seed, o.Duration, FormatKinds(o.Kinds))
	if o.Rate != 1 {
		cmd += fmt.Sprintf(" --rate %g", o.Rate)
	}
	if o.MaxDelay != DefaultMaxDelay {
		cmd += fmt.Sprintf(" --max-delay %s", o.MaxDelay)
	}
	if len(o.Spare) > 0 {
		cmd += " --spare " + strings.Join(o.Spare, ",")
	}
	if def := DefaultEngineConfig(); o.Engine.Engines != def.Engines {
		cmd += fmt.Sprintf(" --engines %d", o.Engine.Engines)
	}
	return cmd + " --fs-layout " + fs.LayoutOf(o.FSLayout) // NB: always: the default may change
}

// segments reports whether the fs tiers keep their blocks in segments.
func (o Options) segments() bool { return fs.LayoutOf(o.FSLayout) == fs.LayoutSegments }

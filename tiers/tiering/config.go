package tiering

import (
	"time"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/internal/defaults"
	"github.com/kvtier/kvtier/supervision"
)

// Tier is one configured secondary tier.
type Tier struct {
	Name string // in stats, metrics and TierFilter
	Kind string // tiers.KindFS, tiers.KindObj or p2p.Kind
	Ref  fx.Ref // its actor
	// Batched tiers get a promotion as one tiermsg.ReadBatch (the P2P tier: one
	// fetch round per peer); the others one tiermsg.Read per key.
	Batched bool
	// NoCascade: never a cascade target (peers hold their own blocks).
	NoCascade bool
}

// Config is what the tiering actor needs from the node.
type Config struct {
	CPU   fx.Ref           // the CPU tier
	Tiers []Tier           // secondary tiers, in lookup order (at most 63)
	Slot  func(int) []byte // slot bytes, handed to tier workers
	Clock supervision.Clock

	// LookupDeadline bounds a secondary lookup: tiers that have not
	// answered by then count as not holding the key, and the key is a MISS.
	LookupDeadline time.Duration
	// NegativeTTL is how long a key known absent (or whose promotion
	// failed) answers MISS from that tier without a new lookup.
	NegativeTTL time.Duration
	// NoRoomTTL is the same for a key whose promotion found no CPU room
	// (every slot pinned or reserved): shorter, because pins last a step
	// or two, and a hot prefix on disk would otherwise be recomputed for a
	// whole NegativeTTL after one busy step; long enough that a full pool
	// is not asked again on every engine step.
	NoRoomTTL time.Duration
	// PromotionTimeout and CascadeTimeout are job deadlines; a job past its
	// deadline is reaped (counted, logged). A job whose tier I/O is still
	// running keeps its slots until that I/O returns: a worker may still
	// touch them.
	PromotionTimeout time.Duration
	CascadeTimeout   time.Duration
	// CascadeQueue bounds, per tier, the blocks waiting to be cascaded
	// (unpinned: a block evicted before its turn is dropped) plus those in
	// flight; blocks beyond it are shed and counted.
	CascadeQueue int
	// CascadeInFlight bounds, per tier, the cascade writes in flight, each
	// holding a pinned slot: the most of the CPU pool a slow tier can pin.
	CascadeInFlight int
	Log             zerolog.Logger
}

// Defaults for Config's zero fields.
const (
	DefaultLookupDeadline   = 2 * time.Second
	DefaultNegativeTTL      = 10 * time.Second
	DefaultNoRoomTTL        = time.Second
	DefaultPromotionTimeout = 30 * time.Second
	DefaultCascadeTimeout   = 60 * time.Second
	DefaultCascadeQueue     = 4096
	DefaultCascadeInFlight  = 64
)

// WithDefaults fills zero (or negative) fields.
func (c Config) WithDefaults() Config {
	defaults.FillNonPositive(&c, Config{
		LookupDeadline:   DefaultLookupDeadline,
		NegativeTTL:      DefaultNegativeTTL,
		NoRoomTTL:        DefaultNoRoomTTL,
		PromotionTimeout: DefaultPromotionTimeout,
		CascadeTimeout:   DefaultCascadeTimeout,
		CascadeQueue:     DefaultCascadeQueue,
		CascadeInFlight:  DefaultCascadeInFlight,
		Clock:            supervision.RealClock{},
	})
	return c
}

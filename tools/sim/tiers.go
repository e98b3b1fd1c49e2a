package sim

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvtier/kvtier/messages"
)

// TieredManager is implemented by managers whose secondary tiers the
// simulator can settle and read (the embedded node). Without it, or without
// secondary tiers, the run is unchanged.
type TieredManager interface {
	// tieringmsg.Idle returns once no secondary lookup, promotion or cascade is
	// in flight.
	TieringIdle(ctx context.Context) error
	// TieringStats returns the secondary tiers' counters (an error when the
	// node has none).
	TieringStats(ctx context.Context) (messages.TieringStats, error)
}

// settleTiers stands in for the wall time a real engine step takes: after
// a step in which a lookup answered RETRY, the node's secondary lookups and
// promotions (and the cascades in flight) finish before the next step, so
// an answer the engine waits a step for is there a step later, however
// fast this machine's disk is relative to the simulator. Cascades are not
// awaited after stores: a run's counts can vary slightly with timing when
// a cascade is still in flight as its block is looked up.
func (e *engine) settleTiers(ctx context.Context) error {
	if !e.tierWork || e.tiered == nil {
		return nil
	}
	e.tierWork = false
	e.sum.TierSettles++
	if err := e.tiered.TieringIdle(ctx); err != nil {
		return fmt.Errorf("tiering idle: %w", err)
	}
	return nil
}

// tierSummary records, at the end of a run, the blocks each secondary tier
// promoted and its share of the secondary hits.
func (e *engine) tierSummary(ctx context.Context) error {
	if e.tiered == nil {
		return nil
	}
	if err := e.tiered.TieringIdle(ctx); err != nil {
		return fmt.Errorf("tiering idle: %w", err)
	}
	ts, err := e.tiered.TieringStats(ctx)
	if err != nil {
		if errors.Is(err, messages.ErrBadConfig) {
			return nil // no secondary tiers
		}
		return fmt.Errorf("tiering stats: %w", err)
	}
	e.sum.TierPromoted = map[string]uint64{}
	e.sum.TierKinds = map[string]string{}
	for _, t := range ts.Tiers {
		e.sum.TierPromoted[t.Name] = ts.Promoted[t.Name]
		e.sum.TierKinds[t.Name] = t.Kind
	}
	e.sum.CascadeDropped = 0
	for _, n := range ts.CascadeDropped {
		e.sum.CascadeDropped += n
	}
	var failed uint64
	for _, n := range ts.PromotionsFailed {
		failed += n
	}
	e.sum.PromotionFailures = map[string]uint64{"full": ts.PromotionsFull, "busy": ts.PromotionsBusy,
		"failed": failed, "reaped": ts.PromotionsReaped}
	return nil
}

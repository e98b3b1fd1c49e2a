package metrics

// Prometheus metrics of the secondary tiers, read from one TieringStats
// snapshot per scrape (the tiering actor and the tier actors own the
// numbers).

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/p2p"
)

type tierCollector struct {
	descSet
	stats   func(context.Context) (messages.TieringStats, error)
	timeout time.Duration
}

var tierMetricHelp = map[string]string{
	"cascade_dropped_total":             "Blocks not cascaded to a secondary tier: queue full, tier full or unhealthy, or evicted before their turn.",
	"cascade_written_total":             "Blocks written to a secondary tier by cascades.",
	"cascade_failed_total":              "Cascade writes that failed in the tier (I/O, checksum).",
	"promotions_total":                  "Blocks promoted from a secondary tier into the CPU tier.",
	"promotion_failures_total":          "Promotions that failed (I/O, corrupt copy); the key is a miss for that tier for a while.",
	"tier_blocks":                       "Blocks held by a secondary tier.",
	"tier_bytes":                        "Bytes used by a secondary tier.",
	"tier_healthy":                      "1 while a secondary tier is healthy.",
	"tier_invalid_blocks_total":         "Stored blocks found invalid and removed, never served.",
	"tier_writes_full_total":            "Writes refused for lack of room (capacity, ENOSPC).",
	"tier_evictions_total":              "Blocks evicted from a secondary tier for capacity.",
	"tier_chore_failures_total":         "Housekeeping I/O of an fs tier that failed: segment seals (at start too) and removals; an unsealed segment is walked again at the next start.",
	"promotions_full_total":             "Promotions refused because the CPU tier had no slot; the key is a miss for that tier for a second.",
	"promotions_busy_total":             "Promotion reads a tier refused for back-pressure (I/O queue full): asked again later, never taken as absent.",
	"secondary_lookups_timed_out_total": "Keys whose secondary lookup passed its deadline (answered MISS).",
	"stalled_promotions_total":          "Promotion jobs reaped at their deadline.",
	"stalled_cascades_total":            "Cascade jobs reaped at their deadline.",
	"peer_lookup_calls_total":           "Lookups the P2P tier was asked: misses that reached the peers.",
	"peer_asks_total":                   "Peers the P2P tier asked, summed over its lookups (divide by peer_lookup_calls_total: messages per miss).",
	"peer_directory_keys":               "Keys the P2P tier's directory records, over every peer (peers.directory).",
}

// RegisterTiers adds the secondary tiers' metrics to reg, read by calling
// stats, bounded by timeout, on every scrape.
func RegisterTiers(reg *prometheus.Registry, stats func(context.Context) (messages.TieringStats, error), timeout time.Duration) {
	descs := newDescSet(tierMetricHelp, func(name string) []string {
		switch name {
		case "promotions_full_total", "promotions_busy_total", "secondary_lookups_timed_out_total", "stalled_promotions_total", "stalled_cascades_total":
			return nil
		}
		return []string{"tier"}
	})
	reg.MustRegister(&tierCollector{descSet: descs, stats: stats, timeout: timeout})
}

func (c *tierCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	s, err := c.stats(ctx)
	if err != nil {
		// NB: said, not swallowed: a scrape must not read as "no tiers"
		ch <- prometheus.NewInvalidMetric(c.descSet["tier_blocks"], fmt.Errorf("kvtier metrics: reading tier stats: %w", err))
		return
	}
	counter := func(name string, v float64, labels ...string) {
		c.send(ch, name, prometheus.CounterValue, v, labels...)
	}
	gauge := func(name string, v float64, labels ...string) {
		c.send(ch, name, prometheus.GaugeValue, v, labels...)
	}
	for _, t := range s.Tiers {
		counter("cascade_dropped_total", float64(s.CascadeDropped[t.Name]), t.Name)
		counter("cascade_written_total", float64(s.CascadeWritten[t.Name]), t.Name)
		counter("cascade_failed_total", float64(s.CascadeFailed[t.Name]), t.Name)
		counter("promotions_total", float64(s.Promoted[t.Name]), t.Name)
		counter("promotion_failures_total", float64(s.PromotionsFailed[t.Name]), t.Name)
		counter("tier_invalid_blocks_total", float64(t.Invalid), t.Name)
		counter("tier_writes_full_total", float64(t.WritesFull), t.Name)
		counter("tier_evictions_total", float64(t.Evictions), t.Name)
		counter("tier_chore_failures_total", float64(t.ChoreFailures), t.Name)
		gauge("tier_blocks", float64(t.Blocks), t.Name)
		gauge("tier_bytes", float64(t.Bytes), t.Name)
		gauge("tier_healthy", oneIf(t.Healthy), t.Name)
		if t.Kind == p2p.Kind {
			counter("peer_lookup_calls_total", float64(t.LookupCalls), t.Name)
			counter("peer_asks_total", float64(t.PeerAsks), t.Name)
			gauge("peer_directory_keys", float64(t.DirectoryKeys), t.Name)
		}
	}
	counter("promotions_full_total", float64(s.PromotionsFull))
	counter("promotions_busy_total", float64(s.PromotionsBusy))
	counter("secondary_lookups_timed_out_total", float64(s.LookupsTimedOut))
	counter("stalled_promotions_total", float64(s.PromotionsReaped))
	counter("stalled_cascades_total", float64(s.CascadesReaped))
}

// Package metrics holds a node's Prometheus collectors: the one over the
// actors' Stats snapshot, the tiers' and the peers'. Each reads its numbers
// at scrape time through a function or an atomic counter set handed to it; it
// owns no node state and never touches an actor's.
package metrics

// Prometheus metrics of a node. Every counter and gauge is read from one
// Stats snapshot per scrape (the actors own the numbers; the collector only
// asks), so a scrape costs one round trip through the actors and no metric
// can disagree with another taken in the same scrape.

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvtier/kvtier/internal/version"
	"github.com/kvtier/kvtier/messages"
)

// metricsNamespace prefixes every kvtier metric name.
const metricsNamespace = "kvtier"

// descSet is a collector's descriptors by metric name (without the
// namespace); it describes them all.
type descSet map[string]*prometheus.Desc

// newDescSet describes every metric of help with the labels labelsOf gives
// for its name.
func newDescSet(help map[string]string, labelsOf func(name string) []string) descSet {
	d := make(descSet, len(help))
	for name, h := range help {
		d[name] = prometheus.NewDesc(metricsNamespace+"_"+name, h, labelsOf(name), nil)
	}
	return d
}

func (d descSet) Describe(ch chan<- *prometheus.Desc) {
	for _, desc := range d {
		ch <- desc
	}
}

// send emits one sample of the metric name.
func (d descSet) send(ch chan<- prometheus.Metric, name string, kind prometheus.ValueType, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d[name], kind, v, labels...)
}

// oneIf is a boolean as a gauge's value: 1 or 0.
func oneIf(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// DefaultMetricsTimeout bounds the Stats call of one scrape when the caller
// passes no timeout.
const DefaultMetricsTimeout = 5 * time.Second

// Node holds the metrics a node updates directly (as opposed to the ones
// computed from Stats at scrape time).
type Node struct {
	// LookupLatency observes the wall time of each Manager.Lookup call, in
	// seconds, as seen by the caller.
	LookupLatency prometheus.Histogram
}

// New builds a private registry (never the global one) holding
// the Go and process collectors, the lookup latency histogram,
// kvtier_build_info, and a collector that calls stats, bounded by timeout,
// on every scrape. A non-positive timeout means DefaultMetricsTimeout.
func New(stats func(context.Context) (messages.Stats, error), timeout time.Duration) (*prometheus.Registry, *Node) {
	if timeout <= 0 {
		timeout = DefaultMetricsTimeout
	}
	reg := prometheus.NewRegistry()
	m := &Node{
		LookupLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricsNamespace,
			Name:      "lookup_duration_seconds",
			Help:      "Wall time of Manager.Lookup calls.",
			// 10µs × 2^17 ≈ 1.3 s.
			Buckets: prometheus.ExponentialBuckets(10e-6, 2, 18),
		}),
	}
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.LookupLatency,
		newStatsCollector(stats, timeout),
		newBuildInfo(version.Get()), // metrics_build.go
	)
	return reg, m
}

// statKind is whether a stats-derived metric is a counter or a gauge.
type statKind int

const (
	statCounter statKind = iota
	statGauge
)

// statMetric is one metric computed from a Stats snapshot.
type statMetric struct {
	desc  *prometheus.Desc
	kind  statKind
	value func(*messages.Stats) float64
	// labels are the constant label values of desc's variable labels.
	labels []string
}

// statsCollector is a prometheus.Collector over a Stats function.
type statsCollector struct {
	stats   func(context.Context) (messages.Stats, error)
	timeout time.Duration
	metrics []statMetric
	// errDesc describes the invalid metric emitted when stats fails.
	errDesc *prometheus.Desc
	// geometry are the per-geometry gauges, labelled by block_bytes.
	geometry []geometryMetric
}

// geometryMetric is a gauge of each geometry of the pool.
type geometryMetric struct {
	desc  *prometheus.Desc
	value func(*messages.GeometryStats) int
}

func geometryMetrics() []geometryMetric {
	g := func(name, help string, v func(*messages.GeometryStats) int) geometryMetric {
		return geometryMetric{desc: prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, "", name), help,
			[]string{"block_bytes"}, nil), value: v}
	}
	return []geometryMetric{
		g("pool_geometry_slots", "Slot ids of a geometry (as many as the budget holds of its size).", func(s *messages.GeometryStats) int { return s.Slots }),
		g("pool_geometry_slots_committed", "A geometry's slots with memory behind them.", func(s *messages.GeometryStats) int { return s.Committed }),
		g("pool_geometry_slots_free", "A geometry's committed slots that are free.", func(s *messages.GeometryStats) int { return s.Free }),
		g("pool_geometry_slots_ready", "A geometry's slots holding a readable block.", func(s *messages.GeometryStats) int { return s.Ready }),
	}
}

// newStatsCollector defines every metric derived from messages.Stats.
func newStatsCollector(stats func(context.Context) (messages.Stats, error), timeout time.Duration) *statsCollector {
	c := &statsCollector{
		stats:    stats,
		timeout:  timeout,
		errDesc:  prometheus.NewDesc(metricsNamespace+"_stats_error", "Stats could not be read from the node.", nil, nil),
		geometry: geometryMetrics(),
	}
	add := func(kind statKind, name, help string, v func(*messages.Stats) float64) {
		c.metrics = append(c.metrics, statMetric{
			desc:  prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, "", name), help, nil, nil),
			kind:  kind,
			value: v,
		})
	}
	u := func(f func(*messages.Stats) uint64) func(*messages.Stats) float64 {
		return func(s *messages.Stats) float64 { return float64(f(s)) }
	}
	i := func(f func(*messages.Stats) int) func(*messages.Stats) float64 {
		return func(s *messages.Stats) float64 { return float64(f(s)) }
	}

	add(statCounter, "lookups_total", "Keys looked up.", u(func(s *messages.Stats) uint64 { return s.Lookups }))
	add(statCounter, "lookup_hits_total", "Keys answered HIT.", u(func(s *messages.Stats) uint64 { return s.Hits }))
	add(statCounter, "lookup_hits_pending_total", "Keys answered HIT_PENDING.", u(func(s *messages.Stats) uint64 { return s.HitsPending }))
	add(statCounter, "lookup_misses_total", "Keys answered MISS.", u(func(s *messages.Stats) uint64 { return s.Misses }))
	add(statCounter, "stores_total", "Keys committed readable.", u(func(s *messages.Stats) uint64 { return s.Stores }))
	add(statCounter, "stores_failed_total", "Reserved keys freed by a failed or reaped store.", u(func(s *messages.Stats) uint64 { return s.StoresFailed }))
	add(statCounter, "evictions_total", "Blocks evicted to make room.", u(func(s *messages.Stats) uint64 { return s.Evictions }))
	add(statCounter, "store_full_total", "PrepareStore calls answered Full.", u(func(s *messages.Stats) uint64 { return s.Full }))
	add(statCounter, "leases_expired_total", "Leases that ran out before PrepareLoad.", u(func(s *messages.Stats) uint64 { return s.LeasesExpired }))
	add(statCounter, "jobs_completed_total", "Engine jobs completed.", u(func(s *messages.Stats) uint64 { return s.JobsCompleted }))
	stalled := prometheus.NewDesc(metricsNamespace+"_stalled_transfers_total", "Transfer jobs reaped at their deadline.", []string{"kind"}, nil)
	c.metrics = append(c.metrics,
		statMetric{desc: stalled, kind: statCounter, labels: []string{"load"}, value: u(func(s *messages.Stats) uint64 { return s.JobsReapedLoad })},
		statMetric{desc: stalled, kind: statCounter, labels: []string{"store"}, value: u(func(s *messages.Stats) uint64 { return s.JobsReapedStore })},
	)
	add(statCounter, "late_reports_total", "Worker reports for unknown, finished or reaped jobs.", u(func(s *messages.Stats) uint64 { return s.LateReports }))
	add(statCounter, "checksum_failures_total", "Block verifications that found wrong bytes.", u(func(s *messages.Stats) uint64 { return s.ChecksumFailures }))
	add(statCounter, "actor_restarts_total", "Supervised actor restarts.", u(func(s *messages.Stats) uint64 { return s.ActorRestarts }))

	add(statGauge, "pool_slots", "Slots in the CPU pool holding their bytes, every block size's.", i(func(s *messages.Stats) int { return s.Slots }))
	add(statGauge, "pool_block_bytes", "Bytes per slot of the pool's first block size.", i(func(s *messages.Stats) int { return s.BlockBytes }))
	add(statGauge, "pool_slots_free", "Free slots.", i(func(s *messages.Stats) int { return s.Free }))
	add(statGauge, "pool_slots_write_pending", "Slots being written.", i(func(s *messages.Stats) int { return s.WritePending }))
	add(statGauge, "pool_slots_credit", "Slots reserved ahead for engines' stores (slot credit).", i(func(s *messages.Stats) int { return s.Credit }))
	add(statGauge, "pool_slots_ready", "Readable slots.", i(func(s *messages.Stats) int { return s.Ready }))
	add(statGauge, "pool_slots_pinned", "Slots with at least one read pin.", i(func(s *messages.Stats) int { return s.Pinned }))
	add(statGauge, "pool_slots_leased", "Slots with at least one live lease.", i(func(s *messages.Stats) int { return s.Leased }))
	add(statGauge, "leases", "Live leases.", i(func(s *messages.Stats) int { return s.Leases }))
	add(statGauge, "jobs_in_flight", "Engine jobs awaiting worker reports.", i(func(s *messages.Stats) int { return s.JobsInFlight }))
	add(statGauge, "requests", "Requests with state at the bridge.", i(func(s *messages.Stats) int { return s.Requests }))
	add(statGauge, "paused", "1 while engine intake is paused.", func(s *messages.Stats) float64 { return oneIf(s.Paused) })
	add(statGauge, "pool_bytes_used", "Bytes of slots not free (write-pending, credited or ready), every geometry's.", func(s *messages.Stats) float64 {
		return float64(s.UsedBytes)
	})
	add(statGauge, "pool_bytes_budget", "Bytes every geometry's slots share (pool_bytes).", func(s *messages.Stats) float64 { return float64(s.PoolBytes) })
	add(statGauge, "pool_bytes_committed", "Bytes of the slots with memory behind them, every geometry's: never above pool_bytes_budget.", func(s *messages.Stats) float64 {
		return float64(s.CommittedBytes)
	})
	return c
}

// Describe sends every descriptor the collector may emit, so the registry
// checks names for collisions at registration.
func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	seen := make(map[*prometheus.Desc]bool, len(c.metrics))
	for _, m := range c.metrics {
		if !seen[m.desc] {
			seen[m.desc] = true
			ch <- m.desc
		}
	}
	for _, m := range c.geometry {
		ch <- m.desc
	}
	ch <- c.errDesc
}

// Collect takes one Stats snapshot, bounded by the collector's timeout, and
// emits every metric from it. When Stats fails it emits one invalid metric
// instead, so the scrape fails visibly with the error rather than reporting
// stale or zero values.
func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	s, err := c.stats(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.errDesc, fmt.Errorf("kvtier metrics: reading stats: %w", err))
		return
	}
	for _, m := range c.metrics {
		vt := prometheus.CounterValue
		if m.kind == statGauge {
			vt = prometheus.GaugeValue
		}
		ch <- prometheus.MustNewConstMetric(m.desc, vt, m.value(&s), m.labels...)
	}
	for i := range s.Geometries {
		g := &s.Geometries[i]
		for _, m := range c.geometry {
			ch <- prometheus.MustNewConstMetric(m.desc, prometheus.GaugeValue, float64(m.value(g)), strconv.Itoa(g.BlockBytes))
		}
	}
}

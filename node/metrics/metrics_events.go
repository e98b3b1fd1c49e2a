package metrics

// Prometheus metrics of the KV events hub.

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/events"
)

// RegisterEvents exposes the events hub's counters c and its publisher's
// dropped count on reg, read at scrape time (the hub updates them
// atomically).
func RegisterEvents(reg *prometheus.Registry, c *events.Counters, dropped *atomic.Uint64) {
	counter := func(name, help string, v *atomic.Uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: metricsNamespace, Name: name, Help: help},
			func() float64 { return float64(v.Load()) })
	}
	reg.MustRegister(
		counter("events_batches_total", "KV event batches published.", &c.Batches),
		counter("events_total", "KV events published.", &c.Events),
		counter("events_placeholders_total", "Stored blocks announced without full provenance.", &c.Placeholders),
		counter("events_unknown_removals_total", "Removals of blocks never announced stored (not published).", &c.UnknownRemovals),
		counter("events_held_for_parent_total", "Stored blocks whose announcement waited for their parent's write in the same medium.", &c.HeldForParent),
		counter("events_encode_errors_total", "Event batches dropped because they failed to encode.", &c.EncodeErrors),
		counter("events_learned_blocks_total", "Blocks learned from engines' own KV events (events.learn_from).", &c.Learned),
		counter("events_learned_filled_total", "Stored blocks announced with token ids learned from their engine's events.", &c.Filled),
		counter("events_awaited_tokens_total", "Stored events that waited for their engine's announcement of their token ids.", &c.AwaitedTokens),
		counter("events_tokens_late_total", "Stored events whose wait for their engine's token ids ran out (announced without them).", &c.TokensLate),
		counter("events_reannounced_total", "Resident CPU blocks announced again under the topic of an engine that joined after them.", &c.Reannounced),
		counter("events_dropped_total", "Event batches dropped because the publisher's queue was full.", dropped),
	)
}

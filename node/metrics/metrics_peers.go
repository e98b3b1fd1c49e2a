package metrics

// Prometheus metrics of the peers, read from the control plane's atomic
// counters (peer.Counters) at scrape time: no actor is asked.

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/peer"
	"github.com/kvtier/kvtier/peer/discovery"
	"github.com/kvtier/kvtier/rdma"
)

type peerCollector struct {
	descSet
	counters  *peer.Counters
	transport rdma.Transport // captured at registration: Close clears the node's field
}

var peerMetricHelp = map[string]string{
	"peer_ready":                    "1 while this node can fetch from the peer (its outbound session is ready).",
	"peer_serving":                  "1 while this node serves the peer (its inbound session is ready).",
	"peer_lookup_keys_total":        "Keys this node asked the peer for.",
	"peer_lookup_hits_total":        "Keys the peer held when asked.",
	"peer_fetched_blocks_total":     "Blocks fetched from the peer and verified.",
	"peer_fetched_bytes_total":      "Bytes fetched from the peer and verified.",
	"peer_fetch_seconds_total":      "Time spent in completed fetch rounds from the peer (divide by peer_fetches_total for the mean).",
	"peer_fetches_total":            "Fetch rounds from the peer that completed.",
	"peer_round_failures_total":     "Rounds with the peer that failed: timeout, refused, session lost.",
	"peer_corrupt_blocks_total":     "Blocks from the peer that failed their checksum (dropped, never committed).",
	"peer_served_blocks_total":      "Blocks this node wrote into the peer's pool.",
	"peer_frames_dropped_total":     "Control-plane frames dropped, by reason (malformed, stale epoch, replayed round, bad slot, ...).",
	"peer_handshakes_refused_total": "Peer handshakes refused, by reason (auth, not_allowed, version, namespace, geometry, ...).",
	"rdma_bytes_sent_total":         "Data-plane bytes written into peers' pools.",
	"rdma_bytes_received_total":     "Data-plane bytes received into this node's pool.",
	"rdma_writes_total":             "Data-plane writes (producer side), by result.",
	"rdma_expects_total":            "Data-plane expected transfers (consumer side), by result.",
	"rdma_refused_total":            "Data-plane transfers refused: unknown token, wrong peer or slots, bad frame.",
	"rdma_pending":                  "Data-plane transfers in flight, by side.",
}

// RegisterPeers adds the peers' metrics to reg: the control plane's
// counters, the data plane's transport (nil: none) and etcd discovery's
// registry (nil: discovery off).
func RegisterPeers(reg *prometheus.Registry, counters *peer.Counters, transport rdma.Transport, disc *discovery.Registry) {
	descs := newDescSet(peerMetricHelp, func(name string) []string {
		switch name {
		case "peer_frames_dropped_total", "peer_handshakes_refused_total":
			return []string{"reason"}
		case "rdma_bytes_sent_total", "rdma_bytes_received_total", "rdma_refused_total":
			return []string{"kind"}
		case "rdma_writes_total", "rdma_expects_total":
			return []string{"kind", "result"}
		case "rdma_pending":
			return []string{"kind", "side"}
		}
		return []string{"peer"}
	})
	reg.MustRegister(&peerCollector{descSet: descs, counters: counters, transport: transport})
	if disc != nil {
		reg.MustRegister(&discoveryCollector{descSet: newDescSet(discoveryMetricHelp, noLabels), reg: disc})
	}
}

// discoveryCollector reads etcd discovery's state (peers.discovery) at
// scrape time; registered only with discovery on.
type discoveryCollector struct {
	descSet
	reg *discovery.Registry
}

var discoveryMetricHelp = map[string]string{
	"discovery_up":                  "1 while this node is registered in etcd and watching its members; 0 while etcd does not answer (sessions to peers already found keep serving).",
	"discovery_members":             "Members this node knows from etcd, itself excluded (kept as they were while etcd is down).",
	"discovery_registrations_total": "Registrations of this node in etcd, each under a new lease: one per start, one more per outage of etcd past the lease ttl.",
}

func noLabels(string) []string { return nil }

func (c *discoveryCollector) Collect(ch chan<- prometheus.Metric) {
	c.send(ch, "discovery_up", prometheus.GaugeValue, oneIf(c.reg.Up()))
	c.send(ch, "discovery_members", prometheus.GaugeValue, float64(c.reg.Members()))
	c.send(ch, "discovery_registrations_total", prometheus.CounterValue, float64(c.reg.Registrations()))
}

func (c *peerCollector) Collect(ch chan<- prometheus.Metric) {
	ctr := c.counters
	metric := func(name string, kind prometheus.ValueType, v float64, labels ...string) {
		c.send(ch, name, kind, v, labels...)
	}
	for _, p := range ctr.Peers() {
		metric("peer_ready", prometheus.GaugeValue, oneIf(p.Ready), p.Node)
		metric("peer_serving", prometheus.GaugeValue, oneIf(p.Serving), p.Node)
		metric("peer_lookup_keys_total", prometheus.CounterValue, float64(p.Lookups), p.Node)
		metric("peer_lookup_hits_total", prometheus.CounterValue, float64(p.Hits), p.Node)
		metric("peer_fetched_blocks_total", prometheus.CounterValue, float64(p.Fetched), p.Node)
		metric("peer_fetched_bytes_total", prometheus.CounterValue, float64(p.FetchBytes), p.Node)
		metric("peer_fetch_seconds_total", prometheus.CounterValue, float64(p.FetchNanos)/1e9, p.Node)
		metric("peer_fetches_total", prometheus.CounterValue, float64(p.Fetches), p.Node)
		metric("peer_round_failures_total", prometheus.CounterValue, float64(p.Failures), p.Node)
		metric("peer_corrupt_blocks_total", prometheus.CounterValue, float64(p.Corrupt), p.Node)
		metric("peer_served_blocks_total", prometheus.CounterValue, float64(p.Served), p.Node)
	}
	for reason, v := range ctr.Dropped() {
		metric("peer_frames_dropped_total", prometheus.CounterValue, float64(v), reason)
	}
	for reason, v := range ctr.Refused() {
		metric("peer_handshakes_refused_total", prometheus.CounterValue, float64(v), reason)
	}
	if t := c.transport; t != nil {
		st, k := t.Stats(), t.Kind()
		metric("rdma_bytes_sent_total", prometheus.CounterValue, float64(st.BytesSent), k)
		metric("rdma_bytes_received_total", prometheus.CounterValue, float64(st.BytesReceived), k)
		metric("rdma_writes_total", prometheus.CounterValue, float64(st.WritesOK), k, "ok")
		metric("rdma_writes_total", prometheus.CounterValue, float64(st.WritesFailed), k, "failed")
		metric("rdma_expects_total", prometheus.CounterValue, float64(st.ExpectsOK), k, "ok")
		metric("rdma_expects_total", prometheus.CounterValue, float64(st.ExpectsFailed), k, "failed")
		metric("rdma_refused_total", prometheus.CounterValue, float64(st.Refused), k)
		metric("rdma_pending", prometheus.GaugeValue, float64(st.PendingWrites), k, "write")
		metric("rdma_pending", prometheus.GaugeValue, float64(st.PendingExpects), k, "expect")
	}
}

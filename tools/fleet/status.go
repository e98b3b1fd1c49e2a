// Package fleet reads a fleet's state for its operator (`kvtier fleet
// status`): the members registered in etcd (peer/discovery) and, for each,
// what its /readyz and /metrics say. It only reads: it never registers,
// never dials the peer plane, and changes nothing.
package fleet

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvtier/kvtier/peer/discovery"
)

// Node is one member's status.
type Node struct {
	Node    string    `json:"node_id"`
	Control string    `json:"control"`
	Metrics string    `json:"metrics,omitempty"`
	Started time.Time `json:"started"`
	// Err says why the rest is missing: no metrics URL registered, or the
	// node did not answer.
	Err   string `json:"error,omitempty"`
	Ready bool   `json:"ready"` // its /readyz answered 200
	// Blocks per tier: "cpu" (readable slots) and each secondary tier by
	// name (the P2P tier holds none of its own and is left out).
	Blocks  map[string]float64 `json:"blocks,omitempty"`
	Lookups float64            `json:"lookups"`  // keys looked up
	HitRate float64            `json:"hit_rate"` // keys answered HIT / keys looked up
	// PeersReady and PeersServing count the sessions this node can fetch
	// from and serves; PeerFetched is the blocks it fetched from peers.
	PeersReady   int     `json:"peers_ready"`
	PeersServing int     `json:"peers_serving"`
	PeerFetched  float64 `json:"peer_fetched_blocks"`
	// MessagesPerMiss is its P2P tier's peers asked per lookup (0 with no
	// lookup yet); DirectoryKeys what its directory records.
	MessagesPerMiss float64 `json:"messages_per_miss"`
	DirectoryKeys   float64 `json:"directory_keys"`
	DiscoveryUp     bool    `json:"discovery_up"`
}

// Report is the fleet's status.
type Report struct {
	Nodes []Node `json:"nodes"`
	// BadRecords are keys under the prefix that are not member records.
	BadRecords map[string]string `json:"bad_records,omitempty"`
}

// Options say where the fleet is.
type Options struct {
	Endpoints []string      // etcd
	Prefix    string        // the fleet's prefix (discovery.DefaultPrefix)
	Timeout   time.Duration // per etcd request and per node's HTTP calls
}

// Status lists the members and reads every node's probes at once.
func Status(ctx context.Context, o Options) (Report, error) {
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	members, bad, err := discovery.List(ctx, o.Endpoints, o.Prefix, o.Timeout)
	if err != nil {
		return Report{}, err
	}
	r := Report{Nodes: make([]Node, len(members))}
	client := &http.Client{Timeout: o.Timeout}
	var wg sync.WaitGroup
	for i, m := range members {
		r.Nodes[i] = Node{Node: m.Node, Control: m.Control, Metrics: m.Metrics, Started: m.Started}
		wg.Add(1)
		go func(n *Node) {
			defer wg.Done()
			n.read(ctx, client)
		}(&r.Nodes[i])
	}
	wg.Wait()
	if len(bad) > 0 {
		r.BadRecords = map[string]string{}
		for k, e := range bad {
			r.BadRecords[k] = e.Error()
		}
	}
	return r, nil
}

// read fills n from its /readyz and /metrics.
func (n *Node) read(ctx context.Context, client *http.Client) {
	if n.Metrics == "" {
		n.Err = "no metrics URL registered"
		return
	}
	code, _, err := get(ctx, client, strings.TrimSuffix(n.Metrics, "/metrics")+"/readyz")
	if err != nil {
		n.Err = err.Error()
		return
	}
	n.Ready = code == http.StatusOK
	code, body, err := get(ctx, client, n.Metrics)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET %s: %d", n.Metrics, code)
	}
	if err != nil {
		n.Err = err.Error()
		return
	}
	families, err := parse(body)
	if err != nil {
		n.Err = err.Error()
		return
	}
	n.fill(families)
}

func get(ctx context.Context, client *http.Client, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return resp.StatusCode, body, err
}

func parse(body []byte) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return families, nil
}

// fill reads the figures the table shows from a node's metrics.
func (n *Node) fill(f map[string]*dto.MetricFamily) {
	n.Blocks = map[string]float64{"cpu": sum(f, "kvtier_pool_slots_ready")}
	for _, m := range metrics(f, "kvtier_tier_blocks") {
		if tier := label(m, "tier"); tier != "" && value(m) >= 0 {
			n.Blocks[tier] = value(m)
		}
	}
	n.Lookups = sum(f, "kvtier_lookups_total")
	if n.Lookups > 0 {
		n.HitRate = sum(f, "kvtier_lookup_hits_total") / n.Lookups
	}
	one := func(m *dto.Metric) bool { return value(m) == 1 }
	n.PeersReady = len(filter(metrics(f, "kvtier_peer_ready"), one))
	n.PeersServing = len(filter(metrics(f, "kvtier_peer_serving"), one))
	n.PeerFetched = sum(f, "kvtier_peer_fetched_blocks_total")
	if calls := sum(f, "kvtier_peer_lookup_calls_total"); calls > 0 {
		n.MessagesPerMiss = sum(f, "kvtier_peer_asks_total") / calls
	}
	n.DirectoryKeys = sum(f, "kvtier_peer_directory_keys")
	n.DiscoveryUp = sum(f, "kvtier_discovery_up") == 1
}

func metrics(f map[string]*dto.MetricFamily, name string) []*dto.Metric {
	if mf := f[name]; mf != nil {
		return mf.GetMetric()
	}
	return nil
}

// sum adds up every series of a metric (over its labels).
func sum(f map[string]*dto.MetricFamily, name string) float64 {
	total := 0.0
	for _, m := range metrics(f, name) {
		total += value(m)
	}
	return total
}

func filter(ms []*dto.Metric, keep func(*dto.Metric) bool) []*dto.Metric {
	var out []*dto.Metric
	for _, m := range ms {
		if keep(m) {
			out = append(out, m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Tiers is every tier name in the report, "cpu" first, for a table's
// columns.
func (r Report) Tiers() []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range r.Nodes {
		for t := range n.Blocks {
			if !seen[t] && t != "cpu" {
				seen[t] = true
				out = append(out, t)
			}
		}
	}
	sort.Strings(out)
	return append([]string{"cpu"}, out...)
}

package node

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/internal/testutil/testetcd"
)

// The alert rules operators load (deploy/prometheus/kvtier.rules.yml) name
// only metrics a node exports: a node with every subsystem that has
// metrics (engine endpoint, KV events, an fs tier, peers) describes every
// metric its rules read. (`promtool test rules` in the test command checks
// what each rule fires on.)
func TestAlertRulesNameOnlyExportedMetrics(t *testing.T) {
	rules := alertRuleMetrics(t, "../deploy/prometheus/kvtier.rules.yml")
	require.Greater(t, len(rules), 10)
	exported := describedMetrics(fullNode(t).Registry())
	for name, alerts := range rules {
		require.True(t, exported[name], "alerts %v read %s, which the node does not export", alerts, name)
	}
}

// The Grafana dashboard (deploy/grafana/kvtier.json) charts only metrics a
// node exports (a histogram's _bucket/_sum/_count series by its name).
func TestDashboardNamesOnlyExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("../deploy/grafana/kvtier.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(data, &dash))
	exported := describedMetrics(fullNode(t).Registry())
	charted := 0
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			for _, name := range metricName.FindAllString(target.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
				require.True(t, exported[name] || exported[base], "panel %q reads %s, which the node does not export", p.Title, name)
				charted++
			}
		}
	}
	require.Greater(t, charted, 30)
}

// fullNode opens a node with every subsystem that has metrics: an engine
// endpoint, KV events, an fs tier and peers found through etcd.
func fullNode(t *testing.T) *Node {
	t.Helper()
	dir := t.TempDir()
	directory := func(pc *config.PeersConfig) { pc.Directory = true }
	return open(t, 16, withFS(filepath.Join(dir, "fs")), withDiscovery("n1", testetcd.Start(t), directory), func(c *config.Config) {
		c.PoolPath, c.EngineListen = filepath.Join(dir, "pool"), "ipc://"+filepath.Join(dir, "engine.sock")
		c.Events = config.EventsConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", NodeID: "n1", Model: "m"}
	}).node
}

var metricName = regexp.MustCompile(`\bkvtier_[a-z0-9_]+`)

// alertRuleMetrics maps each kvtier metric a rules file's expressions read
// to the alerts that read it.
func alertRuleMetrics(t *testing.T, path string) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(data, &file))
	out := map[string][]string{}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			names := metricName.FindAllString(r.Expr, -1)
			require.NotEmpty(t, names, "alert %s reads no kvtier metric", r.Alert)
			for _, n := range names {
				if !slices.Contains(out[n], r.Alert) {
					out[n] = append(out[n], r.Alert)
				}
			}
		}
	}
	return out
}

var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

// describedMetrics are the names of every metric a registry's collectors
// describe, whether or not they have a sample yet (a labelled family with
// no child is described but not gathered).
func describedMetrics(reg *prometheus.Registry) map[string]bool {
	ch := make(chan *prometheus.Desc)
	go func() {
		reg.Describe(ch)
		close(ch)
	}()
	out := map[string]bool{}
	for d := range ch {
		if m := descName.FindStringSubmatch(d.String()); m != nil {
			out[m[1]] = true
		}
	}
	return out
}

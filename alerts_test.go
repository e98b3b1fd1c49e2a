package kvtier

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// The alert rules operators load (deploy/prometheus/kvtier.rules.yml) name
// only metrics a node exports: a node with every subsystem that has
// metrics (engine endpoint, KV events, an fs tier, peers) describes every
// metric its rules read. (`promtool test rules` in the test command checks
// what each rule fires on.)
func TestAlertRulesNameOnlyExportedMetrics(t *testing.T) {
	rules := alertRuleMetrics(t, "deploy/prometheus/kvtier.rules.yml")
	require.Greater(t, len(rules), 10)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	cfg := Config{PoolPath: filepath.Join(dir, "pool"), PoolBytes: 16 * testBlock, BlockBytes: testBlock,
		EngineListen: "ipc://" + filepath.Join(dir, "engine.sock"),
		Events:       EventsConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0", NodeID: "n1", Model: "m"}}
	withFS(filepath.Join(dir, "fs"))(&cfg)
	withPeers("n1")(&cfg)
	node, err := Open(ctx, cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, node.Close(ctx)) }()

	exported := describedMetrics(node.Registry())
	for name, alerts := range rules {
		require.True(t, exported[name], "alerts %v read %s, which the node does not export", alerts, name)
	}
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

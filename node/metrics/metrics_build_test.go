package metrics

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/internal/version"
	"github.com/kvtier/kvtier/messages"
)

func TestBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		info version.Info
		want string
	}{
		{version.Info{Version: "v0.4.0", Revision: "0123abcd4567890", GoVersion: "go1.26.8"},
			`kvtier_build_info{go_version="go1.26.8",revision="0123abcd4567890",version="v0.4.0"} 1`},
		{version.Info{Version: "(devel)", Revision: "abc", Modified: true, GoVersion: "go1.26.8"},
			`kvtier_build_info{go_version="go1.26.8",revision="abc+dirty",version="(devel)"} 1`},
		{version.Info{Version: "unknown", GoVersion: "go1.26.8"},
			`kvtier_build_info{go_version="go1.26.8",revision="unknown",version="unknown"} 1`},
	} {
		const head = "# HELP kvtier_build_info The build this node runs: version, VCS revision and Go toolchain; always 1.\n# TYPE kvtier_build_info gauge\n"
		require.NoError(t, testutil.CollectAndCompare(newBuildInfo(tc.info), strings.NewReader(head+tc.want+"\n")))
	}
}

// TestNodeRegistryHasBuildInfo: the node's registry (what /metrics
// serves) carries the running binary's build, linting clean.
func TestNodeRegistryHasBuildInfo(t *testing.T) {
	reg, _ := New(func(context.Context) (messages.Stats, error) { return fakeStats(), nil }, 0)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	info := version.Get()
	var found bool
	for _, mf := range mfs {
		if mf.GetName() != "kvtier_build_info" {
			continue
		}
		found = true
		require.Len(t, mf.GetMetric(), 1)
		m := mf.GetMetric()[0]
		require.Equal(t, 1.0, m.GetGauge().GetValue())
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		require.Equal(t, info.Version, labels["version"])
		require.Equal(t, info.GoVersion, labels["go_version"])
		require.Contains(t, labels, "revision")
	}
	require.True(t, found, "kvtier_build_info missing")
	problems, err := testutil.GatherAndLint(reg, "kvtier_build_info")
	require.NoError(t, err)
	require.Empty(t, problems)
}

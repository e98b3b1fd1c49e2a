package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtier/kvtier/internal/version"
)

// newBuildInfo is kvtier_build_info{version,revision,go_version} 1: which
// build a node runs (version.Get), the labels what `kvtierd --version`
// prints. revision is the full VCS revision, "+dirty" when the work tree
// had changes, "unknown" when Go recorded none.
func newBuildInfo(info version.Info) prometheus.Collector {
	rev := info.Revision
	if rev == "" {
		rev = "unknown"
	}
	if info.Modified {
		rev += "+dirty"
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: metricsNamespace,
		Name:      "build_info",
		Help:      "The build this node runs: version, VCS revision and Go toolchain; always 1.",
		ConstLabels: prometheus.Labels{
			"version":    info.Version,
			"revision":   rev,
			"go_version": info.GoVersion,
		},
	})
	g.Set(1)
	return g
}

package metrics

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

// fakeStats returns a fixed snapshot with a distinct value in every field.
func fakeStats() messages.Stats {
	return messages.Stats{
		Slots: 256, BlockBytes: 64 << 10, Free: 200, WritePending: 6, Ready: 50,
		Pinned: 3, Leased: 4, Leases: 5, JobsInFlight: 2, Requests: 7, Paused: true,
		Lookups: 100, Hits: 40, HitsPending: 10, Misses: 50, Stores: 60, StoresFailed: 1,
		Evictions: 8, Full: 2, LeasesExpired: 3, JobsCompleted: 20, JobsReapedLoad: 4,
		JobsReapedStore: 5, LateReports: 6, ChecksumFailures: 7, ActorRestarts: 9,
		PoolBytes: 256 << 16, CommittedBytes: 256 << 16, UsedBytes: 56 << 16,
		Geometries: []messages.GeometryStats{{BlockBytes: 64 << 10, Slots: 256, Committed: 256, Free: 200, Ready: 50}},
	}
}

func TestNodeMetricsFromStats(t *testing.T) {
	s := fakeStats()
	var gotDeadline bool
	reg, _ := New(func(ctx context.Context) (messages.Stats, error) {
		_, gotDeadline = ctx.Deadline()
		return s, nil
	}, time.Second)

	const want = `
# HELP kvtier_lookups_total Keys looked up.
# TYPE kvtier_lookups_total counter
kvtier_lookups_total 100
# HELP kvtier_lookup_hits_total Keys answered HIT.
# TYPE kvtier_lookup_hits_total counter
kvtier_lookup_hits_total 40
# HELP kvtier_lookup_hits_pending_total Keys answered HIT_PENDING.
# TYPE kvtier_lookup_hits_pending_total counter
kvtier_lookup_hits_pending_total 10
# HELP kvtier_lookup_misses_total Keys answered MISS.
# TYPE kvtier_lookup_misses_total counter
kvtier_lookup_misses_total 50
# HELP kvtier_stores_total Keys committed readable.
# TYPE kvtier_stores_total counter
kvtier_stores_total 60
# HELP kvtier_stores_failed_total Reserved keys freed by a failed or reaped store.
# TYPE kvtier_stores_failed_total counter
kvtier_stores_failed_total 1
# HELP kvtier_evictions_total Blocks evicted to make room.
# TYPE kvtier_evictions_total counter
kvtier_evictions_total 8
# HELP kvtier_store_full_total PrepareStore calls answered Full.
# TYPE kvtier_store_full_total counter
kvtier_store_full_total 2
# HELP kvtier_leases_expired_total Leases that ran out before PrepareLoad.
# TYPE kvtier_leases_expired_total counter
kvtier_leases_expired_total 3
# HELP kvtier_jobs_completed_total Engine jobs completed.
# TYPE kvtier_jobs_completed_total counter
kvtier_jobs_completed_total 20
# HELP kvtier_stalled_transfers_total Transfer jobs reaped at their deadline.
# TYPE kvtier_stalled_transfers_total counter
kvtier_stalled_transfers_total{kind="load"} 4
kvtier_stalled_transfers_total{kind="store"} 5
# HELP kvtier_late_reports_total Worker reports for unknown, finished or reaped jobs.
# TYPE kvtier_late_reports_total counter
kvtier_late_reports_total 6
# HELP kvtier_checksum_failures_total Block verifications that found wrong bytes.
# TYPE kvtier_checksum_failures_total counter
kvtier_checksum_failures_total 7
# HELP kvtier_actor_restarts_total Supervised actor restarts.
# TYPE kvtier_actor_restarts_total counter
kvtier_actor_restarts_total 9
# HELP kvtier_pool_slots Slots in the CPU pool holding their bytes, every block size's.
# TYPE kvtier_pool_slots gauge
kvtier_pool_slots 256
# HELP kvtier_pool_block_bytes Bytes per slot of the pool's first block size.
# TYPE kvtier_pool_block_bytes gauge
kvtier_pool_block_bytes 65536
# HELP kvtier_pool_slots_free Free slots.
# TYPE kvtier_pool_slots_free gauge
kvtier_pool_slots_free 200
# HELP kvtier_pool_slots_write_pending Slots being written.
# TYPE kvtier_pool_slots_write_pending gauge
kvtier_pool_slots_write_pending 6
# HELP kvtier_pool_slots_ready Readable slots.
# TYPE kvtier_pool_slots_ready gauge
kvtier_pool_slots_ready 50
# HELP kvtier_pool_slots_pinned Slots with at least one read pin.
# TYPE kvtier_pool_slots_pinned gauge
kvtier_pool_slots_pinned 3
# HELP kvtier_pool_slots_leased Slots with at least one live lease.
# TYPE kvtier_pool_slots_leased gauge
kvtier_pool_slots_leased 4
# HELP kvtier_leases Live leases.
# TYPE kvtier_leases gauge
kvtier_leases 5
# HELP kvtier_jobs_in_flight Engine jobs awaiting worker reports.
# TYPE kvtier_jobs_in_flight gauge
kvtier_jobs_in_flight 2
# HELP kvtier_requests Requests with state at the bridge.
# TYPE kvtier_requests gauge
kvtier_requests 7
# HELP kvtier_paused 1 while engine intake is paused.
# TYPE kvtier_paused gauge
kvtier_paused 1
# HELP kvtier_pool_bytes_used Bytes of slots not free (write-pending, credited or ready), every geometry's.
# TYPE kvtier_pool_bytes_used gauge
kvtier_pool_bytes_used 3.670016e+06
# HELP kvtier_pool_bytes_budget Bytes every geometry's slots share (pool_bytes).
# TYPE kvtier_pool_bytes_budget gauge
kvtier_pool_bytes_budget 1.6777216e+07
# HELP kvtier_pool_bytes_committed Bytes of the slots with memory behind them, every geometry's: never above pool_bytes_budget.
# TYPE kvtier_pool_bytes_committed gauge
kvtier_pool_bytes_committed 1.6777216e+07
# HELP kvtier_pool_geometry_slots_ready A geometry's slots holding a readable block.
# TYPE kvtier_pool_geometry_slots_ready gauge
kvtier_pool_geometry_slots_ready{block_bytes="65536"} 50
`
	names := []string{
		"kvtier_lookups_total", "kvtier_lookup_hits_total", "kvtier_lookup_hits_pending_total",
		"kvtier_lookup_misses_total", "kvtier_stores_total", "kvtier_stores_failed_total",
		"kvtier_evictions_total", "kvtier_store_full_total", "kvtier_leases_expired_total",
		"kvtier_jobs_completed_total", "kvtier_stalled_transfers_total", "kvtier_late_reports_total",
		"kvtier_checksum_failures_total", "kvtier_actor_restarts_total",
		"kvtier_pool_slots", "kvtier_pool_block_bytes", "kvtier_pool_slots_free",
		"kvtier_pool_slots_write_pending", "kvtier_pool_slots_ready", "kvtier_pool_slots_pinned",
		"kvtier_pool_slots_leased", "kvtier_leases", "kvtier_jobs_in_flight", "kvtier_requests",
		"kvtier_paused", "kvtier_pool_bytes_used", "kvtier_pool_bytes_budget", "kvtier_pool_bytes_committed",
		"kvtier_pool_geometry_slots_ready",
	}
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), names...))
	require.True(t, gotDeadline, "stats must be called with a deadline")

	// The registry lints clean (names, units, help).
	problems, err := testutil.GatherAndLint(reg, names...)
	require.NoError(t, err)
	require.Empty(t, problems)
}

func TestNodeMetricsStandardCollectors(t *testing.T) {
	reg, _ := New(func(context.Context) (messages.Stats, error) { return fakeStats(), nil }, 0)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	have := map[string]bool{}
	for _, mf := range mfs {
		have[mf.GetName()] = true
	}
	require.True(t, have["go_goroutines"], "Go collector registered")
	require.True(t, have["process_open_fds"] || have["process_cpu_seconds_total"], "process collector registered")
}

func TestNodeMetricsLookupLatency(t *testing.T) {
	reg, m := New(func(context.Context) (messages.Stats, error) { return fakeStats(), nil }, time.Second)
	m.LookupLatency.Observe(50e-6)
	m.LookupLatency.Observe(0.2)
	require.Equal(t, 1, testutil.CollectAndCount(m.LookupLatency))

	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "kvtier_lookup_duration_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		require.EqualValues(t, 2, h.GetSampleCount())
		b := h.GetBucket()
		require.InDelta(t, 10e-6, b[0].GetUpperBound(), 1e-12)
		require.GreaterOrEqual(t, b[len(b)-1].GetUpperBound(), 1.0)
		return
	}
	t.Fatal("kvtier_lookup_duration_seconds not gathered")
}

func TestNodeMetricsStatsError(t *testing.T) {
	boom := errors.New("bridge unreachable")
	reg, _ := New(func(context.Context) (messages.Stats, error) {
		return messages.Stats{}, boom
	}, time.Second)
	_, err := reg.Gather()
	require.Error(t, err)
	require.Contains(t, err.Error(), "bridge unreachable")
}

func TestNodeMetricsStatsTimeout(t *testing.T) {
	reg, _ := New(func(ctx context.Context) (messages.Stats, error) {
		<-ctx.Done() // a node that never answers
		return messages.Stats{}, ctx.Err()
	}, 10*time.Millisecond)
	_, err := reg.Gather()
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"
)

// Summary is the outcome of a run. Every count is a deterministic function
// of the workload, the seed and the configuration; only the latencies and
// the wall time vary between runs.
type Summary struct {
	Mode     string `json:"mode"` // "synthetic" or "trace"
	Seed     uint64 `json:"seed"`
	Requests int    `json:"requests"`
	Steps    int    `json:"steps"`

	PromptBlocks     int `json:"prompt_blocks"`     // blocks of every prompt
	GPUHitBlocks     int `json:"gpu_hit_blocks"`    // found in the GPU cache
	BlocksLoaded     int `json:"blocks_loaded"`     // loaded from kvtier
	BlocksVerified   int `json:"blocks_verified"`   // loaded blocks whose every byte matched
	CorruptBlocks    int `json:"corrupt_blocks"`    // loaded blocks with a wrong byte
	BlocksRecomputed int `json:"blocks_recomputed"` // neither in GPU nor loaded
	BlocksStored     int `json:"blocks_stored"`     // written into slots by store jobs
	StoreSkipped     int `json:"store_skipped"`     // blocks not stored because PrepareStore said Full

	HitRate      float64  `json:"hit_rate"`     // (gpu hits + loaded) / prompt blocks
	GPUHitRate   float64  `json:"gpu_hit_rate"` // gpu hits / prompt blocks
	CPUHitRate   float64  `json:"cpu_hit_rate"` // loaded from kvtier's CPU tier / prompt blocks (HIT at the first ask)
	IdealHitRate *float64 `json:"ideal_hit_rate,omitempty"`
	// UnreachableCapacity is the share of the blocks the node held, sampled
	// every Config.ReachEvery steps, whose chain to the root was broken (a
	// parent held in no tier): no prefix lookup can reach them. Absent when
	// not measured (a remote node).
	UnreachableCapacity *float64 `json:"unreachable_capacity_fraction,omitempty"`

	// Secondary tiers (tiers.go): blocks loaded after a RETRY (promoted
	// from a secondary tier), their rate, and per tier kind the share of
	// those hits by the blocks each tier promoted (exact with one tier).
	SecondaryHitBlocks int               `json:"secondary_hit_blocks,omitempty"`
	SecondaryHitRate   float64           `json:"secondary_hit_rate"`
	FSHitRate          float64           `json:"fs_hit_rate"`
	ObjHitRate         float64           `json:"obj_hit_rate"`
	TierPromoted       map[string]uint64 `json:"tier_promoted_blocks,omitempty"`
	TierKinds          map[string]string `json:"-"`
	CascadeDropped     uint64            `json:"cascade_dropped,omitempty"`
	// PromotionFailures counts promotions that did not land, by reason:
	// "full" (no CPU slot), "busy" (a tier shed the read: asked again, never
	// a lost hit), "failed" (I/O or verification), "reaped" (deadline).
	PromotionFailures map[string]uint64 `json:"promotion_failures,omitempty"`
	TierSettles       int               `json:"tier_settles,omitempty"` // steps after which the run waited for secondary lookups to finish

	Lookups       int `json:"lookups"`        // Lookup calls
	LookupWaits   int `json:"lookup_waits"`   // steps a request waited on RETRY or HIT_PENDING
	PendingGiveUp int `json:"pending_giveup"` // lookups that stopped waiting and recomputed
	LoadErrors    int `json:"load_errors"`    // PrepareLoad calls that failed (blocks recomputed)
	StoreFull     int `json:"store_full"`     // PrepareStore calls answered Full
	LoadJobs      int `json:"load_jobs"`
	StoreJobs     int `json:"store_jobs"`
	LateReports   int `json:"late_reports"` // JobDone answered ErrUnknownJob
	// SettlePolls counts Stats polls spent waiting for commits to land;
	// SettleTimeouts the waits given up (the run may then not reproduce).
	SettlePolls    int `json:"settle_polls"`
	SettleTimeouts int `json:"settle_timeouts"`

	LookupP50us float64 `json:"lookup_p50_us"`
	LookupP99us float64 `json:"lookup_p99_us"`

	Evictions          uint64 `json:"evictions"`     // the node's evictions to make room
	NodeRequests       int    `json:"node_requests"` // requests with state at the node after the run
	LeakedPins         int    `json:"leaked_pins"`
	LeakedLeases       int    `json:"leaked_leases"`
	LeakedWritePending int    `json:"leaked_write_pending"`
	PendingWorkAtEnd   bool   `json:"pending_work_at_end"`

	VirtualSeconds float64 `json:"virtual_seconds"`
	WallSeconds    float64 `json:"wall_seconds"`
}

// Healthy reports whether the run ended clean: no corrupt block, no leak.
func (s Summary) Healthy() bool {
	return s.CorruptBlocks == 0 && s.LeakedPins == 0 && s.LeakedLeases == 0 &&
		s.LeakedWritePending == 0 && !s.PendingWorkAtEnd
}

// Counts returns s without its timing fields, for comparing two runs.
func (s Summary) Counts() Summary {
	s.LookupP50us, s.LookupP99us, s.WallSeconds, s.SettlePolls = 0, 0, 0, 0
	return s
}

// finish computes the rates and latency percentiles.
func (s *Summary) finish(latencies []time.Duration) {
	s.HitRate = ratio(s.GPUHitBlocks+s.BlocksLoaded, s.PromptBlocks)
	s.GPUHitRate = ratio(s.GPUHitBlocks, s.PromptBlocks)
	s.CPUHitRate = ratio(s.BlocksLoaded-s.SecondaryHitBlocks, s.PromptBlocks)
	s.SecondaryHitRate = ratio(s.SecondaryHitBlocks, s.PromptBlocks)
	s.FSHitRate, s.ObjHitRate = s.tierShare("fs"), s.tierShare("obj")
	slices.Sort(latencies)
	s.LookupP50us = micros(percentile(latencies, 0.50))
	s.LookupP99us = micros(percentile(latencies, 0.99))
}

// percentile is the nearest-rank percentile of sorted d (0 when empty).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted)) + 0.5)
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}

// micros renders d in microseconds.
func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// WriteText prints the summary for a human.
func (s Summary) WriteText(w io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	p("mode %s, seed %d: %d requests in %d steps (%.1f s virtual, %.2f s wall)",
		s.Mode, s.Seed, s.Requests, s.Steps, s.VirtualSeconds, s.WallSeconds)
	p("prompt blocks   %d", s.PromptBlocks)
	p("hit rate        %.2f%%  (gpu %.2f%%, cpu %.2f%%)", 100*s.HitRate, 100*s.GPUHitRate, 100*s.CPUHitRate)
	if s.TierPromoted != nil {
		p("secondary       %.2f%% of blocks loaded after promotion (fs %.2f%%, obj %.2f%%); promoted %v; cascade dropped %d; promotion failures %v",
			100*s.SecondaryHitRate, 100*s.FSHitRate, 100*s.ObjHitRate, s.TierPromoted, s.CascadeDropped, s.PromotionFailures)
	}
	if s.UnreachableCapacity != nil {
		p("unreachable     %.2f%%  of held blocks (a parent held in no tier: no prefix lookup reaches them)", 100**s.UnreachableCapacity)
	}
	if s.IdealHitRate != nil {
		p("ideal hit rate  %.2f%%  (unbounded cache, prefix semantics)", 100**s.IdealHitRate)
	}
	p("blocks          gpu-hit %d, loaded %d, verified %d, corrupt %d, recomputed %d",
		s.GPUHitBlocks, s.BlocksLoaded, s.BlocksVerified, s.CorruptBlocks, s.BlocksRecomputed)
	p("stores          stored %d, skipped (full) %d in %d calls", s.BlocksStored, s.StoreSkipped, s.StoreFull)
	p("jobs            load %d, store %d, late reports %d, load errors %d; commit waits %d polls, %d timeouts",
		s.LoadJobs, s.StoreJobs, s.LateReports, s.LoadErrors, s.SettlePolls, s.SettleTimeouts)
	p("lookups         %d calls, p50 %.1f µs, p99 %.1f µs; %d waits, %d gave up",
		s.Lookups, s.LookupP50us, s.LookupP99us, s.LookupWaits, s.PendingGiveUp)
	p("node            %d evictions, %d requests with state at the end", s.Evictions, s.NodeRequests)
	p("leaks           pins %d, leases %d, write-pending %d, pending work %v",
		s.LeakedPins, s.LeakedLeases, s.LeakedWritePending, s.PendingWorkAtEnd)
}

// WriteJSON prints the summary as one JSON object on one line.
func (s Summary) WriteJSON(w io.Writer) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// tierShare is the secondary hit rate attributed to tiers of kind, in
// proportion to the blocks each tier promoted.
func (s *Summary) tierShare(kind string) float64 {
	var all, mine uint64
	for name, n := range s.TierPromoted {
		all += n
		if s.TierKinds[name] == kind {
			mine += n
		}
	}
	if all == 0 {
		return 0
	}
	return s.SecondaryHitRate * float64(mine) / float64(all)
}

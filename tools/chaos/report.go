package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/fs"
)

// Report is the outcome of a run.
type Report struct {
	Scenario string   `json:"scenario"`
	Seed     uint64   `json:"seed"`
	Duration string   `json:"duration"`
	Kinds    []string `json:"fault_kinds"`
	// FSLayout is the fs tiers' layout.
	FSLayout string `json:"fs_layout"`

	FaultsInjected int               `json:"faults_injected"`
	FaultsByKind   map[string]uint64 `json:"faults_by_kind"` // every enabled kind, 0 included
	// KindsNotExercised are enabled kinds the run never injected.
	KindsNotExercised []string `json:"kinds_not_exercised,omitempty"`

	Operations       int64                 `json:"operations"` // manager calls by the engines
	OperationsByCall map[string]CallReport `json:"operations_by_call"`
	Requests         int64                 `json:"requests"`
	Blocks           BlockReport           `json:"blocks"`
	// Recomputes are blocks the engines had found in kvtier (a leased HIT)
	// but recomputed because a fault cost them: a call unanswered or
	// refused, a load job stalled, reaped or restarted.
	Recomputes      int64 `json:"recomputes"`
	FaultedRequests int64 `json:"faulted_requests"`
	VoidedLoads     int64 `json:"voided_loads"` // load jobs whose reports were not all accepted
	StalledJobs     int64 `json:"stalled_jobs"`
	LateStores      int64 `json:"late_stores"` // store jobs not written: past 3/4 of their deadline
	// KilledRequests are requests an engine dropped because its node was
	// killed under it (peer-kill).
	KilledRequests int64 `json:"killed_requests,omitempty"`

	Nodes []NodeReport `json:"nodes"`

	Violations      int               `json:"violations"`
	ViolationDetail []Violation       `json:"violation_details,omitempty"`
	Invariants      map[string]string `json:"invariants"` // name → ok, violated, skipped: why
	Notes           []string          `json:"notes,omitempty"`

	Reproduce   string  `json:"reproduce"`
	WallSeconds float64 `json:"wall_seconds"`
	Shrunk      *Shrunk `json:"shrunk,omitempty"`

	// Faults is the recorded fault sequence (what --replay takes).
	Faults []supervision.Fault `json:"-"`
}

// CallReport is one manager call's outcomes.
type CallReport struct {
	Calls     int64 `json:"calls"`
	Timeouts  int64 `json:"timeouts,omitempty"`
	Restarted int64 `json:"restarted,omitempty"` // answered ErrRestarted (a bridge restart)
	Errors    int64 `json:"errors,omitempty"`    // other errors (full, unknown job, ...)
}

// BlockReport counts blocks as the engines saw them.
type BlockReport struct {
	Prompt     int64 `json:"prompt"`
	GPUHit     int64 `json:"gpu_hit"`
	Hit        int64 `json:"hit"` // answered HIT (leased)
	Loaded     int64 `json:"loaded"`
	Verified   int64 `json:"verified"`
	Recomputed int64 `json:"recomputed"`
	Stored     int64 `json:"stored"`
	// VoidedCorrupt are wrong bytes read by load jobs that did not
	// complete (their slots may have been given away): not violations.
	VoidedCorrupt int64 `json:"voided_corrupt"`
}

// NodeReport is a node's own counters at the end of the run.
type NodeReport struct {
	Name             string `json:"name"`
	ActorRestarts    uint64 `json:"actor_restarts"`
	JobsReapedLoad   uint64 `json:"jobs_reaped_load"`
	JobsReapedStore  uint64 `json:"jobs_reaped_store"`
	LateReports      uint64 `json:"late_reports"`
	LeasesExpired    uint64 `json:"leases_expired"`
	Evictions        uint64 `json:"evictions"`
	ChecksumFailures uint64 `json:"checksum_failures"`
	LostAtClose      int    `json:"delayed_messages_lost_at_close"`
	// Geometries are the pool's block sizes at the end, each one's use.
	Geometries []messages.GeometryStats `json:"geometries"`
	// Kills are the times the node was killed and restarted (peer-kill);
	// the counters above are its last incarnation's.
	Kills int64 `json:"kills,omitempty"`
	// Peers are the node's sessions at the end: blocks fetched, corrupt
	// ones caught, failed rounds.
	Peers []messages.PeerStats `json:"peers,omitempty"`
	// PeerFlipsLanded are payloads of fetches by this node that had a bit
	// flipped on arrival (peer-corrupt), PeerCorruptCaught the blocks its
	// checksums refused, both over every incarnation. A flip in a fetch
	// that was failing anyway (cut, killed, timed out) is never verified,
	// so caught ≤ landed; no-corrupt-committed and no-wrong-bytes prove
	// none got through.
	PeerFlipsLanded   uint64 `json:"peer_flips_landed,omitempty"`
	PeerCorruptCaught uint64 `json:"peer_corrupt_caught,omitempty"`
	// ClockOffset is how far the node's wall clock was stepped from the
	// real one by clock-jump, all steps summed.
	ClockOffset time.Duration `json:"clock_offset_ns,omitempty"`
	// DiskFullRefused are the writes a full disk refused with ENOSPC
	// (disk-full; the last incarnation's): each must be counted by the fs
	// tier as a full write (its writes_full) and by the tiering actor as a
	// shed cascade (cascade_dropped), or (a segment's seal) by the tier as
	// a failed chore (chore_failures).
	DiskFullRefused uint64 `json:"disk_full_refused,omitempty"`
	// Tiering is the secondary tiers' view: promotions, cascades, each
	// tier's reads, failures, invalid blocks caught, health transitions.
	Tiering messages.TieringStats `json:"tiering"`
}

// fsLayoutOf is the run's fs layout.
func fsLayoutOf(o Options) string { return fs.LayoutOf(o.FSLayout) }

// report builds the run's report.
func report(rs *runState, nodes []*nodeUnderTest, ranFor time.Duration) *Report {
	for _, inv := range []string{invHitLoadable, invWrongBytes, invAnswers} {
		rs.pass(inv)
	}
	s := rs.stats
	r := &Report{Scenario: rs.opts.Scenario, Seed: rs.opts.Seed, Duration: rs.opts.Duration.String(), FSLayout: fsLayoutOf(rs.opts),
		FaultsInjected: rs.ledger.Total(), FaultsByKind: map[string]uint64{}, OperationsByCall: map[string]CallReport{},
		Requests: s.requests.Load(), Recomputes: s.faultRecomputed.Load(), FaultedRequests: s.faultedRequests.Load(),
		VoidedLoads: s.voidedLoads.Load(), StalledJobs: s.stalledJobs.Load(), LateStores: s.lateStores.Load(),
		KilledRequests: s.killedRequests.Load(),
		Blocks: BlockReport{Prompt: s.promptBlocks.Load(), GPUHit: s.gpuHitBlocks.Load(), Hit: s.hitBlocks.Load(),
			Loaded: s.loadedBlocks.Load(), Verified: s.verifiedBlocks.Load(), Recomputed: s.recomputed.Load(),
			Stored: s.storedBlocks.Load(), VoidedCorrupt: s.voidedCorrupt.Load()},
		Invariants: map[string]string{}, Reproduce: rs.opts.Command(), WallSeconds: ranFor.Seconds(),
		Faults: rs.ledger.Faults()}
	for _, k := range rs.opts.Kinds {
		r.Kinds = append(r.Kinds, string(k))
		r.FaultsByKind[string(k)] = 0
	}
	for k, n := range rs.ledger.Counts() {
		r.FaultsByKind[string(k)] = n
	}
	for _, k := range rs.opts.Kinds {
		if r.FaultsByKind[string(k)] == 0 {
			r.KindsNotExercised = append(r.KindsNotExercised, string(k))
		}
	}
	for name, c := range s.calls {
		cr := CallReport{Calls: c.ops.Load(), Timeouts: c.timeouts.Load(), Restarted: c.restarted.Load(), Errors: c.errors.Load()}
		if cr.Calls > 0 {
			r.OperationsByCall[name] = cr
		}
		r.Operations += cr.Calls
	}
	for _, n := range nodes {
		st := n.final
		r.Nodes = append(r.Nodes, NodeReport{Name: n.name, ActorRestarts: st.ActorRestarts,
			JobsReapedLoad: st.JobsReapedLoad, JobsReapedStore: st.JobsReapedStore, LateReports: st.LateReports,
			LeasesExpired: st.LeasesExpired, Evictions: st.Evictions, ChecksumFailures: st.ChecksumFailures,
			LostAtClose: n.inj.Lost(), Tiering: n.tiering, Kills: n.kills.Load(), Peers: n.peers,
			PeerFlipsLanded: n.flipsLanded, PeerCorruptCaught: n.caught, ClockOffset: n.clock.Offset(),
			DiskFullRefused: n.disk.refused.Load(), Geometries: st.Geometries})
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r.Violations = rs.nviolated
	r.ViolationDetail = append(r.ViolationDetail, rs.violations...)
	r.Notes = append(r.Notes, rs.notes...)
	for _, inv := range invariantNames {
		if st, ok := rs.checked[inv]; ok {
			r.Invariants[inv] = st
		} else {
			r.Invariants[inv] = "skipped: not reached"
		}
	}
	return r
}

// Violated reports whether the run broke an invariant.
func (r *Report) Violated() bool { return r.Violations > 0 }

// HasViolation reports whether inv was violated.
func (r *Report) HasViolation(inv string) bool {
	return strings.HasPrefix(r.Invariants[inv], "violated")
}

// WriteJSON writes the report as one JSON object on one line.
func (r *Report) WriteJSON(w io.Writer) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// WriteText writes the report for a human.
func (r *Report) WriteText(w io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	layout := ""
	if r.FSLayout != "" {
		layout = ", fs layout " + r.FSLayout
	}
	p("kvtier chaos: scenario %s%s, seed %d, %s (%.1f s wall)", r.Scenario, layout, r.Seed, r.Duration, r.WallSeconds)
	p("faults       %d injected: %s", r.FaultsInjected, kvList(r.FaultsByKind))
	if len(r.KindsNotExercised) > 0 {
		p("             not exercised: %s", strings.Join(r.KindsNotExercised, ", "))
	}
	calls := map[string]uint64{}
	for name, c := range r.OperationsByCall {
		calls[name] = uint64(c.Calls)
	}
	p("operations   %d manager calls: %s", r.Operations, kvList(calls))
	var to, rst, errs int64
	for _, c := range r.OperationsByCall {
		to, rst, errs = to+c.Timeouts, rst+c.Restarted, errs+c.Errors
	}
	p("             %d timed out, %d answered restarted, %d other errors", to, rst, errs)
	b := r.Blocks
	p("requests     %d; blocks: prompt %d, gpu-hit %d, hit %d, loaded %d (verified %d), recomputed %d, stored %d",
		r.Requests, b.Prompt, b.GPUHit, b.Hit, b.Loaded, b.Verified, b.Recomputed, b.Stored)
	p("recomputes   %d blocks found in kvtier but recomputed after a fault (%d requests); %d loads voided, %d jobs stalled, %d late stores skipped",
		r.Recomputes, r.FaultedRequests, r.VoidedLoads, r.StalledJobs, r.LateStores)
	if r.KilledRequests > 0 {
		p("             %d requests lost with a killed node", r.KilledRequests)
	}
	for _, n := range r.Nodes {
		p("node %-7s %d actor restarts, reaped %d load / %d store jobs, %d late reports, %d leases expired, %d evictions, %d checksum failures",
			n.Name, n.ActorRestarts, n.JobsReapedLoad, n.JobsReapedStore, n.LateReports, n.LeasesExpired, n.Evictions, n.ChecksumFailures)
		ts := n.Tiering
		p("             promoted %s (failed %s), cascaded %s (dropped %s, failed %s), %d lookups timed out",
			kvList(ts.Promoted), kvList(ts.PromotionsFailed), kvList(ts.CascadeWritten), kvList(ts.CascadeDropped),
			kvList(ts.CascadeFailed), ts.LookupsTimedOut)
		for _, t := range ts.Tiers {
			p("             tier %s: %d reads (%d failed, %d invalid caught), %d writes (%d failed, %d full), unhealthy %d times",
				t.Name, t.Reads, t.ReadFailures, t.Invalid, t.Writes, t.WriteFailures, t.WritesFull, t.Unhealthy)
		}
		if n.ClockOffset != 0 || n.DiskFullRefused > 0 {
			p("             wall clock stepped %v in all; %d writes refused by a full disk", n.ClockOffset, n.DiskFullRefused)
		}
		if n.Kills > 0 {
			p("             killed and restarted %d times", n.Kills)
		}
		if len(n.Peers) > 0 {
			p("             peer payloads with a flipped bit: %d landed, %d blocks caught by checksums", n.PeerFlipsLanded, n.PeerCorruptCaught)
		}
		for _, ps := range n.Peers {
			p("             peer %s: ready %v, serving %v, fetched %d, corrupt caught %d, failed rounds %d, served %d",
				ps.Node, ps.Ready, ps.Serving, ps.Fetched, ps.Corrupt, ps.Failures, ps.Served)
		}
	}
	names := make([]string, 0, len(r.Invariants))
	for _, inv := range invariantNames {
		if _, ok := r.Invariants[inv]; ok {
			names = append(names, inv+" "+r.Invariants[inv])
		}
	}
	p("invariants   %s", strings.Join(names, ", "))
	for _, n := range r.Notes {
		p("note         %s", n)
	}
	p("violations   %d", r.Violations)
	for _, v := range r.ViolationDetail {
		p("  - %s", v)
	}
	if r.Shrunk != nil {
		r.Shrunk.writeText(w)
	}
	p("reproduce    %s", r.Reproduce)
}

func kvList(m map[string]uint64) string {
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

package chaos

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/rdma/faulty"
	"github.com/kvtier/kvtier/supervision"
)

// Invariants a run checks (docs/CHAOS.md).
const (
	invLeak        = "no-leak"              // quiet: nothing pinned, leased, write-pending; no engine job or request state
	invTieringIdle = "tiering-quiet"        // quiet: no secondary lookup, promotion, cascade or tier I/O in flight
	invHitLoadable = "hit-loadable"         // PrepareLoad never failed for a live leased HIT
	invWrongBytes  = "no-wrong-bytes"       // every loaded block had its own bytes
	invDeadline    = "calls-answered"       // every call answered within its deadline (bar those whose message a fault dropped)
	invEvents      = "events-consistent"    // what TakeEvents returned replays to the CPU tier's final residency
	invPublished   = "published-events"     // what the node published replays to it too, no batch lost
	invGoroutines  = "goroutines-baseline"  // no goroutine started during the run outlives its close
	invMemory      = "memory-bound"         // the heap comes back within MemBound of its baseline
	invAnswers     = "well-formed-answers"  // answers have the shape the API promises
	invClose       = "clean-close"          // the node closes without error
	invCommitted   = "no-corrupt-committed" // quiet: every resident block still matches the checksum taken at commit
	invPeerRounds  = "peer-rounds-answered" // quiet: every peermsg.Lookup and peermsg.Fetch of the P2P tier answered
	invPeersBack   = "peers-reconnected"    // quiet: every node has a ready session to every other (after kills and cuts)
	invDiskFull    = "disk-full-absorbed"   // quiet: ENOSPC counted as full writes, no torn file left, writes stored again after
)

// invariantNames in report order.
var invariantNames = []string{invLeak, invTieringIdle, invHitLoadable, invWrongBytes, invDeadline, invEvents,
	invPublished, invGoroutines, invMemory, invAnswers, invClose, invCommitted, invDiskFull, invPeerRounds, invPeersBack}

// peerInvariants are checked by scenarios with peers only.
var peerInvariants = []string{invPeerRounds, invPeersBack}

// Violation is one broken invariant.
type Violation struct {
	Invariant string        `json:"invariant"`
	Node      string        `json:"node,omitempty"`
	Detail    string        `json:"detail"`
	At        time.Duration `json:"at_ns"` // since the run started
}

func (v Violation) String() string {
	node := ""
	if v.Node != "" {
		node = " [" + v.Node + "]"
	}
	return fmt.Sprintf("%s%s at %v: %s", v.Invariant, node, v.At.Round(time.Millisecond), v.Detail)
}

// callCounts are one manager call's outcomes.
type callCounts struct {
	ops, timeouts, restarted, errors atomic.Int64
}

// stats are a run's counters, shared by its engines.
type stats struct {
	calls map[string]*callCounts // fixed keys: read without a lock

	requests, faultedRequests                             atomic.Int64
	promptBlocks, gpuHitBlocks, hitBlocks, loadedBlocks   atomic.Int64
	verifiedBlocks, recomputed, faultRecomputed           atomic.Int64
	storedBlocks, voidedLoads, voidedCorrupt, stalledJobs atomic.Int64
	lateStores, killedRequests                            atomic.Int64
}

func newStats() *stats {
	s := &stats{calls: map[string]*callCounts{}}
	for _, c := range []string{callLookup, callPrepareLoad, callTouch, callCompleteLoad, callPrepareStore,
		callCompleteStore, callJobDone, callRequestFinished, callTakeEvents} {
		s.calls[c] = &callCounts{}
	}
	return s
}

func (s *stats) call(name string) *callCounts { return s.calls[name] }

// nodeUnderTest is one node of a scenario with what the run observes of it.
type nodeUnderTest struct {
	name    string
	node    *kvtier.Node
	mgr     kvtier.Manager
	inj     *supervision.Injector
	epoch   atomic.Uint64 // bridge panics injected so far
	take    *residency    // what TakeEvents announced
	pub     *subscriber   // what the node published; nil without events
	final   messages.Stats
	tiering messages.TieringStats
	peers   []messages.PeerStats

	// life is held (read) by the node's engines for each step, and
	// (write) while a peer-kill restarts the node; gen counts the
	// incarnations, kills the kills.
	life  sync.RWMutex
	gen   atomic.Uint64
	kills atomic.Int64
	// down is set when a peer-kill could not bring the node back: it is
	// closed (its pool unmapped), so its engines stop rather than touch it.
	down atomic.Bool
	// The data plane's flipped payloads: landed (faulty's count) and
	// caught by this node's checksums (its sessions' Corrupt), summed over
	// incarnations; dataPlane is the current incarnation's wrapper.
	dataPlane           *faulty.Transport
	flipsLanded, caught uint64
	// clock is the node's clock (clock-jump steps it), kept across its
	// incarnations; disk and fsRoot are the current incarnation's view of
	// the run's disk and its fs tier's root.
	clock  *supervision.JumpClock
	disk   *fullFS
	fsRoot string

	writesMu sync.Mutex
	writes   map[int]slotWrite // slot → the engines' last store into it (a violation's detail)
}

type slotWrite struct {
	key    messages.Key
	job    messages.JobID
	worker int
	at     time.Time
}

// tallyPeers adds the current incarnation's flipped payloads and caught
// checksum failures to the node's totals (at a kill, and at the end).
func (n *nodeUnderTest) tallyPeers(ps []messages.PeerStats) {
	if n.dataPlane != nil {
		n.flipsLanded += n.dataPlane.Flips.Load()
	}
	for _, p := range ps {
		n.caught += p.Corrupt
	}
}

// wrote records an engine worker's store into slot.
func (n *nodeUnderTest) wrote(slot int, k messages.Key, job messages.JobID, worker int) {
	n.writesMu.Lock()
	defer n.writesMu.Unlock()
	if n.writes == nil {
		n.writes = map[int]slotWrite{}
	}
	n.writes[slot] = slotWrite{key: k, job: job, worker: worker, at: time.Now()}
}

// lastWrite describes the engines' last store into slot.
func (n *nodeUnderTest) lastWrite(slot int) string {
	n.writesMu.Lock()
	defer n.writesMu.Unlock()
	w, ok := n.writes[slot]
	if !ok {
		return "never"
	}
	return fmt.Sprintf("block %x by job %d worker %d, %v ago", w.key.Hash, w.job, w.worker, time.Since(w.at).Round(time.Millisecond))
}

// runState is one run.
type runState struct {
	opts    Options
	nodeCfg kvtier.Config // the timeouts the nodes run with
	gate    *gate
	ledger  *supervision.Ledger
	stats   *stats
	work    *workload
	ns      messages.Namespace
	hooks   Hooks
	start   time.Time
	disk    *disk     // the disk every node's fs tier writes to
	stopped time.Time // when the engines stopped

	// stoppers stop the scenario's fault drivers (before the run drains);
	// closers release what the scenario holds beside its nodes (after
	// they closed).
	stoppers, closers []func()

	mu         sync.Mutex
	timeouts   []timedOut  // engine calls that timed out (the first maxTimeoutsKept)
	violations []Violation // the first maxViolationsKept
	nviolated  int
	notes      []string
	checked    map[string]string // invariant → "ok", "violated" or "skipped: why"
}

const (
	maxViolationsKept = 50
	maxTimeoutsKept   = 10000
)

// timedOut is an engine call that timed out.
type timedOut struct {
	call    string
	request string
	sent    time.Duration // since the run started
}

// timedOut records an engine call that timed out.
func (rs *runState) timedOut(call, request string, sent time.Time) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if len(rs.timeouts) < maxTimeoutsKept {
		rs.timeouts = append(rs.timeouts, timedOut{call: call, request: request, sent: sent.Sub(rs.start)})
	}
}

func (rs *runState) violate(n *nodeUnderTest, inv, format string, a ...any) {
	v := Violation{Invariant: inv, Detail: fmt.Sprintf(format, a...), At: time.Since(rs.start)}
	if n != nil {
		v.Node = n.name
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.checked[inv] = "violated"
	rs.nviolated++
	if len(rs.violations) < maxViolationsKept {
		rs.violations = append(rs.violations, v)
	}
}

// note records an observation that is not a violation.
func (rs *runState) note(format string, a ...any) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.notes = append(rs.notes, fmt.Sprintf(format, a...))
}

// pass marks an invariant checked and holding, unless it was violated.
func (rs *runState) pass(inv string) { rs.mark(inv, "ok") }

// skip marks an invariant not checked, with why.
func (rs *runState) skip(inv, why string) { rs.mark(inv, "skipped: "+why) }

func (rs *runState) mark(inv, status string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.checked[inv] != "violated" {
		rs.checked[inv] = status
	}
}

package supervision

import (
	"slices"
	"sync"
	"time"
)

// FaultKind names a kind of injected fault. The message faults below are
// applied by the Injector; the others are named here so that every wrapper
// (filesystem, S3, engine simulator, peer transport) counts into one Ledger
// under one vocabulary.
type FaultKind string

// Message faults, applied by the Injector to an actor's mailbox.
const (
	// FaultDrop: the message never reaches the actor.
	FaultDrop FaultKind = "drop"
	// FaultDelay: the message reaches the actor later, sent back to it by a
	// timer (never a sleep inside Receive).
	FaultDelay FaultKind = "delay"
	// FaultDuplicate: the actor receives the message twice in a row.
	FaultDuplicate FaultKind = "duplicate"
	// FaultReorder: the message is held until the actor has received the
	// next one (or a short hold timer fires), then delivered.
	FaultReorder FaultKind = "reorder"
	// FaultPanic: the actor panics in Receive right after handling the
	// message, so its supervisor restarts it (the message is not lost).
	FaultPanic FaultKind = "panic"
)

// Faults applied outside the actor system, by wrappers that share a Ledger.
const (
	// FaultStall: an engine transfer job whose worker never copies nor
	// reports (a hung GPU or worker); the node must reap it.
	FaultStall FaultKind = "stall"
	// Filesystem faults (tiers/fs.Faulty rules and a corrupting reader).
	FaultFSError   FaultKind = "fs-error"
	FaultFSSlow    FaultKind = "fs-slow"
	FaultFSCorrupt FaultKind = "fs-corrupt"
	// FaultDiskFull: the fs tier's disk is full for a while: every file
	// create, write and sync fails with ENOSPC (a write may land part of
	// its bytes first), then the disk has room again.
	FaultDiskFull FaultKind = "disk-full"
	// S3 faults (tiers/obj.Faulty rules, a corrupting body, an outage of
	// the server process).
	FaultObjError   FaultKind = "obj-error"
	FaultObjSlow    FaultKind = "obj-slow"
	FaultObjCorrupt FaultKind = "obj-corrupt"
	FaultObjOutage  FaultKind = "obj-outage"
	// Peer faults, for the P2P tier: cut, stall or corrupt a peer
	// connection (flip bits in a data-plane payload), kill a peer process,
	// make a connection half-open (one direction silently stops delivering
	// while the connection stays up).
	FaultPeerCut      FaultKind = "peer-cut"
	FaultPeerStall    FaultKind = "peer-stall"
	FaultPeerCorrupt  FaultKind = "peer-corrupt"
	FaultPeerKill     FaultKind = "peer-kill"
	FaultPeerHalfOpen FaultKind = "peer-halfopen"
	// FaultClockJump: a node's wall clock (Clock.Now) steps forward or
	// backward, as NTP steps it; its timers and monotonic time run on
	// (JumpClock).
	FaultClockJump FaultKind = "clock-jump"
)

// Point is a place a fault may be injected: a site (what is happening
// where, e.g. "kvtier/bridge *messages.JobDone" or "fs read") and the
// occurrence of that site, counted from 0 by a Ledger. A plan decides by
// point, so that a replay of the same workload meets the same decisions
// regardless of how goroutines interleave between sites.
type Point struct {
	Site string `json:"site"`
	N    uint64 `json:"n"`
}

// Decision is a plan's answer for one point; the zero value injects
// nothing.
type Decision struct {
	Kind  FaultKind     `json:"kind"`
	Delay time.Duration `json:"delay_ns,omitempty"` // delay, slow and hold faults
	Arg   uint64        `json:"arg,omitempty"`      // kind-specific: which worker stalls, which bit flips
}

// None reports whether d injects nothing.
func (d Decision) None() bool { return d.Kind == "" }

// Fault is one injected fault as a Ledger recorded it.
type Fault struct {
	Seq      uint64        `json:"seq"` // order of injection, from 1
	Point    Point         `json:"point"`
	Decision Decision      `json:"decision"`
	At       time.Duration `json:"at_ns"` // since the ledger started
}

// Ledger numbers the occurrences of each fault site and records every fault
// injected, in order, with a count per kind. One ledger is shared by every
// injector and wrapper of a scenario so that its report and its replay see
// one sequence. Safe for concurrent use.
type Ledger struct {
	mu     sync.Mutex
	start  time.Time
	now    func() time.Time
	sites  map[string]uint64
	faults []Fault
	counts map[FaultKind]uint64
	onAdd  []func(Fault)
}

// NewLedger starts an empty ledger; now is its time source (nil: the wall
// clock), used only to timestamp faults.
func NewLedger(now func() time.Time) *Ledger {
	if now == nil {
		now = time.Now
	}
	return &Ledger{start: now(), now: now, sites: map[string]uint64{}, counts: map[FaultKind]uint64{}}
}

// Next returns the next occurrence of site.
func (l *Ledger) Next(site string) Point {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.sites[site]
	l.sites[site] = n + 1
	return Point{Site: site, N: n}
}

// Record counts and records a fault injected at p, and returns it. Hooks
// added with OnRecord run after it is recorded, in the caller's goroutine.
func (l *Ledger) Record(p Point, d Decision) Fault {
	l.mu.Lock()
	f := Fault{Seq: uint64(len(l.faults)) + 1, Point: p, Decision: d, At: l.now().Sub(l.start)}
	l.faults = append(l.faults, f)
	l.counts[d.Kind]++
	hooks := l.onAdd
	l.mu.Unlock()
	for _, h := range hooks {
		h(f)
	}
	return f
}

// OnRecord adds a hook run for every fault recorded from now on. It must
// be quick and must not call back into the ledger's Record.
func (l *Ledger) OnRecord(h func(Fault)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.onAdd = append(l.onAdd, h)
}

// Faults returns the recorded faults in injection order.
func (l *Ledger) Faults() []Fault {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.faults)
}

// Counts returns the number of faults injected per kind.
func (l *Ledger) Counts() map[FaultKind]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[FaultKind]uint64, len(l.counts))
	for k, n := range l.counts {
		out[k] = n
	}
	return out
}

// Total is the number of faults injected.
func (l *Ledger) Total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.faults)
}

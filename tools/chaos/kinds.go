package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/kvtier/kvtier/supervision"
)

// Kind is a fault kind (the vocabulary of supervision.FaultKind).
type Kind = supervision.FaultKind

// KindInfo describes a fault kind for the CLI and the report.
type KindInfo struct {
	Kind  Kind
	Layer string  // "message", "engine", "fs", "obj", "clock", "peer"
	Rate  float64 // default probability per eligible point (obj-outage: per second of run; disk-full: per 250 ms; clock-jump: per node per 250 ms)
	What  string
}

// Kinds is every fault kind the harness knows, in report order. A scenario
// supports a subset (Scenario.Kinds); the peer kinds need a scenario with
// peers.
var Kinds = []KindInfo{
	{supervision.FaultDrop, "message", 0.0008, "a message never reaches its actor (only where the sender survives its loss: catalog.go)"},
	{supervision.FaultDelay, "message", 0.01, "a message comes back through the mailbox after up to MaxDelay (a timer, never a sleep)"},
	{supervision.FaultDuplicate, "message", 0.004, "a message is handled twice in a row"},
	{supervision.FaultReorder, "message", 0.004, "a message is held until the actor's next message (or a 10 ms hold timer)"},
	{supervision.FaultPanic, "message", 0.0003, "an actor panics right after handling a message; its supervisor restarts it"},
	{supervision.FaultStall, "engine", 0.01, "one worker of an engine job never copies nor reports (a hung GPU worker)"},
	{supervision.FaultFSError, "fs", 0.005, "a filesystem call fails (EIO, or ENOSPC on writes: a full disk)"},
	{supervision.FaultFSSlow, "fs", 0.005, "a filesystem call takes up to MaxDelay longer"},
	{supervision.FaultFSCorrupt, "fs", 0.02, "a block file read returns one flipped bit"},
	{supervision.FaultDiskFull, "fs", 1.0 / 120, "the fs tiers' disk is full for 1-3 s: creates, writes (half landed: a torn file) and syncs fail with ENOSPC (per 250 ms)"},
	{supervision.FaultObjError, "obj", 0.01, "an S3 call fails (503 Slow Down or a reset connection)"},
	{supervision.FaultObjSlow, "obj", 0.01, "an S3 call takes up to MaxDelay longer"},
	{supervision.FaultObjCorrupt, "obj", 0.05, "an S3 GET body has one flipped bit"},
	{supervision.FaultObjOutage, "obj", 1.0 / 30, "the S3 server process is killed for 1-3 s, then restarted"},
	{supervision.FaultClockJump, "clock", 1.0 / 40, "a node's wall clock (Clock.Now) steps by ±1-30 s, as NTP steps it; its timers run on (per node per 250 ms)"},
	{supervision.FaultPeerCut, "peer", 0.05, "a peer control link or data-plane connection is cut (per 100 ms; scenario peers)"},
	{supervision.FaultPeerStall, "peer", 0.02, "a producer's data-plane write completes only at the consumer's fetch deadline (scenario peers)"},
	{supervision.FaultPeerCorrupt, "peer", 0.02, "a landed data-plane payload has a flipped bit (scenario peers)"},
	{supervision.FaultPeerKill, "peer", 1.0 / 20, "a node is cut off, closed without a Bye and restarted fresh with its id (per second; scenario peers)"},
	{supervision.FaultPeerHalfOpen, "peer", 0.02, "a peer connection silently stops delivering in one direction and stays open (per 100 ms; scenario peers)"},
}

// info returns k's description.
func info(k Kind) (KindInfo, bool) {
	for _, i := range Kinds {
		if i.Kind == k {
			return i, true
		}
	}
	return KindInfo{}, false
}

// ParseKinds parses a comma-separated list of kinds for scenario s: "all"
// (every kind s supports), "none", kind names, or layer names ("message",
// "fs", ...); a leading "-" removes (e.g. "all,-panic").
func ParseKinds(list string, s Scenario) ([]Kind, error) {
	supported := s.Kinds()
	set := map[Kind]bool{}
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" || item == "none" {
			continue
		}
		remove := strings.HasPrefix(item, "-")
		item = strings.TrimPrefix(item, "-")
		var match []Kind
		switch {
		case item == "all":
			match = supported
		default:
			for _, i := range Kinds {
				if string(i.Kind) == item || i.Layer == item {
					match = append(match, i.Kind)
				}
			}
		}
		if len(match) == 0 {
			return nil, fmt.Errorf("unknown fault kind %q (kinds: %s)", item, kindNames(nil))
		}
		for _, k := range match {
			if !slices.Contains(supported, k) {
				if item == string(k) && !remove {
					return nil, fmt.Errorf("fault kind %q is not supported by scenario %q (it supports: %s)", k, s.Name(), kindNames(supported))
				}
				continue
			}
			set[k] = !remove
		}
	}
	var out []Kind
	for _, i := range Kinds {
		if set[i.Kind] {
			out = append(out, i.Kind)
		}
	}
	return out, nil
}

// kindNames lists kinds (all known ones when ks is nil).
func kindNames(ks []Kind) string {
	if ks == nil {
		for _, i := range Kinds {
			ks = append(ks, i.Kind)
		}
	}
	names := make([]string, len(ks))
	for i, k := range ks {
		names[i] = string(k)
	}
	return strings.Join(names, ",")
}

// FormatKinds renders kinds for a reproduce command: sorted in report
// order, comma-separated, "none" when empty.
func FormatKinds(ks []Kind) string {
	if len(ks) == 0 {
		return "none"
	}
	order := map[Kind]int{}
	for i, k := range Kinds {
		order[k.Kind] = i
	}
	sorted := slices.Clone(ks)
	sort.Slice(sorted, func(a, b int) bool { return order[sorted[a]] < order[sorted[b]] })
	return kindNames(sorted)
}

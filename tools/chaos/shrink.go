package chaos

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/kvtier/kvtier/supervision"
)

// Shrunk is the outcome of shrinking a violation: delta debugging (ddmin)
// over the run's recorded faults, each candidate replayed with the same
// seed through a Script plan (the same points get the same faults, nothing
// else is injected), keeping a subset when it still breaks the same
// invariant. Runs are not perfectly deterministic (goroutines interleave),
// so a subset that fails to reproduce is only not kept; the result is the
// smallest reproducing sequence found within the time bound.
type Shrunk struct {
	Invariant  string              `json:"invariant"`
	From       int                 `json:"from_faults"`
	Faults     []supervision.Fault `json:"faults"`     // the smallest reproducing sequence (empty unless Reproduced)
	Reproduced bool                `json:"reproduced"` // the recorded sequence, replayed, broke it again
	Minimal    bool                `json:"minimal"`    // ddmin finished: no single fault can be removed
	Runs       int                 `json:"runs"`
	Seconds    float64             `json:"seconds"`
}

// replayTail is how long a replay runs past its last fault.
const replayTail = 2 * time.Second

// reproduceAttempts is how often the full recorded sequence is replayed
// before the violation is declared not reproducible by replay (a race
// needs luck as well as its faults).
const reproduceAttempts = 3

func shrink(ctx context.Context, opts Options, rep *Report) *Shrunk {
	start := time.Now()
	deadline := start.Add(opts.Shrink)
	first := rep.ViolationDetail[0]
	s := &Shrunk{Invariant: first.Invariant, From: len(rep.Faults)}
	scenario, _ := ScenarioByName(opts.Scenario)
	// NB: faults injected after the violation was seen cannot have caused
	// it (checks at the end of a run are seen after every fault).
	var faults []supervision.Fault
	for _, f := range rep.Faults {
		if f.At <= first.At {
			faults = append(faults, f)
		}
	}
	timeUp := func() bool { return time.Now().After(deadline) || ctx.Err() != nil }
	test := func(faults []supervision.Fault) bool {
		if timeUp() {
			return false
		}
		o := opts
		o.Shrink, o.Plan, o.Duration = 0, supervision.NewScript(faults), replayDuration(faults, opts.Duration)
		o.Hooks.UnsafeRules = nil // what they injected is in the script
		s.Runs++
		r, err := runOnce(ctx, o, scenario)
		return err == nil && r.HasViolation(s.Invariant)
	}
	defer func() { s.Seconds = time.Since(start).Seconds() }()
	for range reproduceAttempts {
		if s.Reproduced = test(faults); s.Reproduced || timeUp() {
			break
		}
	}
	if !s.Reproduced {
		return s // Faults stays empty: nothing shrunk
	}
	if test(nil) {
		s.Faults, s.Minimal = []supervision.Fault{}, true // no fault needed: a plain bug
		return s
	}
	s.Faults, s.Minimal = ddmin(faults, test, timeUp)
	return s
}

// ddmin reduces faults to a subset for which test still holds, removing
// chunks of halving size (Zeller's delta debugging); minimal reports it
// finished (no single fault can be removed) before timeUp.
func ddmin(faults []supervision.Fault, test func([]supervision.Fault) bool, timeUp func() bool) (_ []supervision.Fault, minimal bool) {
	cur, n := faults, 2
	for len(cur) >= 2 {
		chunks := split(cur, n)
		found := false
		for _, c := range chunks {
			if test(c) {
				cur, n, found = c, 2, true
				break
			}
		}
		for i := 0; !found && n > 2 && i < len(chunks); i++ {
			if comp := complement(chunks, i); test(comp) {
				cur, n, found = comp, max(n-1, 2), true
			}
		}
		if timeUp() {
			return cur, false
		}
		if !found {
			if n >= len(cur) {
				return cur, true
			}
			n = min(2*n, len(cur))
		}
	}
	return cur, true
}

func split(fs []supervision.Fault, n int) [][]supervision.Fault {
	out := make([][]supervision.Fault, 0, n)
	for i := range n {
		lo, hi := i*len(fs)/n, (i+1)*len(fs)/n
		if hi > lo {
			out = append(out, fs[lo:hi])
		}
	}
	return out
}

func complement(chunks [][]supervision.Fault, skip int) []supervision.Fault {
	var out []supervision.Fault
	for i, c := range chunks {
		if i != skip {
			out = append(out, c...)
		}
	}
	return out
}

// replayDuration runs a replay until shortly after its last fault.
func replayDuration(faults []supervision.Fault, full time.Duration) time.Duration {
	var last time.Duration
	for _, f := range faults {
		last = max(last, f.At)
	}
	return min(max(last+replayTail, replayTail), full)
}

func (s *Shrunk) writeText(w io.Writer) {
	state := "smallest found within the time bound"
	switch {
	case !s.Reproduced:
		state = fmt.Sprintf("replaying the recorded faults %d times did not reproduce it (a race: soak with more seeds)", reproduceAttempts)
	case len(s.Faults) == 0:
		state = "it reproduces with no fault at all"
	case s.Minimal:
		state = "1-minimal"
	}
	if !s.Reproduced {
		fmt.Fprintf(w, "shrunk       %s: %s (%d replays, %.1f s)\n", s.Invariant, state, s.Runs, s.Seconds)
		return
	}
	fmt.Fprintf(w, "shrunk       %s: %d of %d faults (%s; %d replays, %.1f s)\n",
		s.Invariant, len(s.Faults), s.From, state, s.Runs, s.Seconds)
	for _, f := range s.Faults[:min(len(s.Faults), 20)] {
		fmt.Fprintf(w, "  - #%d %s at %q occurrence %d (%v into the run)\n",
			f.Seq, f.Decision.Kind, f.Point.Site, f.Point.N, f.At.Round(time.Millisecond))
	}
}

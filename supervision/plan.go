package supervision

import (
	"hash/fnv"
	"slices"
	"time"
)

// Plan decides, for a point, whether to inject a fault and which, among the
// kinds allowed there (the caller's catalogue of what is safe to perturb at
// that site). A nil Plan injects nothing. Implementations must be safe for
// concurrent use and should be a pure function of their inputs, so a run
// can be replayed.
type Plan interface {
	Decide(p Point, allowed []FaultKind) Decision
}

// Seeded is the random plan: each kind allowed at a point fires with its
// rate, decided by a hash of (seed, site, occurrence, kind) — not by a
// shared random stream — so the decision for a point does not depend on
// the order in which concurrent sites were met.
type Seeded struct {
	Seed  uint64
	Rates map[FaultKind]float64 // probability per eligible point; absent or 0: never
	// MinDelay and MaxDelay bound the Delay of delay, slow and reorder
	// decisions (uniform between them).
	MinDelay, MaxDelay time.Duration
}

// Decide implements Plan: the first allowed kind (in the caller's order)
// whose draw falls under its rate wins.
func (s *Seeded) Decide(p Point, allowed []FaultKind) Decision {
	if len(allowed) == 0 {
		return Decision{}
	}
	site := hashString(p.Site)
	for _, k := range allowed {
		rate := s.Rates[k]
		if rate <= 0 {
			continue
		}
		h := mix(s.Seed, site, p.N, hashString(string(k)))
		if unit(h) >= rate {
			continue
		}
		d := Decision{Kind: k, Arg: mix(h, 1, 2, 3)}
		if span := s.MaxDelay - s.MinDelay; span > 0 {
			d.Delay = s.MinDelay + time.Duration(mix(h, 4, 5, 6)%uint64(span))
		} else {
			d.Delay = s.MinDelay
		}
		return d
	}
	return Decision{}
}

// Script is the replay plan: exactly the faults listed, at their points.
// The shrinker runs subsets of a run's recorded faults through it.
type Script map[Point]Decision

// NewScript makes a script of recorded faults.
func NewScript(faults []Fault) Script {
	s := make(Script, len(faults))
	for _, f := range faults {
		s[f.Point] = f.Decision
	}
	return s
}

// Decide implements Plan: the scripted decision, if its kind is allowed at
// the point.
func (s Script) Decide(p Point, allowed []FaultKind) Decision {
	d, ok := s[p]
	if !ok || !slices.Contains(allowed, d.Kind) {
		return Decision{}
	}
	return d
}

func hashString(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// mix folds four words into one well-mixed word (splitmix64 finaliser).
func mix(a, b, c, d uint64) uint64 {
	x := a
	for _, y := range [...]uint64{b, c, d} {
		x ^= y + 0x9e3779b97f4a7c15 + (x << 6) + (x >> 2)
		x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
		x = (x ^ (x >> 27)) * 0x94d049bb133111eb
		x ^= x >> 31
	}
	return x
}

// unit maps h to [0, 1).
func unit(h uint64) float64 { return float64(h>>11) / (1 << 53) }

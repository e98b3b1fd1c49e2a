package chaos

import (
	"slices"
	"strings"
	"sync/atomic"

	"github.com/kvtier/kvtier/supervision"
)

// gate is where every fault of a run is decided: it is armed only while
// the scenario runs (not while nodes open or the run drains), keeps to the
// kinds the run enables, asks the plan, and records into the run's ledger.
// Safe for concurrent use.
type gate struct {
	armed   atomic.Bool
	plan    supervision.Plan
	ledger  *supervision.Ledger
	enabled map[Kind]bool
	spared  map[string]bool // actors never made to panic
}

func newGate(plan supervision.Plan, ledger *supervision.Ledger, kinds []Kind, spare []string) *gate {
	g := &gate{plan: plan, ledger: ledger, enabled: map[Kind]bool{}, spared: map[string]bool{}}
	for _, k := range kinds {
		g.enabled[k] = true
	}
	for _, a := range spare {
		g.spared[a] = true
	}
	return g
}

// filter keeps the enabled kinds of allowed.
func (g *gate) filter(allowed []Kind) []Kind {
	out := make([]Kind, 0, len(allowed))
	for _, k := range allowed {
		if g.enabled[k] {
			out = append(out, k)
		}
	}
	return out
}

// decide numbers an occurrence of site and returns the fault to inject
// there, recorded (the zero Decision when none). Outside the armed window
// it numbers nothing and injects nothing.
func (g *gate) decide(site string, allowed ...Kind) supervision.Decision {
	if !g.armed.Load() || g.plan == nil {
		return supervision.Decision{}
	}
	if _, replay := g.plan.(supervision.Script); !replay {
		allowed = g.filter(allowed)
	}
	if len(allowed) == 0 {
		return supervision.Decision{}
	}
	p := g.ledger.Next(site)
	d := g.plan.Decide(p, allowed)
	if d.None() || !slices.Contains(allowed, d.Kind) {
		return supervision.Decision{}
	}
	g.ledger.Record(p, d)
	return d
}

// messageRule is the catalogue as an injector rule: the injector numbers
// and records; the rule only decides, within what the catalogue allows.
func (g *gate) messageRule() supervision.MessageRule {
	return func(d supervision.Delivery) supervision.Decision {
		if !g.armed.Load() || g.plan == nil {
			return supervision.Decision{}
		}
		if script, ok := g.plan.(supervision.Script); ok {
			// NB: a replay injects exactly what was recorded, even faults an
			// unsafe test rule made outside the catalogue.
			return script[d.Point]
		}
		allowed := g.filter(Allowed(d.Target, d.Type))
		if g.spared[actorName(d.Target)] || g.spared[d.Target[strings.LastIndexByte(d.Target, '/')+1:]] {
			allowed = slices.DeleteFunc(allowed, func(k Kind) bool { return k == supervision.FaultPanic })
		}
		if len(allowed) == 0 {
			return supervision.Decision{}
		}
		return g.plan.Decide(d.Point, allowed)
	}
}

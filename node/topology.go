package node

// The node's topology, as a table: every actor the guardian spawns, when it
// is there, what builds it, and whom it sends to. Everything else derives
// from the table: which actors a Config gets (PlanTopology), their spawn
// order (each after the actors it sends to) and stop order (its reverse),
// their PIDs (kvtier/<name>, known before anything spawns, so actors can be
// wired to each other in one pass), and the PIDs each builder may name — a
// builder asks for a target through its wiring, which refuses any name the
// table does not declare, so the printed graph is the graph the actors get.
// kvtierd --print-topology prints it; testdata/topology/*.golden pins it.

import (
	"fmt"
	"slices"
	"strings"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/tiers/cpu"
)

// guardianName is the root of every actor name of the node.
const guardianName = "kvtier"

// tierPattern names, in a table entry, one actor per configured secondary
// tier ("tier-<name>").
const tierPattern = "tier-*"

// Component is one actor of a node, as planned from its Config.
type Component struct {
	// Name is the guardian's child name; the actor's PID is kvtier/<Name>.
	Name string
	// Role says what the actor does.
	Role string
	// Sends are the actors it sends to: each spawns before it and stops
	// after it, so nothing it sends is lost to an actor not yet started or
	// already stopped.
	Sends []string
	// Notifies are actors it sends to that spawn after it (a cycle's back
	// edge): notifications an actor starting or stopping may miss, because
	// the receiver asks again for what it needs.
	Notifies []string
}

// Topology is a node's actors in spawn order; they stop in reverse.
type Topology []Component

// component is one row of the table.
type component struct {
	name     string // tierPattern: one actor per secondary tier
	role     string
	sends    []string // tierPattern stands for every secondary tier; absent targets are left out
	notifies []string
	enabled  func(config.Config) bool
	build    func(n *Node, w wiring) *actor.Props
}

// table is the node's topology. Its order breaks ties in spawn order.
var table = []component{
	{name: "events", role: "KV-event hub: batches the tiers' events, publishes and replays them",
		notifies: []string{"cpu"}, enabled: func(c config.Config) bool { return c.Events.Enabled() }, build: (*Node).hubProps},
	{name: "cpu", role: "CPU tier: slots, leases, pins, eviction",
		sends: []string{"events"}, build: (*Node).cpuProps},
	{name: tierPattern, role: "secondary tier (%s): its blocks and I/O workers",
		sends: []string{"events"}, enabled: func(c config.Config) bool { return len(c.SecondaryTiers) > 0 }, build: (*Node).tierProps},
	{name: "p2p", role: "P2P tier: the peers' blocks as one secondary tier, asked through the sessions that register with it",
		notifies: []string{"tiering"}, enabled: func(c config.Config) bool { return c.Peers.Enabled() }, build: (*Node).p2pProps},
	{name: "tiering", role: "secondary lookups, promotions into the CPU tier, cascades out of it",
		sends: []string{"cpu", tierPattern, "p2p"}, enabled: hasSecondary, build: (*Node).tieringProps},
	{name: "bridge", role: "manager API: request state, leases, transfer jobs",
		sends: []string{"cpu", "tiering"}, build: (*Node).bridgeProps},
	{name: "endpoint", role: "engine endpoint: out-of-process engines' calls",
		sends: []string{"bridge", "events"}, enabled: func(c config.Config) bool { return c.EngineListen != "" }, build: (*Node).endpointProps},
	{name: "peers", role: "peer control plane; one session actor per peer, its children",
		sends: []string{"cpu", "p2p"}, enabled: func(c config.Config) bool { return c.Peers.Enabled() }, build: (*Node).peersProps},
}

// hasSecondary: the tiering actor runs when there is a tier to look in.
func hasSecondary(c config.Config) bool { return len(c.SecondaryTiers) > 0 || c.Peers.Enabled() }

// planned is a Component with its builder.
type planned struct {
	Component
	instance string // tier-*: the tier's name
	build    func(n *Node, w wiring) *actor.Props
}

// PlanTopology is the actors a node opened with cfg runs, in spawn order.
// It does no I/O; cfg is taken as Open takes it (defaults applied).
func PlanTopology(cfg config.Config) (Topology, error) {
	p, err := plan(cfg.WithDefaults(), table)
	if err != nil {
		return nil, err
	}
	t := make(Topology, len(p))
	for i, c := range p {
		t[i] = c.Component
	}
	return t, nil
}

// plan expands and orders the table for cfg.
func plan(cfg config.Config, rows []component) ([]planned, error) {
	tierNames := config.TierNames(cfg.SecondaryTiers)
	var out []planned
	present := map[string]bool{}
	for _, r := range rows {
		if r.enabled != nil && !r.enabled(cfg) {
			continue
		}
		if r.name != tierPattern {
			out = append(out, planned{Component: Component{Name: r.name, Role: r.role}, build: r.build})
			present[r.name] = true
			continue
		}
		for i, name := range tierNames {
			role := fmt.Sprintf(r.role, cfg.SecondaryTiers[i].Kind)
			out = append(out, planned{Component: Component{Name: "tier-" + name, Role: role}, instance: name, build: r.build})
			present["tier-"+name] = true
		}
	}
	expand := func(names []string) []string {
		var got []string
		for _, name := range names {
			if name == tierPattern {
				for _, t := range tierNames {
					got = append(got, "tier-"+t)
				}
			} else if present[name] {
				got = append(got, name)
			}
		}
		return got
	}
	for i := range out {
		row := rowOf(rows, out[i])
		out[i].Sends, out[i].Notifies = expand(row.sends), expand(row.notifies)
	}
	return spawnOrder(out)
}

// rowOf is the table row p was expanded from.
func rowOf(rows []component, p planned) component {
	for _, r := range rows {
		if r.name == p.Name || (r.name == tierPattern && p.instance != "") {
			return r
		}
	}
	panic("kvtier: planned actor without a row: " + p.Name)
}

// spawnOrder sorts the actors so that each spawns after every actor it
// Sends to (ties in table order); a cycle of Sends is an error: one of its
// edges must be a notification.
func spawnOrder(ps []planned) ([]planned, error) {
	var out []planned
	done := map[string]bool{}
	for len(out) < len(ps) {
		progressed := false
		for _, p := range ps {
			if done[p.Name] || !allDone(p.Sends, done) {
				continue
			}
			out, done[p.Name], progressed = append(out, p), true, true
			break
		}
		if !progressed {
			var stuck []string
			for _, p := range ps {
				if !done[p.Name] {
					stuck = append(stuck, p.Name)
				}
			}
			return nil, fmt.Errorf("kvtier: topology: a cycle of sends among %s", strings.Join(stuck, ", "))
		}
	}
	return out, nil
}

func allDone(names []string, done map[string]bool) bool {
	for _, n := range names {
		if !done[n] {
			return false
		}
	}
	return true
}

// String prints the topology, one actor per line, in spawn order.
func (t Topology) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-2s %-12s %-28s %s\n", "#", "actor", "sends to", "role")
	for i, c := range t {
		to := strings.Join(c.Sends, ", ")
		for _, n := range c.Notifies {
			to = strings.TrimPrefix(to+", "+n+" (notifies)", ", ")
		}
		if to == "" {
			to = "-"
		}
		fmt.Fprintf(&b, "%-2d %-12s %-28s %s\n", i+1, c.Name, to, c.Role)
	}
	b.WriteString("stop order: the reverse\n")
	return b.String()
}

// wiring hands one actor's builder the PIDs it may send to.
type wiring struct {
	n        *Node
	self     planned
	declared map[string]bool // every name in the planned topology
	errs     *[]error
}

// fail records that the actor cannot be built as planned (what the plan
// expects did not open).
func (w wiring) fail(err error) {
	*w.errs = append(*w.errs, fmt.Errorf("kvtier: topology: %s: %w", w.self.Name, err))
}

// to is the PID of target, which self must declare (Sends or Notifies); nil
// when the topology has no such actor (an optional tier that is off).
func (w wiring) to(target string) *actor.PID {
	if !slices.Contains(w.self.Sends, target) && !slices.Contains(w.self.Notifies, target) {
		if w.declared[target] {
			*w.errs = append(*w.errs, fmt.Errorf("kvtier: topology: %s is wired to %s, which its row does not declare", w.self.Name, target))
		}
		return nil
	}
	return w.n.pidOf(target)
}

// pidOf is the PID the guardian gives its child of that name.
func (n *Node) pidOf(child string) *actor.PID {
	return actor.NewPID(n.system.Address(), guardianName+"/"+child)
}

// pidIf is the PID of child when the node runs it, else nil.
func (n *Node) pidIf(child string) *actor.PID {
	for _, p := range n.plan {
		if p.Name == child {
			return n.pidOf(child)
		}
	}
	return nil
}

// children builds the guardian's children from the node's plan, in spawn
// order; an actor wired to a target its row does not declare is an error.
func (n *Node) children() ([]actors.Child, error) {
	declared := map[string]bool{}
	for _, p := range n.plan {
		declared[p.Name] = true
	}
	var errs []error
	out := make([]actors.Child, 0, len(n.plan))
	for _, p := range n.plan {
		props := p.build(n, wiring{n: n, self: p, declared: declared, errs: &errs})
		out = append(out, actors.Child{Name: p.Name, Props: props})
	}
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return out, nil
}

// checkSpawned verifies every actor was spawned where it is wired.
func (n *Node) checkSpawned(pids map[string]*actor.PID) error {
	for _, p := range n.plan {
		if !pids[p.Name].Equal(n.pidOf(p.Name)) {
			return fmt.Errorf("kvtier: %s spawned as %s, wired as %s", p.Name, pids[p.Name], n.pidOf(p.Name))
		}
	}
	return nil
}

// cpuProps builds the CPU tier.
func (n *Node) cpuProps(w wiring) *actor.Props {
	opts := []cpu.Option{cpu.WithClock(n.cfg.Clock), cpu.WithOffload(&n.offload)}
	if hub := w.to("events"); hub != nil {
		opts = append(opts, cpu.WithEventSink(hub))
	}
	return cpu.Props(n.state, n.pool, n.cfg.Clock.Now, n.cfg.Logger.With().Str("actor", "cpu").Logger(), opts...)
}

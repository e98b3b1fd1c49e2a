package node

import (
	"flag"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/actors"
	"github.com/kvtier/kvtier/config"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/topology/*.golden")

// topologyConfigs are the shapes a node takes, by the parts it turns on.
func topologyConfig(events, fsTier, objTier, peers, endpoint bool) config.Config {
	var c config.Config
	if events {
		c.Events = config.EventsConfig{Endpoint: "tcp://127.0.0.1:5558", Replay: "tcp://127.0.0.1:5559"}
	}
	if fsTier {
		c.SecondaryTiers = append(c.SecondaryTiers, config.TierConfig{Kind: "fs", Root: "/var/lib/kvtier"})
	}
	if objTier {
		c.SecondaryTiers = append(c.SecondaryTiers, config.TierConfig{Kind: "obj", Name: "s3"})
	}
	if peers {
		c.Peers = config.PeersConfig{NodeID: "a", Listen: "tcp://127.0.0.1:7600"}
	}
	if endpoint {
		c.EngineListen = "unix:///run/kvtier/engine.sock"
	}
	return c
}

// TestTopologyGolden pins who talks to whom, and the spawn order, for an
// embedded node and for a node with every part on (kvtierd
// --print-topology prints the same table).
func TestTopologyGolden(t *testing.T) {
	for name, cfg := range map[string]config.Config{
		"embedded": topologyConfig(false, false, false, false, false),
		"full":     topologyConfig(true, true, true, true, true),
	} {
		t.Run(name, func(t *testing.T) {
			top, err := PlanTopology(cfg)
			require.NoError(t, err)
			path := filepath.Join("testdata", "topology", name+".golden")
			if *updateGolden {
				require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
				require.NoError(t, os.WriteFile(path, []byte(top.String()), 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Equal(t, string(want), top.String(), "the topology changed: review it, then go test -run TestTopologyGolden -update")
		})
	}
}

// TestTopologyOrderHoldsForEveryShape: in every combination of parts, each
// actor spawns after every actor it sends to, its notifications go only to
// actors spawned after it, and no actor names one that is not there.
func TestTopologyOrderHoldsForEveryShape(t *testing.T) {
	for bits := range 1 << 5 {
		on := func(i int) bool { return bits&(1<<i) != 0 }
		cfg := topologyConfig(on(0), on(1), on(2), on(3), on(4))
		top, err := PlanTopology(cfg)
		require.NoError(t, err, "shape %05b", bits)
		pos := map[string]int{}
		for i, c := range top {
			pos[c.Name] = i
		}
		require.Len(t, pos, len(top), "actor names are unique")
		require.Equal(t, 0, pos["cpu"]-boolInt(on(0)), "the CPU tier spawns first, after the hub when events are on")
		for i, c := range top {
			for _, to := range c.Sends {
				j, ok := pos[to]
				require.True(t, ok, "%s sends to %s, absent in shape %05b", c.Name, to, bits)
				require.Less(t, j, i, "%s spawns after %s, which it sends to", c.Name, to)
			}
			for _, to := range c.Notifies {
				j, ok := pos[to]
				require.True(t, ok, "%s notifies %s, absent in shape %05b", c.Name, to, bits)
				require.Greater(t, j, i, "a notification goes to an actor spawned later")
			}
		}
		_, tiering := pos["tiering"]
		require.Equal(t, on(1) || on(2) || on(3), tiering, "the tiering actor runs when a secondary tier or peers are on")
		_, endpoint := pos["endpoint"]
		require.Equal(t, on(4), endpoint)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestTopologySpawnOrderIsDerived: the table's order only breaks ties; a
// shuffled table plans the same order, and a cycle of sends is refused.
func TestTopologySpawnOrderIsDerived(t *testing.T) {
	cfg := topologyConfig(true, true, true, true, true)
	want, err := plan(cfg, table)
	require.NoError(t, err)
	rng := rand.New(rand.NewSource(1))
	for range 20 {
		rows := slices.Clone(table)
		rng.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
		got, err := plan(cfg, rows)
		require.NoError(t, err)
		for i, p := range got {
			for _, to := range p.Sends {
				require.True(t, slices.ContainsFunc(got[:i], func(q planned) bool { return q.Name == to }),
					"%s before %s, which it sends to", to, p.Name)
			}
		}
		require.ElementsMatch(t, names(want), names(got))
	}

	cyclic := slices.Clone(table)
	for i, r := range cyclic {
		if r.name == "p2p" {
			cyclic[i].sends, cyclic[i].notifies = []string{"tiering"}, nil // tiering sends to p2p
		}
	}
	_, err = plan(cfg, cyclic)
	require.ErrorContains(t, err, "cycle")
	require.ErrorContains(t, err, "p2p")
}

func names(ps []planned) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

// TestTopologyWiringRefusesUndeclaredTargets: a builder that asks for a PID
// its row does not declare fails the start, so the printed graph cannot
// drift from the one the actors get.
func TestTopologyWiringRefusesUndeclaredTargets(t *testing.T) {
	n := &Node{system: actors.NewSystem(zerolog.Nop())}
	defer n.system.Shutdown()
	build := func(target string) func(*Node, wiring) *actor.Props {
		return func(n *Node, w wiring) *actor.Props {
			require.Nil(t, w.to("nowhere"), "a target absent from the topology is nil")
			if target != "" {
				_ = w.to(target)
			}
			return actor.PropsFromFunc(func(actor.Context) {})
		}
	}
	n.plan = []planned{
		{Component: Component{Name: "cpu"}, build: build("")},
		{Component: Component{Name: "bridge", Sends: []string{"cpu"}}, build: build("cpu")},
	}
	_, err := n.children()
	require.NoError(t, err, "declared targets wire")
	n.plan[0].build = build("bridge")
	_, err = n.children()
	require.ErrorContains(t, err, "cpu is wired to bridge, which its row does not declare")
}

// TestTopologyOfARunningNode: a node with events, an fs tier, peers and an
// engine endpoint runs exactly its planned actors, at their wired PIDs, and
// stops them in the reverse of their spawn order.
func TestTopologyOfARunningNode(t *testing.T) {
	dir := t.TempDir()
	withEndpoint := func(c *config.Config) {
		c.PoolPath, c.EngineListen = filepath.Join(dir, "pool"), "unix://"+filepath.Join(dir, "engine.sock")
	}
	h := open(t, 16, withEvents, withFS(filepath.Join(dir, "fs")), withPeers("a"), withEndpoint)
	top, err := PlanTopology(h.node.cfg)
	require.NoError(t, err)
	require.Equal(t, []string{"events", "cpu", "tier-fs", "p2p", "tiering", "bridge", "endpoint", "peers"}, topNames(top))
	require.Equal(t, topNames(top), names(h.node.plan))
	for _, c := range top {
		_, ok := h.node.system.ProcessRegistry.Get(h.node.pidOf(c.Name))
		require.True(t, ok, "%s runs at its wired PID", c.Name)
	}

	stopped := make(chan string, len(top))
	watching := make(chan struct{})
	_, err = h.node.system.Root.SpawnNamed(actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *actor.Started:
			for _, c := range top {
				ctx.Watch(h.node.pidOf(c.Name))
			}
			close(watching)
		case *actor.Terminated:
			stopped <- m.Who.Id
		}
	}), "topology-watcher")
	require.NoError(t, err)
	<-watching
	require.NoError(t, h.node.Close(h.ctx))
	var order []string
	for range top {
		order = append(order, filepath.Base(<-stopped))
	}
	want := topNames(top)
	slices.Reverse(want)
	require.Equal(t, want, order, "actors stop in the reverse of their spawn order")
}

func topNames(t Topology) []string {
	var out []string
	for _, c := range t {
		out = append(out, c.Name)
	}
	return out
}

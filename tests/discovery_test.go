package tests

// Peers found through etcd, across real processes: kvtierd daemons whose
// only peer configuration is peers.discovery find each other in a real
// etcd (Debian's etcd 3.4; internal/testutil/testetcd), fetch blocks across nodes
// with every byte verified, and follow the fleet as it changes — a node
// joining late, one SIGKILLed (gone from the others within its lease TTL
// and a heartbeat, nothing it held left leased or pinned), one stopped
// gracefully (gone at once), etcd itself stopped (sessions keep serving)
// and restarted (membership converges). A second node claiming a live
// node's id exits non-zero.

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvtier/kvtier/internal/testutil/tempfile"
	"github.com/kvtier/kvtier/internal/testutil/testetcd"
	"github.com/kvtier/kvtier/messages"
	fleetstatus "github.com/kvtier/kvtier/tools/fleet"
)

// discoveryTTL is the daemons' lease (etcd's shortest): a killed node
// leaves the others' view this long after its last keep-alive.
const discoveryTTL = 2 * time.Second

// heartbeat is the daemons' heartbeat interval (the default).
const heartbeat = 2 * time.Second

// discoveryConfig writes node id's config file: its only peers are etcd's
// (the flags startPeerDaemon adds say the same node id, listen address
// and secret; a config file must be valid on its own).
func discoveryConfig(t *testing.T, etcd *testetcd.Server, id string) string {
	t.Helper()
	yaml := fmt.Sprintf(`peers:
  node_id: %s
  listen: tcp://127.0.0.1:0
  secret: %s
  discovery:
    kind: etcd
    endpoints: [%s]
    ttl: %s
`, id, peerSecret, etcd.Endpoint(), discoveryTTL)
	return tempfile.Write(t, "kvtier.yaml", yaml)
}

// waitMetric polls a daemon's /metrics until name reads want.
func (p *peerDaemon) waitMetric(t *testing.T, ctx context.Context, name string, want float64) {
	t.Helper()
	for p.metric(t, ctx, name) != want {
		select {
		case <-ctx.Done():
			t.Fatalf("%s never %v:\n%s", name, want, p.stderr)
		case <-time.After(20 * time.Millisecond): // NB: polling a process's metrics; no message to wait on
		}
	}
}

// waitFleet waits until every daemon has a ready session to every other.
func waitFleet(t *testing.T, ctx context.Context, fleet map[string]*peerDaemon) {
	t.Helper()
	for id, d := range fleet {
		for other := range fleet {
			if other != id {
				d.waitPeerReady(t, ctx, other)
			}
		}
		d.waitMetric(t, ctx, "kvtier_discovery_members", float64(len(fleet)-1))
	}
}

// fetchVerified has d fetch ks (stored elsewhere) and checks every byte.
func (p *peerDaemon) fetchVerified(t *testing.T, ctx context.Context, id string, ks []messages.Key) {
	t.Helper()
	req := &messages.ReqContext{RequestID: id}
	st := p.lookupSettled(t, ctx, req, ks, messages.Retry, messages.HitPending)
	require.Equal(t, allStatus(len(ks), messages.Hit), st, "every block fetched from a peer")
	p.loadAndVerify(t, ctx, req, ks)
}

// waitQuiet polls until nothing is pinned, leased or being written: what a
// dead peer's rounds held is released when its connection drops.
func (p *peerDaemon) waitQuiet(t *testing.T, ctx context.Context) {
	t.Helper()
	for {
		s, err := p.eng.Stats(ctx)
		require.NoError(t, err)
		if s.Pinned == 0 && s.Leased == 0 && s.WritePending == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("never quiet: %+v", s)
		case <-time.After(20 * time.Millisecond): // NB: polling a process's stats
		}
	}
}

// logIndex is the position of the first log line with message msg (-1:
// none).
func (p *peerDaemon) logIndex(msg string) int {
	for i, line := range strings.Split(p.stderr.String(), "\n") {
		if strings.Contains(line, `"message":"`+msg+`"`) {
			return i
		}
	}
	return -1
}

func registered(t *testing.T, ctx context.Context, cli *clientv3.Client, id string) bool {
	t.Helper()
	resp, err := cli.Get(ctx, "/kvtier/nodes/"+id)
	require.NoError(t, err)
	return len(resp.Kvs) == 1
}

// discoveryRig runs the test's etcd and returns a context bounding the
// test and a starter of kvtierd processes whose only peers are etcd's.
func discoveryRig(t *testing.T, bound time.Duration) (context.Context, *testetcd.Server, func(id string) *peerDaemon) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)
	etcd := testetcd.Start(t)
	bin := buildDaemon(t)
	return ctx, etcd, func(id string) *peerDaemon {
		return startPeerDaemon(t, ctx, bin, id, "--config", discoveryConfig(t, etcd, id))
	}
}

func TestDiscoveryFleetJoinsLeavesAndOutlivesEtcd(t *testing.T) {
	ctx, etcd, start := discoveryRig(t, 4*time.Minute)
	a, b, c := start("a"), start("b"), start("c")
	fleet := map[string]*peerDaemon{"a": a, "b": b, "c": c}
	waitFleet(t, ctx, fleet)

	onA := peerKeys(0, 64)
	a.storeBlocks(t, ctx, onA)
	b.fetchVerified(t, ctx, "b-from-a", onA)
	c.fetchVerified(t, ctx, "c-from-a", onA)

	t.Log("kvtier fleet status reads the members from etcd and each one's probes and metrics")
	status, err := fleetstatus.Status(ctx, fleetstatus.Options{Endpoints: []string{etcd.Endpoint()}})
	require.NoError(t, err)
	require.Len(t, status.Nodes, 3)
	for i, n := range status.Nodes {
		require.Equal(t, []string{"a", "b", "c"}[i], n.Node)
		require.Empty(t, n.Err, "node %s", n.Node)
		require.True(t, n.Ready, "node %s", n.Node)
		require.True(t, n.DiscoveryUp, "node %s", n.Node)
		require.Equal(t, 2, n.PeersReady, "node %s", n.Node)
		require.Equal(t, 2, n.PeersServing, "node %s", n.Node)
	}
	require.Equal(t, 64.0, status.Nodes[0].Blocks["cpu"], "a holds what it stored")
	require.Zero(t, status.Nodes[0].PeerFetched)
	require.Equal(t, 64.0, status.Nodes[1].PeerFetched, "b fetched a's blocks")
	require.Equal(t, 64.0, status.Nodes[2].PeerFetched, "c fetched a's blocks")

	t.Log("a node claiming a live node's id exits non-zero")
	dup := startDuplicate(t, buildDaemon(t), discoveryConfig(t, etcd, "a"))
	exit, err := dup.wait(ctx)
	require.NoError(t, err)
	require.NotZero(t, exit, "stderr:\n%s", dup.stderr)
	rec, err := dup.stderr.WaitJSON(ctx, "cannot open node")
	require.NoError(t, err)
	require.Contains(t, rec["error"], "already registered")

	// join starts node id, waits until the fleet (it included) converged,
	// stores ks on it and has by fetch them from it.
	join := func(id string, ks []messages.Key, by *peerDaemon) *peerDaemon {
		p := start(id)
		fleet[id] = p
		waitFleet(t, ctx, fleet)
		p.storeBlocks(t, ctx, ks)
		by.fetchVerified(t, ctx, "from-"+id, ks)
		return p
	}

	t.Log("a fourth node joins later and is used")
	onD := peerKeys(5000, 32)
	d := join("d", onD, a)

	t.Log("c, SIGKILLed with rounds of its own in flight, leaves within its lease TTL and a heartbeat")
	_, err = c.eng.Lookup(ctx, &messages.ReqContext{RequestID: "c-dies"}, onD, false) // starts peer rounds on the others
	require.NoError(t, err)
	require.NoError(t, c.cmd.Process.Kill())
	killed := time.Now()
	awaitClosed(t, c.exited, exitBound, "killed c")
	delete(fleet, "c")
	for _, p := range fleet {
		p.waitMetric(t, ctx, "kvtier_discovery_members", 2)
		p.waitMetric(t, ctx, `kvtier_peer_ready{peer="c"}`, 0)
		_, err := p.stderr.WaitJSON(ctx, "peer: discovered member left; no longer dialed")
		require.NoError(t, err)
	}
	// NB: a bound for a loaded 2-core machine, not a timing: etcd expires
	// leases in 500 ms steps, and the watch and the scrape add their own.
	left := time.Since(killed)
	require.Less(t, left, discoveryTTL+heartbeat+2*time.Second, "c left the others' view %v after its death", left)
	t.Logf("c left the others' view %v after its death", left)
	for _, p := range fleet {
		p.waitQuiet(t, ctx)
	}
	cli := etcd.Client(t)
	require.False(t, registered(t, ctx, cli, "c"), "c's key went with its lease")

	t.Log("d, stopped gracefully, deletes its key before it says Bye")
	require.True(t, registered(t, ctx, cli, "d"))
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	exit, err = d.wait(ctx)
	require.NoError(t, err)
	require.Zero(t, exit, "clean shutdown:\n%s", d.stderr)
	require.False(t, registered(t, ctx, cli, "d"), "gone from etcd when the process exits, not a lease later")
	deregistered, drained := d.logIndex("peer discovery: deregistered"), d.logIndex("kvtier peers drained")
	require.True(t, deregistered >= 0 && drained > deregistered, "deregistered (line %d) before the sessions' Bye (line %d)", deregistered, drained)
	delete(fleet, "d")
	for _, p := range fleet {
		p.waitMetric(t, ctx, "kvtier_discovery_members", 1)
	}

	t.Log("etcd stops past the lease TTL: the sessions keep serving")
	etcd.Kill()
	for _, p := range fleet {
		p.waitMetric(t, ctx, "kvtier_discovery_up", 0)
	}
	onA2 := peerKeys(9000, 32)
	a.storeBlocks(t, ctx, onA2)
	b.fetchVerified(t, ctx, "b-from-a-without-etcd", onA2)
	for _, p := range fleet {
		_, err := p.stderr.WaitJSON(ctx, "peer discovery: registration lost; registering again under a new lease")
		require.NoError(t, err)
	}
	require.Equal(t, 1.0, b.metric(t, ctx, `kvtier_peer_ready{peer="a"}`))
	require.Equal(t, 1.0, a.metric(t, ctx, `kvtier_peer_ready{peer="b"}`))
	require.Equal(t, 1.0, a.metric(t, ctx, "kvtier_discovery_members"), "etcd down is not a member down")

	t.Log("etcd restarts: the nodes register again under new leases and membership converges")
	require.NoError(t, etcd.Restart(ctx))
	for _, p := range fleet {
		p.waitMetric(t, ctx, "kvtier_discovery_up", 1)
		require.Equal(t, 2.0, p.metric(t, ctx, "kvtier_discovery_registrations_total"))
	}
	join("e", peerKeys(12000, 16), b)
	for _, p := range fleet {
		p.waitQuiet(t, ctx)
	}
}

// startDuplicate starts a daemon expected to fail at Open (it never logs
// its listening line).
func startDuplicate(t *testing.T, bin, cfg string) *daemon {
	t.Helper()
	return startDaemon(t, bin, "--pool-path", poolPath(t), "--metrics-listen", "127.0.0.1:0", "--log-format", "json",
		"--pool-bytes", "16MiB", "--block-bytes", "64KiB", "--config", cfg, "--engine-listen", "none")
}

// A member whose lease lapses while it is frozen (SIGSTOP: alive to the
// kernel, deaf to its peers) is probed by the others when etcd reports it
// gone, does not answer, and is let go: it leaves their sessions within a
// heartbeat of leaving etcd. Thawed, it registers again and is dialed again.
func TestDiscoveryFrozenMemberIsLetGoWhenItLeavesEtcd(t *testing.T) {
	ctx, etcd, start := discoveryRig(t, 2*time.Minute)
	a, b := start("a"), start("b")
	waitFleet(t, ctx, map[string]*peerDaemon{"a": a, "b": b})

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
	etcd.Lapse(t, "/kvtier/nodes/a")
	b.waitMetric(t, ctx, "kvtier_discovery_members", 0)
	b.waitMetric(t, ctx, `kvtier_peer_ready{peer="a"}`, 0) // no answer to the probe: let go
	_, err := b.stderr.WaitJSON(ctx, "peer: discovered member left; no longer dialed")
	require.NoError(t, err)

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	b.waitMetric(t, ctx, "kvtier_discovery_members", 1)
	b.waitPeerReady(t, ctx, "a")
	onA := peerKeys(0, 16)
	a.storeBlocks(t, ctx, onA)
	b.fetchVerified(t, ctx, "after-thaw", onA)
	b.waitQuiet(t, ctx)
}

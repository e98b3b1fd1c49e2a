package node

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/internal/testutil/testetcd"
	"github.com/kvtier/kvtier/internal/testutil/testloop"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer/discovery"
)

// Nodes that find each other through a real etcd (internal/testutil/testetcd:
// Debian's etcd 3.4, which the v3.7 client speaks to).

// discoveryTTL is etcd's shortest lease.
const discoveryTTL = 2 * time.Second

// withDiscovery makes a node whose peers come only from etcd.
func withDiscovery(node string, s *testetcd.Server, tweak ...func(*config.PeersConfig)) func(*config.Config) {
	return func(c *config.Config) {
		c.Peers = config.PeersConfig{NodeID: node, Listen: "tcp://127.0.0.1:0", Secret: testSecret,
			Discovery: config.DiscoveryConfig{Kind: "etcd", Endpoints: []string{s.Endpoint()}, TTL: discoveryTTL}}
		for _, f := range tweak {
			f(&c.Peers)
		}
	}
}

// awaitTrue polls cond (node state with no message to wait on: discovery's
// view, a peer's counters) until it holds or the test's bound passes.
func awaitTrue(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testloop.Poll(t, what, testTimeout, cond)
}

func (h *harness) peerStat(node string) (messages.PeerStats, bool) {
	h.t.Helper()
	stats, err := h.node.PeerStats(h.ctx)
	require.NoError(h.t, err)
	for _, s := range stats {
		if s.Node == node {
			return s, true
		}
	}
	return messages.PeerStats{}, false
}

func (h *harness) discoveryUp() bool { return h.metricTotals("", "")["kvtier_discovery_up"] == 1 }

func TestDiscoveryNodesFindEachOtherFetchAndLeave(t *testing.T) {
	s := testetcd.Start(t)
	a := open(t, 64, withDiscovery("a", s))
	b := open(t, 64, withDiscovery("b", s))
	require.NoError(t, b.node.WaitPeers(b.ctx, "a"), "b dials a, found in etcd")
	require.NoError(t, a.node.WaitPeers(a.ctx, "b"), "and a dials b")

	a.storeReady(ids(0, 16)...)
	b.fetchAndVerify(&messages.ReqContext{RequestID: "r"}, ids(0, 16)...)
	b.quiet()
	a.quiet()
	awaitTrue(t, "discovery up", func() bool { return a.discoveryUp() && b.discoveryUp() })
	require.Equal(t, 1.0, b.metricTotals("", "")["kvtier_discovery_members"])

	require.NoError(t, a.node.Close(a.ctx))
	awaitTrue(t, "a gone from b's view", func() bool {
		st, _ := b.peerStat("a")
		return !st.Ready && !st.Serving && b.metricTotals("", "")["kvtier_discovery_members"] == 0
	})
}

// A discovered node still proves the secret and must be allowed: etcd
// says where a node is, the handshake says who it is.
func TestDiscoveredPeersStillPassTheHandshake(t *testing.T) {
	s := testetcd.Start(t)
	a := open(t, 64, withDiscovery("a", s, func(p *config.PeersConfig) { p.Allow = []string{"b", "c"} }))
	b := open(t, 64, withDiscovery("b", s))
	open(t, 64, withDiscovery("c", s, func(p *config.PeersConfig) { p.Secret = "another-secret-0123456789" }))
	open(t, 64, withDiscovery("d", s))
	require.NoError(t, a.node.WaitPeers(a.ctx, "b"))
	awaitTrue(t, "c refused (wrong secret), d refused (not allowed)", func() bool {
		refused := a.node.peerCounters().Refused()
		return refused["auth"] > 0 && refused["not_allowed"] > 0
	})
	c, _ := a.peerStat("c")
	require.False(t, c.Ready || c.Serving, "no session with the node that cannot prove the secret")
	d, _ := a.peerStat("d")
	require.False(t, d.Ready || d.Serving, "no session with the node off the allow-list")
	require.NoError(t, b.node.WaitPeers(b.ctx, "a"))
}

func TestDiscoveryDuplicateNodeIDFailsOpen(t *testing.T) {
	s := testetcd.Start(t)
	open(t, 16, withDiscovery("a", s))
	cfg := config.Config{PoolBytes: 16 * testBlock, BlockBytes: testBlock}
	withDiscovery("a", s)(&cfg)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	node, err := Open(ctx, cfg)
	require.ErrorIs(t, err, ErrDuplicateNode)
	require.ErrorIs(t, err, discovery.ErrDuplicateNode)
	require.Nil(t, node)
}

// etcd down when the node opens: it opens anyway and serves its static
// peers; once etcd answers it registers and finds the others.
func TestDiscoveryEtcdDownAtOpen(t *testing.T) {
	s := testetcd.New(t) // not started
	static := open(t, 16, withPeers("static"))
	a := open(t, 16, withDiscovery("a", s, func(p *config.PeersConfig) {
		p.Static = []config.PeerAddr{{NodeID: "static", Addr: static.node.PeerAddr()}}
	}))
	require.NoError(t, a.node.WaitPeers(a.ctx, "static"), "static peers work without etcd")
	require.False(t, a.discoveryUp())

	require.NoError(t, s.Start(context.Background()))
	awaitTrue(t, "a registered", a.discoveryUp)
	b := open(t, 16, withDiscovery("b", s))
	require.NoError(t, a.node.WaitPeers(a.ctx, "b"))
	require.NoError(t, b.node.WaitPeers(b.ctx, "a"))
}

// A member whose key leaves etcd while its session is ready and answering
// (etcd lost it, not the member) is probed, not dropped: its session lives
// on. One that does not answer the probe is let go.
func TestDiscoveryMemberThatLeftEtcdButAnswersIsKept(t *testing.T) {
	s := testetcd.Start(t)
	a := open(t, 16, withDiscovery("a", s))
	b := open(t, 16, withDiscovery("b", s))
	require.NoError(t, b.node.WaitPeers(b.ctx, "a"))
	a.storeReady(ids(0, 4)...)

	// a's key and lease go behind its back (as when a lease lapses while a
	// is cut off from etcd); a registers again when it notices.
	lapsed := s.Lapse(t, "/kvtier/nodes/a")
	cli := s.Client(t)
	awaitTrue(t, "a registered again", func() bool {
		r, err := cli.Get(a.ctx, "/kvtier/nodes/a")
		return err == nil && len(r.Kvs) == 1 && clientv3.LeaseID(r.Kvs[0].Lease) != lapsed
	})
	awaitTrue(t, "b sees a again", func() bool { return b.metricTotals("", "")["kvtier_discovery_members"] == 1 })

	st, ok := b.peerStat("a")
	require.True(t, ok)
	require.True(t, st.Ready)
	require.Zero(t, st.Resets, "the session to a lived through a's absence from etcd")
	b.fetchAndVerify(&messages.ReqContext{RequestID: "r"}, ids(0, 4)...)
}

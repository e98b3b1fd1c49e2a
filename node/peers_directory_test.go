package node

// The peer directory through whole nodes: two producers publish their KV
// events, a consumer follows both streams and asks, on a miss, only the
// producer whose CPU tier holds the keys — and nobody for keys nobody
// holds.

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/internal/testutil/testetcd"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/p2p"
)

// withEvents turns on a node's KV events on loopback, with a replay socket.
func withEvents(c *config.Config) {
	c.Events = config.EventsConfig{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0"}
}

// peerOf is h as a static peer, its event addresses included.
func peerOf(id string, h *harness) config.PeerAddr {
	return config.PeerAddr{NodeID: id, Addr: h.node.PeerAddr(), Events: h.node.EventsEndpoint(), EventsReplay: h.node.EventsReplayEndpoint()}
}

// awaitDirectory waits until h's directory holds want keys. NB: h runs on
// a manual clock, and so does the P2P tier's back-off before it subscribes
// again to a stream that failed (a dial or replay that a loaded machine
// refused: CI saw it once, and the directory then never filled): while
// the count is short, the clock is moved past that back-off once a real
// second, as a real clock would have moved.
func (h *harness) awaitDirectory(what string, want int) {
	h.t.Helper()
	last := time.Now()
	awaitTrue(h.t, what, func() bool {
		if h.p2pStats().DirectoryKeys == want {
			return true
		}
		if time.Since(last) >= time.Second {
			h.clock.Advance(time.Second)
			last = time.Now()
		}
		return false
	})
}

// p2pStats is h's P2P tier's figures.
func (h *harness) p2pStats() messages.SecondaryStats {
	h.t.Helper()
	for _, s := range h.tiering().Tiers {
		if s.Kind == p2p.Kind {
			return s
		}
	}
	h.t.Fatal("no P2P tier")
	return messages.SecondaryStats{}
}

// fetchAsking looks ks up from h (a RETRY starts the peers' lookup; once
// the tiering actor is idle the answer is final) and returns the statuses
// and how many peers were asked.
func (h *harness) fetchAsking(ks []messages.Key) ([]messages.LookupStatus, uint64) {
	h.t.Helper()
	before := h.p2pStats().PeerAsks
	req := &messages.ReqContext{RequestID: "fetch"}
	h.lookup(req, ks, false)
	h.idle()
	st := h.lookupUntilSettled(req, ks)
	require.NoError(h.t, h.m.RequestFinished(h.ctx, req))
	return st, h.p2pStats().PeerAsks - before
}

func TestDirectoryAsksOnlyThePeerThatHoldsTheKeys(t *testing.T) {
	a := open(t, 64, withPeers("a"), withEvents)
	b := open(t, 64, withPeers("b"), withEvents)
	a.storeReady(ids(0, 8)...)
	b.storeReady(ids(100, 8)...)
	c := open(t, 64, withPeers("c", peerOf("a", a), peerOf("b", b)), func(cfg *config.Config) { cfg.Peers.Directory = true })
	require.NoError(t, c.node.WaitPeers(c.ctx, "a", "b"))
	c.awaitDirectory("the consumer's directory has read both streams", 16)

	st, asked := c.fetchAsking(keys(ids(0, 8)...))
	require.Equal(t, statuses(8, messages.Hit), st, "fetched from a")
	require.Equal(t, uint64(1), asked, "only a holds them: only a is asked")
	st, asked = c.fetchAsking(keys(ids(100, 8)...))
	require.Equal(t, statuses(8, messages.Hit), st, "fetched from b")
	require.Equal(t, uint64(1), asked)
	st, asked = c.fetchAsking(keys(500, 501))
	require.Equal(t, statuses(2, messages.Miss), st)
	require.Zero(t, asked, "both streams are read from their first batch and neither holds them: nobody is asked")

	// A producer's removals reach the directory too: a key it dropped is
	// not asked for.
	a.storeReady(200)
	c.awaitDirectory("a's new block is in the directory", 17)
	require.NoError(t, a.m.ResetCache(a.ctx))
	c.awaitDirectory("a's cleared blocks left the directory", 8)
	st, asked = c.fetchAsking(keys(200))
	require.Equal(t, statuses(1, messages.Miss), st)
	require.Zero(t, asked)
	a.quiet()
	b.quiet()
	c.quiet()
}

func TestDirectoryAsksAPeerWhoseEventsItCannotReadWhenNobodyIsNamed(t *testing.T) {
	a := open(t, 64, withPeers("a"), withEvents)
	b := open(t, 64, withPeers("b")) // no events: the directory cannot vouch for it
	a.storeReady(ids(0, 4)...)
	b.storeReady(ids(100, 4)...)
	c := open(t, 64, withPeers("c", peerOf("a", a), config.PeerAddr{NodeID: "b", Addr: b.node.PeerAddr()}),
		func(cfg *config.Config) { cfg.Peers.Directory = true })
	require.NoError(t, c.node.WaitPeers(c.ctx, "a", "b"))
	c.awaitDirectory("a's stream is read", 4)

	st, asked := c.fetchAsking(keys(ids(0, 4)...))
	require.Equal(t, statuses(4, messages.Hit), st)
	require.Equal(t, uint64(1), asked, "a is named: b is not asked")
	st, asked = c.fetchAsking(keys(ids(100, 4)...))
	require.Equal(t, statuses(4, messages.Hit), st, "nobody named: b, which the directory cannot see, is asked and has them")
	require.Equal(t, uint64(1), asked)
}

// With discovery, a member's etcd record says where it publishes its
// events: the directory needs no static event addresses.
func TestDirectoryFollowsTheEventsOfDiscoveredMembers(t *testing.T) {
	s := testetcd.Start(t)
	directory := func(pc *config.PeersConfig) { pc.Directory = true }
	a := open(t, 64, withDiscovery("a", s), withEvents)
	b := open(t, 64, withDiscovery("b", s), withEvents)
	c := open(t, 64, withDiscovery("c", s, directory), withEvents)
	require.NoError(t, c.node.WaitPeers(c.ctx, "a", "b"))
	a.storeReady(ids(0, 4)...)
	c.awaitDirectory("c's directory follows a's events, found through etcd", 4)

	st, asked := c.fetchAsking(keys(ids(0, 4)...))
	require.Equal(t, statuses(4, messages.Hit), st)
	require.Equal(t, uint64(1), asked, "only a is asked")
	b.quiet()
}

package node

// The node's peers (P2P tier): the data-plane transport registered on the
// pool and the control plane's ROUTER are opened before the actors start
// (a bad address fails Open); the control plane ("peers") and the P2P tier
// ("p2p", the last tier of the tiering actor) are spawned under the
// guardian; the transport is closed after the actors stopped and before the
// pool is unmapped (a transfer may still be writing into a slot). With
// peers.discovery the node registers in etcd once its control socket is
// bound (a live node with the same id fails Open), hands the plane its
// members (node_discovery.go), and leaves etcd before it says Bye.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer"
	"github.com/kvtier/kvtier/peer/discovery"
	"github.com/kvtier/kvtier/peer/peermsg"
	"github.com/kvtier/kvtier/peer/wire"
	"github.com/kvtier/kvtier/rdma"
	"github.com/kvtier/kvtier/rdma/nixl"
	"github.com/kvtier/kvtier/rdma/tcp"
	"github.com/kvtier/kvtier/tiers/p2p"
)

// peersState is the node's peer plumbing.
type peersState struct {
	transport rdma.Transport
	listener  *peer.Listener
	counters  *peer.Counters
	cfg       peer.Config
	plane     *actor.PID // nil without peers
	tier      *actor.PID
	discovery *discovery.Registry // nil without peers.discovery
}

// openPeers opens the transport and the control plane's socket.
func (n *Node) openPeers() error {
	pc := n.cfg.Peers
	if !pc.Enabled() {
		return nil
	}
	secret, err := pc.SecretBytes()
	if err != nil {
		return err
	}
	t, err := n.newTransport(pc)
	if err != nil {
		return err
	}
	region := n.poolRegion()
	if err := t.Register(region); err != nil {
		_ = t.Close()
		return fmt.Errorf("kvtier: peers: register the pool with the %s data plane: %w", t.Kind(), err)
	}
	largest := n.pool.LargestSlot
	if t.Kind() == "nixl" {
		// NB: nixl moves its grid only (rdma/nixl): slots of the pool's other
		// sizes are not offered to peers nor fetched into.
		region, largest = region.Grid(), nil
	}
	static := make([]peer.Addr, len(pc.Static))
	for i, s := range pc.Static {
		static[i] = peer.Addr{Node: s.NodeID, Addr: s.Addr, Events: s.Events, EventsReplay: s.EventsReplay}
	}
	cfg := peer.Config{Node: pc.NodeID, Listen: pc.Listen, Secret: secret, Peers: static, Allow: pc.Allow,
		Namespaces: pc.Namespaces, BlockBytes: n.cfg.BlockBytes, Slots: region.IDLimit(),
		Transport: t, Region: region, LargestSlot: largest, JobSeq: &atomic.Uint64{},
		LeaseTTL: pc.LeaseTTL, LookupTimeout: pc.LookupTimeout, FetchTimeout: pc.FetchTimeout,
		HeartbeatInterval: pc.HeartbeatInterval, Clock: n.cfg.Clock,
		Log: n.cfg.Logger.With().Str("actor", "peers").Logger()}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		_ = t.Close()
		return err
	}
	ctr := peer.NewCounters()
	ln, err := peer.Listen(cfg, ctr)
	if err != nil {
		_ = t.Close()
		return err
	}
	var reg *discovery.Registry
	if pc.Discovery.Enabled() {
		if reg, err = n.openDiscovery(pc, ln.Addr(), t); err != nil {
			ln.Close()
			_ = t.Close()
			return err
		}
		cfg.Members = newMemberFeed(reg, n.cfg.BlockBytes, t.Kind(), pc.Namespaces, cfg.Log)
	}
	n.peers = peersState{transport: t, listener: ln, counters: ctr, cfg: cfg, discovery: reg}
	ev := n.cfg.Logger.Info().Str("node_id", pc.NodeID).Str("control", ln.Addr()).Str("transport", t.Kind()).
		Int("static_peers", len(static)).Bool("discovery", reg != nil)
	if info, ok := nixl.Describe(t); ok {
		ev = ev.Str("backend", info.Backend).Str("nixl_version", info.Version).Str("library", info.Library).
			Str("agent", info.Agent).Str("ucx_tls", os.Getenv("UCX_TLS"))
	}
	ev.Msg("kvtier peers: data plane backend " + t.Kind())
	return nil
}

// poolRegion is the pool as the data plane sees it: the first block size's
// slots, then every other size's, found by id (Pool.Locate) as sizes come.
func (n *Node) poolRegion() rdma.Region {
	return rdma.Region{Base: n.pool.Memory(), SlotBytes: n.pool.BlockBytes(), Slots: n.pool.Slots(),
		Locate: n.pool.Locate, IDs: n.pool.SlotIDLimit(), MaxSlotBytes: int(min(n.pool.Budget(), wire.MaxBlockBytes))}
}

func (n *Node) newTransport(pc config.PeersConfig) (rdma.Transport, error) {
	if pc.TransportImpl != nil {
		return pc.TransportImpl, nil
	}
	log := n.cfg.Logger.With().Str("component", "data-plane").Logger()
	switch pc.Transport {
	case "", "tcp":
		listen := pc.DataListen
		if listen == "" {
			listen = defaultDataListen(pc.Listen)
		}
		tlsConfig, err := pc.TLS.Load()
		if err != nil {
			return nil, err
		}
		return tcp.New(tcp.Config{Node: pc.NodeID, Listen: listen, Advertise: pc.DataAdvertise, TLS: tlsConfig, Log: log})
	case "nixl":
		nc := pc.Nixl
		t, err := nixl.New(nixl.Config{Name: pc.NodeID, Library: nc.Library, PluginDir: nc.PluginDir,
			Backend: nc.Backend, BackendParams: nc.BackendParams, WriteTimeout: nc.WriteTimeout, LateWriteGrace: nc.LateWriteGrace})
		if err != nil {
			// NB: never a silent fall back to tcp: the operator asked for nixl.
			return nil, fmt.Errorf("kvtier: peers: nixl data plane: %w", err)
		}
		return t, nil
	}
	return nil, fmt.Errorf("%w: peers: transport %q", messages.ErrBadConfig, pc.Transport)
}

// defaultDataListen binds the data plane on the control plane's host, any
// port.
func defaultDataListen(control string) string {
	host := strings.TrimPrefix(control, "tcp://")
	if i := strings.LastIndex(host, ":"); i >= 0 {
		host = host[:i]
	}
	if host == "" || host == "*" {
		host = "0.0.0.0"
	}
	return host + ":0"
}

// p2pProps builds the P2P tier.
func (n *Node) p2pProps(w wiring) *actor.Props {
	return p2p.Props(p2p.Config{Name: n.peers.tierName(n.cfg.Peers), HoldTimeout: n.cfg.Peers.HoldTimeout,
		Directory: n.cfg.Peers.Directory, Tiering: fx.RefOf(w.to("tiering")), Clock: n.cfg.Clock, Log: n.cfg.Logger.With().Str("actor", "p2p").Logger()})
}

// peersProps builds the peer control plane (its sessions send to the CPU
// tier and the P2P tier).
func (n *Node) peersProps(w wiring) *actor.Props {
	if n.peers.listener == nil {
		w.fail(errors.New("peers planned but not opened"))
		return nil
	}
	cfg := n.peers.cfg
	cfg.CPU, cfg.Tier, cfg.Offload = w.to("cpu"), w.to("p2p"), &n.offload
	return peer.Props(cfg, n.peers.listener, n.peers.counters)
}

func (p *peersState) tierName(pc config.PeersConfig) string {
	if pc.TierName != "" {
		return pc.TierName
	}
	return p2p.DefaultName
}

// closePeers closes the data plane (after the actors stopped) and the
// control socket (the plane closes it when it stops; idempotent), and
// leaves etcd if shutdownPeers did not (a failed Open).
func (n *Node) closePeers() error {
	var errs []error
	n.leaveDiscovery(context.Background())
	if n.peers.listener != nil {
		n.peers.listener.Close()
	}
	if n.peers.transport != nil {
		errs = append(errs, n.peers.transport.Close())
	}
	n.peers.transport, n.peers.listener = nil, nil
	return errors.Join(errs...)
}

// ErrNoPeers: the node has no peers configured.
var ErrNoPeers = fmt.Errorf("%w: no peers configured", messages.ErrBadConfig)

// PeerAddr is the control plane's bound address ("" without peers).
func (n *Node) PeerAddr() string {
	if n.peers.listener == nil {
		return ""
	}
	return n.peers.listener.Addr()
}

// PeerStats returns every known peer's counters (ErrNoPeers without peers).
func (n *Node) PeerStats(ctx context.Context) ([]messages.PeerStats, error) {
	if n.peers.plane == nil {
		return nil, ErrNoPeers
	}
	return callActor(ctx, n, n.peers.plane, "kvtier peers", func(r messages.Reply[[]messages.PeerStats]) any {
		return &peermsg.GetStats{Reply: r}
	})
}

// peerCounters are the control plane's counters (nil without peers): per
// peer, frames dropped and handshakes refused by reason.
func (n *Node) peerCounters() *peer.Counters { return n.peers.counters }

// WaitPeers returns once this node has a ready session to every one of
// nodes (it can fetch from them), or ctx ends.
func (n *Node) WaitPeers(ctx context.Context, nodes ...string) error {
	if n.peers.tier == nil {
		return ErrNoPeers
	}
	_, err := callActor(ctx, n, n.peers.tier, "kvtier p2p tier", func(r messages.Reply[struct{}]) any {
		return &peermsg.AwaitPeers{Nodes: nodes, Reply: r}
	})
	return err
}

// shutdownPeers stops serving and using peers: the node leaves etcd first
// (members watching stop dialing it before its Bye reaches them), then new
// rounds are refused, rounds in flight finish until deadline and are
// aborted then, every session says Bye. Without peers it returns at once.
func (n *Node) shutdownPeers(ctx context.Context, deadline time.Time) (peermsg.ShutdownResult, error) {
	if n.peers.plane == nil {
		return peermsg.ShutdownResult{}, nil
	}
	n.leaveDiscovery(ctx)
	return callActor(ctx, n, n.peers.plane, "kvtier peers shutdown", func(r messages.Reply[peermsg.ShutdownResult]) any {
		return &peermsg.Shutdown{Deadline: deadline, Reply: r}
	})
}

// ProbePeer asks peer node which of keys it holds right now, through this
// node's session with it; nothing is promoted and the peer's leases are
// released at once. For operators and benchmarks.
func (n *Node) ProbePeer(ctx context.Context, node string, keys []messages.Key) ([]bool, error) {
	if n.peers.tier == nil {
		return nil, ErrNoPeers
	}
	return callActor(ctx, n, n.peers.tier, "kvtier p2p probe", func(r messages.Reply[[]bool]) any {
		return &peermsg.Probe{Node: node, Keys: keys, Reply: r}
	})
}

package node

// The node's etcd discovery (peers.discovery): registered in openPeers once
// the control socket is bound, its members handed to the control plane as
// peer.MemberUp / peer.MemberDown, left (key deleted, lease revoked) before
// the sessions say Bye, closed with the peers.

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/peer"
	"github.com/kvtier/kvtier/peer/discovery"
	"github.com/kvtier/kvtier/peer/wire"
	"github.com/kvtier/kvtier/rdma"
	"github.com/kvtier/kvtier/rdma/nixl"
)

// ErrDuplicateNode: Open found another live node registered under this
// node's id in etcd (peers.discovery). errors.Is finds it in Open's error.
var ErrDuplicateNode = discovery.ErrDuplicateNode

// openDiscovery registers this node in etcd, bounded by the discovery
// timeout. Only a duplicate id fails it: an unreachable etcd is retried in
// the background while the node runs with its static peers.
func (n *Node) openDiscovery(pc config.PeersConfig, control string, t rdma.Transport) (*discovery.Registry, error) {
	dc := pc.Discovery
	log := n.cfg.Logger.With().Str("component", "discovery").Logger()
	if dc.Advertise != "" {
		control = dc.Advertise
	} else if bindsAll(pc.Listen) {
		log.Warn().Str("listen", pc.Listen).Str("advertised", control).
			Msg("peer discovery: listen binds every interface and peers.discovery.advertise is unset; other hosts cannot dial the address registered")
	}
	self := discovery.Member{Node: pc.NodeID, Control: control, Data: dataAddr(pc), Transport: t.Kind(),
		Namespaces: pc.Namespaces, BlockBytes: n.cfg.BlockBytes, Slots: n.pool.Slots(), Protocol: wire.Version,
		Events: advertised(n.EventsEndpoint(), control), EventsReplay: advertised(n.EventsReplayEndpoint(), control),
		Metrics: dc.Metrics}
	reg, err := discovery.Start(context.Background(), discovery.Config{Endpoints: dc.Endpoints, Prefix: dc.Prefix,
		TTL: dc.TTL, Timeout: dc.Timeout, Self: self, Log: log})
	if err != nil {
		return nil, fmt.Errorf("kvtier: peers: %w", err)
	}
	return reg, nil
}

// leaveDiscovery deletes this node's key and stops watching; a failure
// (etcd gone) is logged, never the node's: the key expires with its lease.
func (n *Node) leaveDiscovery(ctx context.Context) {
	if n.peers.discovery == nil {
		return
	}
	if err := n.peers.discovery.Close(ctx); err != nil {
		n.cfg.Logger.Warn().Err(err).Msg("peer discovery: could not leave etcd; the key expires with its lease")
	}
}

// bindsAll reports whether a tcp://host:port listen address binds every
// interface (its bound address then says 127.0.0.1).
func bindsAll(listen string) bool {
	host, _, err := net.SplitHostPort(strings.TrimPrefix(listen, "tcp://"))
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "" || host == "*" || (ip != nil && ip.IsUnspecified())
}

// advertised is a bound tcp address as peers should dial it: one bound to
// every interface takes the advertised control address's host. Other
// transports (ipc) are returned as they are.
func advertised(bound, control string) string {
	if !strings.HasPrefix(bound, "tcp://") || !bindsAll(bound) {
		return bound
	}
	_, port, err := net.SplitHostPort(strings.TrimPrefix(bound, "tcp://"))
	host, _, herr := net.SplitHostPort(strings.TrimPrefix(control, "tcp://"))
	if err != nil || herr != nil {
		return bound
	}
	return "tcp://" + net.JoinHostPort(host, port)
}

// dataAddr is the tcp data plane's address when the config names it (the
// record is informational: the handshake carries the real metadata).
func dataAddr(pc config.PeersConfig) string {
	if pc.Transport != "" && pc.Transport != "tcp" {
		return ""
	}
	if pc.DataAdvertise != "" {
		return pc.DataAdvertise
	}
	if _, port, err := net.SplitHostPort(pc.DataListen); err == nil && port != "0" && !bindsAll("tcp://"+pc.DataListen) {
		return pc.DataListen
	}
	return ""
}

// memberFeed is discovery as the control plane sees it (peer.Members):
// members as peer.MemberUp / peer.MemberDown, leaving out — and logging
// once per incarnation — members that cannot be this node's peers (another
// data plane or protocol version, no namespace in common, another slot
// size over NIXL, which moves whole slots), which the handshake would
// refuse over and over.
type memberFeed struct {
	reg        *discovery.Registry
	blockBytes int
	transport  string
	namespaces []string
	log        zerolog.Logger
	// warned is the instance last warned about, per node. NB: touched only
	// inside the registry's callbacks, which it calls one at a time.
	warned map[string]string
}

func newMemberFeed(reg *discovery.Registry, blockBytes int, transport string, namespaces []string, log zerolog.Logger) *memberFeed {
	return &memberFeed{reg: reg, blockBytes: blockBytes, transport: transport, namespaces: namespaces, log: log, warned: map[string]string{}}
}

// Subscribe implements peer.Members.
func (f *memberFeed) Subscribe(send func(msg any)) {
	if send == nil {
		f.reg.Subscribe(nil)
		return
	}
	f.reg.Subscribe(func(ev discovery.Event) { send(f.message(ev)) })
}

// message is the plane's message for a membership event.
func (f *memberFeed) message(ev discovery.Event) any {
	m := ev.Member
	if ev.Kind == discovery.Left {
		return &peer.MemberDown{Node: m.Node}
	}
	if why := f.incompatible(m); why != "" {
		if f.warned[m.Node] != m.Instance {
			f.warned[m.Node] = m.Instance
			f.log.Warn().Str("peer", m.Node).Str("reason", why).Msg("peer discovery: member cannot be a peer of this node; not dialed")
		}
		return &peer.MemberDown{Node: m.Node} // NB: an earlier record of it may have been dialed
	}
	return &peer.MemberUp{Node: m.Node, Addr: m.Control, Events: m.Events, EventsReplay: m.EventsReplay}
}

// incompatible says why m cannot be this node's peer, or "".
func (f *memberFeed) incompatible(m discovery.Member) string {
	switch {
	case m.Protocol != wire.Version:
		return fmt.Sprintf("peer protocol %d, ours %d", m.Protocol, wire.Version)
	case m.BlockBytes != f.blockBytes && f.transport == nixl.Kind:
		return fmt.Sprintf("block bytes %d, ours %d (NIXL moves whole slots)", m.BlockBytes, f.blockBytes)
	case m.Transport != f.transport:
		return fmt.Sprintf("data plane %q, ours %q", m.Transport, f.transport)
	case len(m.Namespaces) > 0 && len(f.namespaces) > 0 && !slices.ContainsFunc(m.Namespaces, func(ns string) bool {
		return slices.Contains(f.namespaces, ns)
	}):
		return "no namespace in common"
	}
	return ""
}

package chaos

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/rdma/faulty"
	"github.com/kvtier/kvtier/rdma/tcp"
	"github.com/kvtier/kvtier/supervision"
)

// peers is three nodes, each with the single scenario's tiers (CPU, fs,
// obj) and a P2P tier, each dialing the other two; the engines are spread
// over the nodes (engine i drives node i mod 3) and share one workload, so
// a prefix one node's engine stored is looked up by another's: it is found
// at the peer and fetched over the data plane.
//
// Every peer connection runs through a proxy of the run's (proxy.go): one
// per ordered pair of nodes for the control plane, one per node in front
// of its data-plane listener. The peer faults:
//   - peer-cut: a proxy closes its live connections (both ends see the
//     link reset, mid-round or mid-payload); the sessions redial;
//   - peer-stall: a producer's data-plane write completes only after
//     peerStallFor (faulty.Stall with a deadline): its pins stay held and
//     its TransferDone is late, past the consumer's fetch deadline;
//   - peer-corrupt: a bit flips in a landed payload (faulty.Flip) before
//     the consumer verifies it: the checksum must catch it;
//   - peer-kill: a node is cut off from the network (every proxy of its
//     refuses), closed without its peers hearing a Bye, and restarted on
//     a fresh pool and fresh tiers with the same node id; its engines
//     lose what they had in flight; its peers must reconnect;
//   - peer-halfopen: one direction of a live connection silently stops
//     delivering (its bytes are read and dropped) while the connection
//     stays open, as when a route dies without a reset: only the sessions'
//     heartbeats and deadlines, and the data plane's write timeout, find it.
type peers struct{}

func (peers) Name() string { return "peers" }

func (peers) Kinds() []Kind {
	return append(single{}.Kinds(), supervision.FaultPeerCut, supervision.FaultPeerStall,
		supervision.FaultPeerCorrupt, supervision.FaultPeerKill, supervision.FaultPeerHalfOpen)
}

// The peer scenario's geometry: deadlines short enough that a cut, a
// stall or a kill is absorbed within seconds, and a producer lease TTL
// well inside the quiet timeout.
const (
	peerNodes        = 3
	peerSecret       = "kvtier-chaos-peer-secret"
	peerLeaseTTL     = 3 * time.Second
	peerLookup       = 500 * time.Millisecond
	peerFetch        = 2 * time.Second
	peerHold         = time.Second
	peerHeartbeat    = 500 * time.Millisecond
	peerWriteTimeout = 2 * time.Second
	peerStallFor     = peerFetch // a stalled write completes at the consumer's fetch deadline
	peerCutTick      = 100 * time.Millisecond
	peerKillTick     = time.Second
	peerCloseTimeout = 3 * time.Second
	peerUpTimeout    = 20 * time.Second
)

// peerNet is the run's peer network: the proxies and each node's current
// data-plane wrapper.
type peerNet struct {
	names []string
	ctl   map[[2]string]*proxy // from → to: the control link from dials
	data  map[string]*proxy    // into a node's data-plane listener
	gens  map[string]int       // incarnations per node (restarts get fresh tiers)
}

func (peers) open(ctx context.Context, rs *runState, e *env) ([]*nodeUnderTest, error) {
	pn := &peerNet{ctl: map[[2]string]*proxy{}, data: map[string]*proxy{}, gens: map[string]int{}}
	rs.closers = append(rs.closers, pn.close)
	for i := range peerNodes {
		pn.names = append(pn.names, fmt.Sprintf("n%d", i))
	}
	for _, a := range pn.names {
		p, err := newProxy()
		if err != nil {
			return nil, err
		}
		pn.data[a] = p
		for _, b := range pn.names {
			if a == b {
				continue
			}
			if pn.ctl[[2]string{a, b}], err = newProxy(); err != nil {
				return nil, err
			}
		}
	}
	nodes := make([]*nodeUnderTest, 0, peerNodes)
	fail := func(err error) ([]*nodeUnderTest, error) {
		closeNodes(rs, nodes)
		return nil, err
	}
	for _, name := range pn.names {
		n := &nodeUnderTest{name: name}
		// NB: every node's bridge is "kvtier/bridge" in its own actor
		// system: a bridge panic anywhere counts as a restart everywhere
		// (hit-loadable only gets more lenient).
		rs.ledger.OnRecord(func(f supervision.Fault) {
			if f.Decision.Kind == supervision.FaultPanic && strings.HasPrefix(f.Point.Site, "kvtier/bridge ") {
				n.epoch.Add(1)
			}
		})
		if err := pn.openNode(ctx, rs, e, n); err != nil {
			return fail(err)
		}
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		pn.route(n)
	}
	for _, n := range nodes {
		wctx, cancel := context.WithTimeout(ctx, peerUpTimeout)
		err := n.node.WaitPeers(wctx, pn.others(n.name)...)
		cancel()
		if err != nil {
			return fail(fmt.Errorf("node %s: peers not up: %w", n.name, err))
		}
	}
	if rs.gate.enabled[supervision.FaultPeerCut] || rs.gate.enabled[supervision.FaultPeerKill] || rs.gate.enabled[supervision.FaultPeerHalfOpen] {
		rs.stoppers = append(rs.stoppers, pn.drive(rs, e, nodes))
	}
	return nodes, nil
}

// others are the node ids but node's.
func (pn *peerNet) others(node string) []string {
	var out []string
	for _, o := range pn.names {
		if o != node {
			out = append(out, o)
		}
	}
	return out
}

// openNode opens an incarnation of n with peers: the first, or a restart
// on a fresh pool and fresh tiers after a kill. Its data proxy forwards to
// its new data-plane listener.
func (pn *peerNet) openNode(ctx context.Context, rs *runState, e *env, n *nodeUnderTest) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	var ft *faulty.Transport
	tweak, err := pn.tweak(rs, n.name, addr, &ft)
	if err != nil {
		return err
	}
	dir := n.name
	if g := pn.gens[n.name]; g > 0 {
		dir = fmt.Sprintf("%s-%d", n.name, g)
	}
	pn.gens[n.name]++
	if err := openInto(ctx, rs, e, n, dir, tweak); err != nil {
		_ = ft.Close()
		return err
	}
	n.dataPlane = ft
	pn.data[n.name].setTarget(addr)
	return nil
}

// route points the control proxies into n at its control plane.
func (pn *peerNet) route(n *nodeUnderTest) {
	for _, o := range pn.others(n.name) {
		pn.ctl[[2]string{o, n.name}].setTarget(hostPort(n.node.PeerAddr()))
	}
}

// drive injects peer-cut and peer-halfopen (a decision each every
// peerCutTick) and peer-kill (one every peerKillTick; kills are
// sequential: at most one node is down at a time). The returned func stops it, after a kill in progress finished.
func (pn *peerNet) drive(rs *runState, e *env, nodes []*nodeUnderTest) (stop func()) {
	cuttable := make([]*proxy, 0, len(pn.data)+len(pn.ctl))
	for _, a := range pn.names {
		cuttable = append(cuttable, pn.data[a])
		for _, b := range pn.others(a) {
			cuttable = append(cuttable, pn.ctl[[2]string{a, b}])
		}
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(peerCutTick)
		defer tick.Stop()
		perKill := int(peerKillTick / peerCutTick)
		for i := 1; ; i++ {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			if d := rs.gate.decide("peer cut", supervision.FaultPeerCut); !d.None() {
				cuttable[d.Arg%uint64(len(cuttable))].cut()
			}
			if d := rs.gate.decide("peer halfopen", supervision.FaultPeerHalfOpen); !d.None() {
				cuttable[d.Arg%uint64(len(cuttable))].halfOpen(d.Arg / uint64(len(cuttable)))
			}
			if i%perKill == 0 {
				if d := rs.gate.decide("peer kill", supervision.FaultPeerKill); !d.None() {
					pn.kill(rs, e, nodes[d.Arg%uint64(len(nodes))])
				}
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

// kill cuts n off from its peers (every proxy of its refuses: they see
// their links reset, never a Bye), closes it, and restarts it on a fresh
// pool with the same node id. Its engines wait (n.life) and then drop what
// they had in flight on the dead incarnation.
func (pn *peerNet) kill(rs *runState, e *env, n *nodeUnderTest) {
	n.life.Lock()
	defer n.life.Unlock()
	links := pn.links(n.name)
	for _, p := range links {
		p.block(true)
	}
	ctx, cancel := context.WithTimeout(context.Background(), peerCloseTimeout)
	ps, err := n.node.PeerStats(ctx)
	if err != nil {
		rs.note("%s: peer stats at its kill: %v", n.name, err)
	}
	n.tallyPeers(ps)
	if err := n.node.Close(ctx); err != nil {
		rs.note("%s: close at its kill: %v", n.name, err)
	}
	cancel()
	_ = n.pub.stop() // NB: the node closed its publisher: the subscriber ends with EOF
	n.inj.Close()
	ctx, cancel = context.WithTimeout(context.Background(), peerUpTimeout)
	defer cancel()
	if err := pn.openNode(ctx, rs, e, n); err != nil {
		n.down.Store(true) // its engines stop: the closed node's pool is gone
		rs.violate(n, invPeersBack, "restart after a kill: %v", err)
		return
	}
	pn.route(n)
	for _, p := range links {
		p.block(false)
	}
	n.kills.Add(1)
	n.gen.Add(1)
}

// close stops every proxy.
func (pn *peerNet) close() {
	for _, p := range pn.data {
		p.close()
	}
	for _, p := range pn.ctl {
		p.close()
	}
}

// links are the proxies of every connection into or out of node.
func (pn *peerNet) links(node string) []*proxy {
	out := []*proxy{pn.data[node]}
	for k, p := range pn.ctl {
		if k[0] == node || k[1] == node {
			out = append(out, p)
		}
	}
	return out
}

// tweak is node's peer configuration: its control plane on loopback, its
// static peers behind their proxies, a tcp data plane behind node's data
// proxy, wrapped in the run's data-plane faults.
func (pn *peerNet) tweak(rs *runState, node, dataListen string, tr **faulty.Transport) (func(*kvtier.Config), error) {
	t, err := tcp.New(tcp.Config{Node: node, Listen: dataListen, Advertise: pn.data[node].Addr(),
		WriteTimeout: peerWriteTimeout, Log: rsLog(rs)})
	if err != nil {
		return nil, err
	}
	g := rs.gate
	ft := faulty.Wrap(t, func(kind string, _ int) faulty.Fault {
		switch kind {
		case "expect":
			if !g.decide("peer "+node+" expect-bits", supervision.FaultPeerCorrupt).None() {
				return faulty.Flip
			}
		case "write":
			if !g.decide("peer "+node+" write", supervision.FaultPeerStall).None() {
				return faulty.Stall
			}
		}
		return faulty.None
	})
	ft.SetStallFor(peerStallFor)
	*tr = ft
	var static []kvtier.PeerAddr
	for _, o := range pn.names {
		if o != node {
			static = append(static, kvtier.PeerAddr{NodeID: o, Addr: "tcp://" + pn.ctl[[2]string{node, o}].Addr()})
		}
	}
	return func(c *kvtier.Config) {
		c.Peers = kvtier.PeersConfig{NodeID: node, Listen: "tcp://127.0.0.1:0", Secret: peerSecret, Static: static,
			TransportImpl: ft, LeaseTTL: peerLeaseTTL, LookupTimeout: peerLookup, FetchTimeout: peerFetch,
			HoldTimeout: peerHold, HeartbeatInterval: peerHeartbeat}
	}, nil
}

// freeAddr picks a loopback port for a data-plane listener (the proxy in
// front of it must know where to forward before the node opens).
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// hostPort strips a ZeroMQ address's scheme.
func hostPort(zmqAddr string) string { return strings.TrimPrefix(zmqAddr, "tcp://") }

// rsLog is the run's logger for components that take a value.
func rsLog(rs *runState) zerolog.Logger {
	if rs.opts.Log != nil {
		return *rs.opts.Log
	}
	return zerolog.Nop()
}

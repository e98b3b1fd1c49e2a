package peer

// Discovered peers (MemberUp, MemberDown; plane.go): the plane keeps which
// members it dials, and tells their sessions where to dial, or to stop.

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvtier/kvtier/peer/wire"
)

// Messages the plane sends a session for discovery.
type (
	// dialAddr: dial the peer at addr from now on.
	dialAddr struct{ addr string }
	// undial: stop dialing the peer; it left.
	undial struct{}
	// sessionRestarted: the plane's supervisor restarted a session.
	sessionRestarted struct{ pid *actor.PID }
)

func (p *Plane) memberUp(ctx actor.Context, m *MemberUp) {
	switch {
	case m.Node == p.cfg.Node || !validNode(m.Node) || m.Addr == "" || p.shutdown != nil:
		return
	case p.static[m.Node] != "":
		if !p.cfg.staticEvents(m.Node) {
			p.eventsAt(ctx, m.Node, m.Events, m.EventsReplay)
		}
		return // NB: a configured address (and event address) wins over a discovered one
	case !p.cfg.allowed(m.Node):
		p.cfg.Log.Warn().Str("peer", m.Node).Str("addr", m.Addr).Msg("peer: discovered member not on the allow-list; not dialed")
		return
	}
	p.members[m.Node] = m.Addr
	p.eventsAt(ctx, m.Node, m.Events, m.EventsReplay)
	if pid := p.sessions[m.Node]; pid != nil {
		ctx.Send(pid, &dialAddr{addr: m.Addr}) // it dialed us first, or moved
		return
	}
	p.dialMember(ctx, m.Node)
}

// eventsAt tells the P2P tier where node publishes its KV events, when
// that is known.
func (p *Plane) eventsAt(ctx actor.Context, node, endpoint, replay string) {
	if endpoint == "" || p.cfg.Tier == nil {
		return
	}
	ctx.Send(p.cfg.Tier, &EventsAt{Node: node, Endpoint: endpoint, Replay: replay})
}

// dialMember spawns the session that dials a member.
func (p *Plane) dialMember(ctx actor.Context, node string) {
	if len(p.sessions) >= p.cfg.MaxSessions {
		p.cfg.Log.Warn().Str("peer", node).Int("max_sessions", p.cfg.MaxSessions).Msg("peer: discovered member not dialed: too many sessions")
		return
	}
	pid := p.spawn(ctx, node, p.members[node])
	if pid == nil {
		p.unspawned[node] = true // its old session still holds the name: again at its Terminated
		return
	}
	delete(p.unspawned, node)
	p.publish(node, pid)
}

// spawnUnspawned retries the members whose session could not be spawned,
// once a session stopped (and freed its name).
func (p *Plane) spawnUnspawned(ctx actor.Context) {
	for node := range p.unspawned {
		delete(p.unspawned, node)
		if _, member := p.members[node]; member && p.sessions[node] == nil && p.shutdown == nil {
			p.dialMember(ctx, node)
		}
	}
}

func (p *Plane) memberDown(ctx actor.Context, m *MemberDown) {
	if _, member := p.members[m.Node]; !member {
		return
	}
	delete(p.members, m.Node)
	delete(p.unspawned, m.Node)
	if pid := p.sessions[m.Node]; pid != nil && p.shutdown == nil {
		ctx.Send(pid, &undial{})
	}
	p.cfg.Log.Info().Str("peer", m.Node).Msg("peer: discovered member left; no longer dialed")
}

// redial tells a restarted member's session where to dial: a restarted
// session knows only the address it was spawned with (none, when the
// member dialed us first).
func (p *Plane) redial(ctx actor.Context, pid *actor.PID) {
	for node, addr := range p.members {
		if p.sessions[node].Equal(pid) {
			ctx.Send(pid, &dialAddr{addr: addr})
			return
		}
	}
}

// sessionSupervisor is the plane's strategy for its sessions: protoactor's
// default, and a sessionRestarted to the plane after each decision (a
// stopped session's is a dead letter).
type sessionSupervisor struct{}

// HandleFailure implements actor.SupervisorStrategy.
func (sessionSupervisor) HandleFailure(sys *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason, msg any) {
	actor.DefaultSupervisorStrategy().HandleFailure(sys, sup, child, rs, reason, msg)
	if plane, ok := sup.(interface{ Self() *actor.PID }); ok {
		sys.Root.Send(plane.Self(), &sessionRestarted{pid: child})
	}
}

// redirect makes the session dial addr: at once when it dialed nowhere
// (the member dialed us first) or elsewhere (it restarted on another
// address; the old link and its rounds end).
func (s *Session) redirect(ctx actor.Context, addr string) {
	s.unlisted = false // listed again
	if addr == s.addr || s.drain != nil || s.stopped {
		return
	}
	moved := s.addr != ""
	s.addr = addr
	if moved {
		s.resetOut(ctx, "address_changed")
	}
	s.out.backoff = 0
	s.dial(ctx)
}

// forget stops dialing the peer, which left discovery. A peer whose
// session is ready is asked first (a Ping, answered within a heartbeat
// interval): one that answers is alive and only cut off from etcd — or
// etcd from it — so it is kept until its session fails (unlisted); one
// that does not is let go at once.
func (s *Session) forget(ctx actor.Context) {
	if s.addr == "" || s.stopped {
		return
	}
	if s.out.phase == outReady && s.cfg.HeartbeatInterval > 0 {
		s.unlisted = true
		seq := s.out.nextProbe()
		s.sendOut(&wire.Ping{Epoch: s.out.epoch, Seq: seq})
		self, root, gen := ctx.Self(), ctx.ActorSystem().Root, s.out.gen
		s.cfg.Clock.AfterFunc(s.cfg.HeartbeatInterval, func() { root.Send(self, &probeTimer{gen: gen, seq: seq}) })
		return
	}
	s.letGo(ctx)
}

// probeSeqBit marks the seq of a liveness probe's Ping (and its Pong).
const probeSeqBit = 1 << 63

// probeTimer: a liveness probe's answer is due.
type probeTimer struct{ gen, seq uint64 }

// onProbeTimer keeps an unlisted peer that answered its probe, and lets
// go of one that did not.
func (s *Session) onProbeTimer(ctx actor.Context, m *probeTimer) {
	if !s.unlisted || m.gen != s.out.gen {
		return // listed again, or its session already failed
	}
	if s.out.probeAnswered(m.seq) {
		s.log.Info().Msg("peer: left discovery but answers; kept until its session fails")
		return
	}
	s.unlisted = false
	s.letGo(ctx)
}

// letGo stops dialing the peer: outbound rounds fail, the P2P tier hears
// Down, the link closes and no redial is armed.
func (s *Session) letGo(ctx actor.Context) {
	s.addr = ""
	s.resetOut(ctx, "member_left")
	if s.out.timer != nil {
		s.out.timer.Stop()
	}
	s.releaseIfIdle(ctx)
}

// releaseIfIdle asks the plane to stop this session once it dials no one
// and serves no one: the inbound side lasts as long as the peer's own
// session to us.
func (s *Session) releaseIfIdle(ctx actor.Context) {
	if s.gate.idle() && len(s.rounds.rounds) == 0 && s.drain == nil {
		ctx.Send(ctx.Parent(), &sessionIdle{node: s.node, pid: ctx.Self()})
		return
	}
	s.armIdleCheck(ctx)
}

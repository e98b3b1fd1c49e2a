package peer

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/actors/fx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer/peermsg"
	"github.com/kvtier/kvtier/peer/wire"
	"github.com/kvtier/kvtier/rdma"
	"github.com/kvtier/kvtier/supervision"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
)

// Session is the actor for one remote peer. It runs both directions:
//
//   - outbound (we consume): our DEALER link, the handshake we start
//     (Hello → Welcome → Auth → Ready), and the rounds the P2P tier asks
//     for (Lookup → LookupResp → Fetch → data plane → verified);
//   - inbound (we produce): the handshake the peer starts on our ROUTER,
//     and its rounds, served from the CPU tier the moment they arrive:
//     hits are leased to the round, pinned for the Fetch, written by the
//     transport, then unpinned.
//
// Invariants:
//   - a round number is used once in the session's life (across epochs);
//     a frame of another epoch, or for an unknown or finished round, is
//     dropped and counted: late and duplicate frames are harmless;
//   - every peermsg.Lookup and peermsg.Fetch is answered exactly once; a fetch is
//     answered only after the transport's Expect completed, so the P2P tier
//     frees or commits slots nobody writes any more;
//   - every lease, pin and write a peer's round holds in the CPU tier is
//     released exactly once: at its Fetch's end, its Abort, the inbound
//     session's end, or (leases only) their TTL;
//   - timers are armed only while something can expire (a handshake, a
//     redial, a round, a heartbeat of a ready session); each timer message
//     carries the generation it was armed for and is ignored when stale.
type Session struct {
	cfg    *Config
	ctr    *Counters
	pc     *peerCounters
	node   string // the remote peer
	addr   string // its ROUTER; "" when it only dials us
	sendIn func(frame, seal []byte) bool
	log    zerolog.Logger

	out     outbound
	gate    gate      // the inbound session and its handshake (gate.go)
	rounds  *consumer // the rounds we started on the peer
	corr    uint64
	pending map[uint64]cpuCall
	drain   *draining
	idleSeq uint64
	stopped bool // cleanup ran: arm nothing more
	// unlisted: the peer left discovery while its outbound session was
	// ready and answering (etcd may be what it cannot reach); the session
	// is kept until it fails, and not redialed then (members.go).
	unlisted bool
}

// draining is a peermsg.Shutdown reaching this session: no new rounds; the
// ones in flight finish until the deadline, then are aborted.
type draining struct {
	plane   *actor.PID
	timer   supervision.Timer
	aborted int
	done    bool
}

type drainDeadline struct{}

// idleCheck: an inbound-only session (a peer we do not dial) that has no
// authenticated session by then asks the plane to stop it, so strangers'
// Hellos cannot pin actors forever.
type idleCheck struct{ seq uint64 }

// sessionIdle tells the plane a session has nothing left to do.
type sessionIdle struct {
	node string
	pid  *actor.PID
}

// Messages a session sends itself.
type (
	inboundFrame struct {
		frame wire.Frame
		err   error
		raw   []byte // the frame as received, for its seal
		seal  []byte // the message's seal part; nil when it came unsealed
	}
	outTimer   struct{ gen uint64 }
	hbTimer    struct{ gen uint64 }
	roundTimer struct{ round, seq uint64 }
	// arrived: the transport's Expect completed. It carries its asker so
	// that even a restarted session answers the P2P tier.
	arrived struct {
		round uint64
		chunk int
		last  bool // the fetch's last chunk to complete
		corr  uint64
		asker fx.Ref
		c     rdma.Completion
	}
	verified struct {
		round uint64
		chunk int
		ok    []bool
	}
	// written: the transport's Write completed; it carries what to unpin
	// so that any incarnation of the session releases it.
	written struct {
		epoch  uint64
		round  uint64
		job    messages.JobRef
		holder messages.Holder
		keys   []messages.Key
		c      rdma.Completion
	}
)

func sessionProps(cfg *Config, ctr *Counters, node, addr string, sendIn func(frame, seal []byte) bool) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		pc := ctr.peer(node)
		return &Session{cfg: cfg, ctr: ctr, pc: pc, node: node, addr: addr, sendIn: sendIn,
			log: cfg.Log.With().Str("peer", node).Logger(), rounds: newConsumer(cfg, node, pc), pending: map[uint64]cpuCall{}}
	}, actor.WithReceiverMiddleware(supervision.Faults))
}

// Receive handles the session's messages.
func (s *Session) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		if s.addr != "" {
			s.dial(ctx)
		}
	case *linkUp:
		s.onLinkUp(m)
	case *linkDown:
		if m.gen == s.out.gen && s.out.phase != outIdle {
			s.resetOut(ctx, "link_lost")
		}
	case *outTimer:
		s.onOutTimer(ctx, m)
	case *hbTimer:
		s.onHeartbeat(ctx, m)
	case *probeTimer:
		s.onProbeTimer(ctx, m)
	case *outboundFrame:
		s.onOutboundFrame(ctx, m)
	case *inboundFrame:
		s.onInboundFrame(ctx, m)
	case *peermsg.Lookup:
		s.carryOut(ctx, s.rounds.lookup(m, fx.RefOf(ctx.Sender()), s.linkNow()))
	case *peermsg.Fetch:
		s.fetch(ctx, m)
	case *peermsg.Release:
		s.carryOut(ctx, s.rounds.release(m, s.linkNow()))
	case *roundTimer:
		s.carryOut(ctx, s.rounds.deadline(m, s.linkNow()))
	case *arrived:
		s.carryOut(ctx, s.rounds.arrived(m))
	case *verified:
		s.carryOut(ctx, s.rounds.verified(m))
	case *cpumsg.LookupResult:
		s.onLeased(ctx, m)
	case *cpumsg.PinResult:
		s.onPinned(ctx, m)
	case *written:
		s.onWritten(ctx, m)
	case *messages.Ack:
		// Unpin / release answers: nothing to do.
	case *inboundGone:
		// NB: a reconnecting peer closes its old connection before it dials
		// the new one (after its backoff), so this is the old session's end.
		s.retire(ctx, s.gate.closed(), "connection_closed")
	case *dialAddr:
		s.redirect(ctx, m.addr) // members.go
	case *undial:
		s.forget(ctx)
	case *drain:
		s.beginDrain(ctx, m)
	case *drainDeadline:
		s.forceDrain(ctx)
	case *idleCheck:
		if m.seq == s.idleSeq && s.addr == "" && s.gate.in == nil && len(s.rounds.rounds) == 0 {
			ctx.Send(ctx.Parent(), &sessionIdle{node: s.node, pid: ctx.Self()})
		}
	case *actor.Restarting, *actor.Stopping:
		s.cleanup(ctx)
		return
	case *actor.Stopped, *actor.Restart:
	default:
		s.log.Warn().Str("type", fmt.Sprintf("%T", m)).Msg("peer: session dropped an unknown message")
	}
	if s.drain != nil && !s.drain.done {
		s.checkDrained(ctx)
	}
}

// --- outbound: handshake --------------------------------------------------

// dial opens a fresh link under a new epoch and starts the handshake clock.
func (s *Session) dial(ctx actor.Context) {
	epoch := wire.NewEpoch()
	gen := s.out.begin(epoch, &wire.Hello{Version: wire.Version, Node: s.cfg.Node, Epoch: epoch, Nonce: wire.NewNonce(),
		Namespaces: s.cfg.Namespaces, BlockBytes: s.cfg.BlockBytes, Slots: s.cfg.Slots,
		Transport: s.cfg.Transport.Kind(), DataMeta: s.cfg.Transport.Metadata()})
	self, root := ctx.Self(), ctx.ActorSystem().Root
	s.out.link = openLink(s.cfg, s.ctr, s.addr, gen, func(m any) { root.Send(self, m) })
	s.armOut(ctx, s.cfg.HandshakeTimeout)
}

func (s *Session) armOut(ctx actor.Context, d time.Duration) {
	if s.out.timer != nil {
		s.out.timer.Stop()
	}
	self, root, gen := ctx.Self(), ctx.ActorSystem().Root, s.out.gen
	s.out.timer = s.cfg.Clock.AfterFunc(d, func() { root.Send(self, &outTimer{gen: gen}) })
}

func (s *Session) onLinkUp(m *linkUp) {
	if s.out.linkUp(m.gen) {
		s.sendOut(s.out.hello)
	}
}

func (s *Session) onOutTimer(ctx actor.Context, m *outTimer) {
	switch s.out.timerFired(m.gen) {
	case outTimerDial:
		s.dial(ctx)
	case outTimerHandshakeTimeout:
		s.resetOut(ctx, "handshake_timeout")
	}
}

func (s *Session) onWelcome(ctx actor.Context, w *wire.Welcome) {
	if s.out.phase != outHello {
		s.ctr.drop("unexpected_welcome")
		return
	}
	want := wire.ServerMAC(s.cfg.Secret, s.out.hello, w)
	switch {
	case !wire.CheckMAC(want, w.MAC):
		s.refusedOut(ctx, wire.RefuseAuth, "peer failed to prove the shared secret")
	case w.Node != s.node:
		s.refusedOut(ctx, wire.RefuseAuth, fmt.Sprintf("answered as %q", w.Node))
	default:
		if reason, msg := compatible(s.cfg, w.Namespaces, w.Transport); reason != "" {
			s.refusedOut(ctx, reason, msg)
			return
		}
		s.out.welcomed()
		s.out.peerBlock = w.BlockBytes
		s.sendOut(&wire.Auth{Epoch: s.out.epoch, MAC: wire.ClientMAC(s.cfg.Secret, s.out.hello, w)})
		dialer, listener := wire.SessionKeys(s.cfg.Secret, s.out.hello, w)
		s.out.seal, s.out.open = wire.NewSealer(dialer), wire.NewOpener(listener)
		s.connect(w.DataMeta)
	}
}

func (s *Session) onReady(ctx actor.Context) {
	if !s.out.ready() {
		s.ctr.drop("unexpected_ready")
		return
	}
	s.out.timer.Stop()
	s.pc.ready.Store(true)
	ctx.Send(s.cfg.Tier, &Up{Node: s.node, Session: ctx.Self(), Epoch: s.out.epoch})
	s.log.Info().Uint64("epoch", s.out.epoch).Msg("peer: session ready")
}

// refusedOut ends our handshake: counted, logged, retried after backoff.
func (s *Session) refusedOut(ctx actor.Context, reason, msg string) {
	s.ctr.refuse(reason)
	s.log.Warn().Str("reason", reason).Str("detail", msg).Msg("peer: handshake refused")
	s.resetOut(ctx, "refused_"+reason)
}

// connect hands the peer's data-plane metadata to the transport, once per
// distinct value (both directions of a session carry the same).
func (s *Session) connect(meta []byte) {
	if s.out.meta != nil && bytes.Equal(s.out.meta, meta) {
		return
	}
	if err := s.cfg.Transport.Connect(s.node, meta); err != nil {
		s.log.Warn().Err(err).Msg("peer: data plane connect failed")
		return
	}
	s.out.meta = append([]byte(nil), meta...)
}

// resetOut ends the outbound session: rounds fail (a fetch in flight once
// its transfer is canceled), the link closes, a redial is scheduled.
func (s *Session) resetOut(ctx actor.Context, reason string) {
	if s.out.phase == outReady {
		s.pc.ready.Store(false)
		s.pc.resets.Add(1)
		ctx.Send(s.cfg.Tier, &Down{Node: s.node, Session: ctx.Self(), Epoch: s.out.epoch, Reason: reason})
		s.log.Warn().Str("reason", reason).Msg("peer: session lost")
	}
	if s.out.hb != nil {
		s.out.hb.Stop()
	}
	s.carryOut(ctx, s.rounds.failAll(fmt.Errorf("%w: %s", messages.ErrPeerUnavailable, reason)))
	if s.out.link != nil {
		l := s.out.link
		s.out.link = nil
		go l.close() // NB: waits for zmq4's goroutines; never in the mailbox
	}
	redial := !s.unlisted && s.addr != "" && s.drain == nil
	_, wait := s.out.lost(redial, s.cfg.RetryMin, s.cfg.RetryMax)
	if s.unlisted { // it left discovery, and now its session failed too
		s.unlisted = false
		s.addr = ""
		s.releaseIfIdle(ctx)
		return
	}
	if redial {
		s.armOut(ctx, wait)
	}
}

// armHeartbeat arms the liveness ping, only while a round of ours is in
// flight: an idle session makes no wakeups (a dead idle peer is found by
// its connection closing, or by the next round's deadline), and a busy one
// learns of a hung peer before a long fetch's deadline.
func (s *Session) armHeartbeat(ctx actor.Context) {
	if s.cfg.HeartbeatInterval <= 0 || !s.out.armHeartbeat() {
		return
	}
	self, root, gen := ctx.Self(), ctx.ActorSystem().Root, s.out.gen
	s.out.hb = s.cfg.Clock.AfterFunc(s.cfg.HeartbeatInterval, func() { root.Send(self, &hbTimer{gen: gen}) })
}

func (s *Session) onHeartbeat(ctx actor.Context, m *hbTimer) {
	switch step := s.out.heartbeat(m.gen, s.rounds.waitingOnPeer()); {
	case step.dead:
		s.resetOut(ctx, "heartbeat")
	case step.ping != 0:
		s.sendOut(&wire.Ping{Epoch: s.out.epoch, Seq: step.ping})
		s.armHeartbeat(ctx)
	}
}

// --- outbound: frames -------------------------------------------------------

func (s *Session) onOutboundFrame(ctx actor.Context, m *outboundFrame) {
	if m.gen != s.out.gen {
		return // a link we already replaced
	}
	if m.err != nil {
		s.ctr.drop(wire.Reason(m.err))
		return
	}
	if e, ok := frameEpoch(m.frame); !ok || e != s.out.epoch {
		s.ctr.drop("stale_epoch")
		return
	}
	if !s.openOut(m) {
		return
	}
	switch f := m.frame.(type) {
	case *wire.Welcome:
		s.onWelcome(ctx, f)
	case *wire.Ready:
		s.onReady(ctx)
	case *wire.Refuse:
		s.refusedOut(ctx, "by_peer_"+f.Reason, f.Msg)
	case *wire.LookupResp:
		s.carryOut(ctx, s.rounds.lookupResp(f))
	case *wire.TransferDone:
		s.carryOut(ctx, s.rounds.transferDone(f))
	case *wire.AbortAck:
		// Nothing held: the round was forgotten when we sent the Abort.
	case *wire.Pong:
		s.out.pong(f.Seq)
	case *wire.Bye:
		s.resetOut(ctx, "bye")
	default:
		s.ctr.drop("unexpected_frame")
	}
}

// sendOut sends a frame on our link: sealed once the handshake derived
// the session's keys (all but Hello and Auth).
func (s *Session) sendOut(f wire.Frame) {
	if s.out.link == nil {
		return
	}
	b, err := wire.Encode(f)
	if err != nil {
		s.log.Error().Err(err).Msg("peer: encode") // a bug: our own frames are in bounds
		return
	}
	var seal []byte
	if _, auth := f.(*wire.Auth); s.out.seal != nil && !auth {
		seal = s.out.seal.Seal(b)
	}
	s.out.link.send(b, seal)
}

// openOut checks the seal of a frame on our link: every frame once the
// session's keys are derived, but a Refuse before Ready (the peer may
// refuse our Auth: it has no keys then). A frame that fails is dropped and
// counted.
func (s *Session) openOut(m *outboundFrame) bool {
	if s.out.open == nil {
		return true
	}
	if _, refuse := m.frame.(*wire.Refuse); refuse && m.seal == nil && s.out.phase != outReady {
		return true
	}
	if err := s.out.open.Open(m.raw, m.seal); err != nil {
		s.ctr.drop(wire.SealReason(err))
		return false
	}
	return true
}

// --- outbound: rounds (we are the consumer; consumer.go decides) -----------

// carryOut does what a consumer decision asks, in its order.
func (s *Session) carryOut(ctx actor.Context, o consumed) {
	for _, reason := range o.drops {
		s.ctr.drop(reason)
	}
	for _, a := range o.answers {
		if !a.to.IsZero() {
			ctx.Send(a.to.PID(), a.msg)
		}
	}
	for _, f := range o.frames {
		s.sendOut(f)
	}
	for _, tok := range o.cancel {
		s.cfg.Transport.Cancel(tok)
	}
	for _, v := range o.verify {
		s.verifyChunk(ctx, v)
	}
	for _, r := range o.arm {
		s.armRound(ctx, r)
	}
	if o.heartbeat {
		s.armHeartbeat(ctx)
	}
	if o.corrupt > 0 {
		s.log.Warn().Int("blocks", o.corrupt).Msg("peer: fetched blocks failed their checksum; dropped")
	}
	if o.reset != "" {
		s.resetOut(ctx, o.reset)
	}
}

// linkNow is the outbound session as the consumer's decisions see it.
func (s *Session) linkNow() linkNow {
	return linkNow{epoch: s.out.epoch, ready: s.out.phase == outReady, draining: s.drain != nil, peerBlock: s.out.peerBlock}
}

// armRound (re)arms a round's deadline, unless the round already ended.
func (s *Session) armRound(ctx actor.Context, r *outRound) {
	if s.rounds.rounds[r.n] != r {
		return
	}
	if r.timer != nil {
		r.timer.Stop()
	}
	self, root, msg := ctx.Self(), ctx.ActorSystem().Root, &roundTimer{round: r.n, seq: r.tseq}
	r.timer = s.cfg.Clock.AfterFunc(r.wait, func() { root.Send(self, msg) })
}

// fetch starts the data-plane transfer of leased hits into reserved slots.
func (s *Session) fetch(ctx actor.Context, m *peermsg.Fetch) {
	r, f, o := s.rounds.startFetch(m, fx.RefOf(ctx.Sender()), s.linkNow())
	if r == nil {
		s.carryOut(ctx, o)
		return
	}
	announced, err := s.expectChunks(ctx, r.n, m.Corr, f)
	s.carryOut(ctx, s.rounds.fetching(r, f, m, fx.RefOf(ctx.Sender()), announced, err))
}

// expectChunks announces the chunks of f to the transport, in order, until
// one is refused: it returns how many were announced and the refusal. The
// last announced chunk's completion reports itself as the fetch's last.
func (s *Session) expectChunks(ctx actor.Context, round, corr uint64, f *outFetch) (int, error) {
	self, root, asker := ctx.Self(), ctx.ActorSystem().Root, fx.RefOf(ctx.Sender())
	last := newLastOf(f.chunks)
	for i := range f.chunks {
		lo, hi := f.plan.span(i)
		err := s.cfg.Transport.Expect(s.node, chunkToken(f.token, i), f.slots[lo:hi], f.sizes[lo:hi], func(c rdma.Completion) {
			isLast, _ := last.done(nil)
			root.Send(self, &arrived{round: round, chunk: i, last: isLast, corr: corr, asker: asker, c: c})
		})
		if err != nil {
			last.skip(f.chunks-i, nil) // never announced: not waited for
			return i, err
		}
	}
	return f.chunks, nil
}

// verifyChunk checks a fetched chunk's slots against the producer's
// committed CRC32C off the mailbox.
func (s *Session) verifyChunk(ctx actor.Context, v verifyChunk) {
	self, root, region := ctx.Self(), ctx.ActorSystem().Root, s.cfg.Region
	s.cfg.Offload.Go(func() {
		root.Send(self, &verified{round: v.round, chunk: v.chunk, ok: verify(region, v.slots, v.sizes, v.sums)})
	})
}

// verify checks each fetched block — sizes[i] bytes at the start of
// slots[i] — against the producer's committed CRC32C (off the mailbox),
// spread over every CPU: it sits between the last byte arriving and the
// blocks becoming readable.
func verify(region rdma.Region, slots, sizes []int, sums []uint32) []bool {
	ok := make([]bool, len(slots))
	workers := min(runtime.GOMAXPROCS(0), max(1, len(slots)/8))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(slots); i += workers {
				ok[i] = crc32.Checksum(region.Block(slots[i], sizes[i]), castagnoli) == sums[i]
			}
		}()
	}
	wg.Wait()
	return ok
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// --- inbound: handshake -----------------------------------------------------

func (s *Session) onInboundFrame(ctx actor.Context, m *inboundFrame) {
	if h, ok := m.frame.(*wire.Hello); ok {
		s.onHello(ctx, h, m.err)
		return
	}
	if !s.admit(ctx, s.gate.frame(m.frame, m.err, m.raw, m.seal, s.cfg.Secret, s.cfg.MaxMalformed)) {
		return
	}
	in := s.gate.in
	switch f := m.frame.(type) {
	case *wire.Lookup:
		s.carry(ctx, in.lookup(f, s.drain != nil))
	case *wire.Fetch:
		s.carry(ctx, in.fetch(f, messages.JobRef{Origin: messages.OriginPeer, ID: messages.JobID(s.cfg.JobSeq.Add(1))}))
	case *wire.Abort:
		s.carry(ctx, in.abort(f))
	case *wire.Ping:
		s.sendInbound(&wire.Pong{Epoch: f.Epoch, Seq: f.Seq})
	case *wire.Bye:
		s.dropIn(ctx, "bye")
	default:
		s.ctr.drop("unexpected_frame")
	}
}

// admit carries out the gate's decision on a frame (gate.go) and reports
// whether the frame is the producer's to serve.
func (s *Session) admit(ctx actor.Context, v admitted) bool {
	if v.drop != "" {
		s.ctr.drop(v.drop)
	}
	if v.refuse != nil {
		s.ctr.refuse(v.refuse.Reason)
		s.log.Warn().Str("reason", v.refuse.Reason).Str("detail", v.refuse.Msg).Msg("peer: refused a handshake")
		s.sendInbound(v.refuse)
	}
	if v.why == endMalformed {
		s.log.Warn().Int("max_malformed", s.cfg.MaxMalformed).Msg("peer: too many malformed frames; inbound session dropped")
	}
	s.retire(ctx, v.ended, v.why)
	if hs := v.ready; hs != nil {
		s.pc.serving.Store(true)
		s.connect(hs.hello.DataMeta)
		s.sendInbound(&wire.Ready{Epoch: hs.epoch})
	}
	return v.serve
}

func (s *Session) onHello(ctx actor.Context, h *wire.Hello, decodeErr error) {
	switch v := admitHello(s.cfg, s.node, s.drain != nil, h, decodeErr); {
	case v.drop != "":
		s.admit(ctx, admitted{drop: v.drop})
		return
	case v.refuse != "":
		s.admit(ctx, admitted{refuse: &wire.Refuse{Epoch: h.Epoch, Reason: v.refuse, Msg: v.msg}})
		return
	}
	w := &wire.Welcome{Version: wire.Version, Node: s.cfg.Node, Epoch: h.Epoch, Nonce: wire.NewNonce(),
		Namespaces: s.cfg.Namespaces, BlockBytes: s.cfg.BlockBytes, Slots: s.cfg.Slots,
		Transport: s.cfg.Transport.Kind(), DataMeta: s.cfg.Transport.Metadata()}
	w.MAC = wire.ServerMAC(s.cfg.Secret, h, w)
	// NB: the current session (if any) keeps serving until this handshake
	// proves the secret: a Hello alone, which anyone can send under the
	// peer's identity, never ends it.
	// NB: a monotonic clock: a stepped wall clock must not stretch a Fetch past its ttl.
	s.gate.welcomed(newInbound(s.node, h, w, s.cfg.Namespaces, s.cfg.LeaseTTL, supervision.Steady(s.cfg.Clock), s.cfg))
	s.sendInbound(w)
	s.armIdleCheck(ctx)
}

// armIdleCheck arms the check that stops an inbound-only session left
// without an authenticated peer.
func (s *Session) armIdleCheck(ctx actor.Context) {
	if s.addr != "" || s.stopped {
		return
	}
	s.idleSeq++
	self, root, msg := ctx.Self(), ctx.ActorSystem().Root, &idleCheck{seq: s.idleSeq}
	s.cfg.Clock.AfterFunc(s.cfg.HandshakeTimeout, func() { root.Send(self, msg) })
}

// dropIn ends the ready inbound session, if any.
func (s *Session) dropIn(ctx actor.Context, reason string) {
	s.retire(ctx, s.gate.end(), reason)
}

// retire releases what an ended inbound session's rounds hold: leases
// now, pins of writes in flight when the transport is done with them.
func (s *Session) retire(ctx actor.Context, in *inbound, reason string) {
	if in == nil {
		return
	}
	s.carry(ctx, in.close())
	s.log.Info().Str("reason", reason).Uint64("epoch", in.epoch).Msg("peer: inbound session ended")
	if s.gate.in == nil {
		s.pc.serving.Store(false)
		s.armIdleCheck(ctx)
	}
}

func (s *Session) sendInbound(f wire.Frame) {
	b, err := wire.Encode(f)
	if resp, ok := f.(*wire.LookupResp); ok && err != nil && resp.Prov != nil {
		// NB: provenance is a courtesy; an answer too big with it goes without.
		resp.Prov = nil
		b, err = wire.Encode(resp)
	}
	if err != nil {
		s.log.Error().Err(err).Msg("peer: encode")
		return
	}
	var seal []byte
	switch f.(type) {
	case *wire.Welcome, *wire.Refuse:
	default:
		if s.gate.in != nil {
			seal = s.gate.in.seal.Seal(b)
		}
	}
	s.sendIn(b, seal)
}

// --- inbound: rounds (we are the producer; producer.go decides) ------------

// carry does what a producer decision asks, in its order.
func (s *Session) carry(ctx actor.Context, o served) {
	for _, reason := range o.drops {
		s.ctr.drop(reason)
	}
	for _, m := range o.cpu {
		if m.call != nil {
			s.corr++
			s.pending[s.corr] = *m.call
			setCorr(m.msg, s.corr)
		}
		ctx.Request(s.cfg.CPU, m.msg)
	}
	for _, f := range o.frames {
		s.sendInbound(f)
	}
	if w := o.write; w != nil {
		s.writeChunks(ctx, w.round, &w.done, w.src)
	}
}

func setCorr(msg any, corr uint64) {
	switch m := msg.(type) {
	case *cpumsg.LookupAndLease:
		m.Corr = corr
	case *cpumsg.LeaseToPin:
		m.Corr = corr
	default:
		panic(fmt.Sprintf("peer: %T is not a request to the CPU tier", msg))
	}
}

// onLeased: the CPU tier leased (or not) a Lookup's keys.
func (s *Session) onLeased(ctx actor.Context, m *cpumsg.LookupResult) {
	call, ok := s.pending[m.Corr]
	delete(s.pending, m.Corr)
	if !ok {
		// Asked by a previous incarnation (a restart): nobody will fetch.
		if m.Holder.Origin == messages.OriginPeer {
			ctx.Send(s.cfg.CPU, &cpumsg.ReleaseHolder{Holder: m.Holder})
		}
		return
	}
	s.carry(ctx, s.gate.in.leased(call, m, s.drain != nil))
}

// onPinned: the CPU tier pinned (or not) a Fetch's leased keys.
func (s *Session) onPinned(ctx actor.Context, m *cpumsg.PinResult) {
	call, ok := s.pending[m.Corr]
	delete(s.pending, m.Corr)
	if !ok {
		// Asked by a previous incarnation (a restart): nothing will write
		// these pins; they would leak.
		if m.Err == nil && m.Job.Origin == messages.OriginPeer {
			ctx.Request(s.cfg.CPU, &cpumsg.ReleaseJob{Job: m.Job})
		}
		return
	}
	s.carry(ctx, s.gate.in.pinned(call, m))
}

// writeChunks writes the pinned blocks into the consumer's slots, chunk by
// chunk (chunks.go), each at its length; the last completion, whichever
// session incarnation gets it, reports the whole write.
func (s *Session) writeChunks(ctx actor.Context, r *inRound, done *written, src []int) {
	self, root := ctx.Self(), ctx.ActorSystem().Root
	plan := planChunks(r.sizes)
	n := plan.count()
	last := newLastOf(n)
	report := func(err error) {
		w := *done
		w.c = rdma.Completion{Err: err}
		root.Send(self, &w)
	}
	for i := range n {
		lo, hi := plan.span(i)
		err := s.cfg.Transport.Write(s.node, chunkToken(r.token, i), src[lo:hi], r.dest[lo:hi], r.sizes[lo:hi], func(c rdma.Completion) {
			if isLast, first := last.done(c.Err); isLast {
				report(first)
			}
		})
		if err != nil {
			s.log.Warn().Err(err).Msg("peer: data plane write refused")
			if isLast, first := last.skip(n-i, err); isLast {
				report(first)
			}
			return
		}
	}
}

// onWritten: the transport is done with a round's pinned slots.
func (s *Session) onWritten(ctx actor.Context, m *written) {
	if m.c.Err == nil {
		s.pc.served.Add(uint64(len(m.keys)))
	}
	s.carry(ctx, writeDone(s.gate.in, m))
}

// --- both -------------------------------------------------------------------

// cleanup runs when the session stops or restarts: askers are answered,
// producer holds released, the link closed.
func (s *Session) cleanup(ctx actor.Context) {
	s.stopped = true
	s.carryOut(ctx, s.rounds.close())
	if s.out.phase == outReady {
		ctx.Send(s.cfg.Tier, &Down{Node: s.node, Session: ctx.Self(), Epoch: s.out.epoch, Reason: "session_stopped"})
	}
	s.pc.ready.Store(false)
	s.dropIn(ctx, "session_stopped")
	if s.out.timer != nil {
		s.out.timer.Stop()
	}
	if s.out.hb != nil {
		s.out.hb.Stop()
	}
	if s.out.link != nil {
		s.out.link.close()
		s.out.link = nil
	}
}

// helloVerdict is what an inbound Hello gets: dropped (a frame that did
// not decode: counted, not answered), refused (a Refuse with reason and
// msg), or, both empty, a Welcome.
type helloVerdict struct {
	drop        string
	refuse, msg string
}

// admitHello decides an inbound Hello from node (the connection's
// identity), decoded with decodeErr, while the session drains or not.
func admitHello(cfg *Config, node string, draining bool, h *wire.Hello, decodeErr error) helloVerdict {
	switch {
	case draining && decodeErr == nil:
		return helloVerdict{refuse: wire.RefuseShutdown, msg: "the node is stopping"}
	case errors.Is(decodeErr, wire.ErrVersion):
		return helloVerdict{refuse: wire.RefuseVersion, msg: fmt.Sprintf("version %d; this node speaks %d", h.Version, wire.Version)}
	case decodeErr != nil:
		return helloVerdict{drop: wire.Reason(decodeErr)}
	case h.Node != node:
		return helloVerdict{refuse: wire.RefuseAuth, msg: "node id differs from the connection's identity"}
	case !cfg.allowed(h.Node):
		return helloVerdict{refuse: wire.RefuseNotAllow, msg: "not on the allow-list"}
	}
	reason, msg := compatible(cfg, h.Namespaces, h.Transport)
	return helloVerdict{refuse: reason, msg: msg}
}

// compatible checks the other side's half of a handshake against ours. A
// different block_bytes is no reason to refuse (wire.RefuseGeometry is
// what version 2 sent): it is a slot's capacity, a namespace's blocks are
// the same size on every node, and each block's length travels with it,
// checked per block against both sides' slots.
func compatible(cfg *Config, namespaces []string, transport string) (reason, msg string) {
	switch {
	case transport != cfg.Transport.Kind():
		return wire.RefuseTransport, fmt.Sprintf("transport %q, ours %q", transport, cfg.Transport.Kind())
	case len(namespaces) > 0 && len(cfg.Namespaces) > 0 && len(sharedSet(cfg.Namespaces, namespaces)) == 0:
		return wire.RefuseNamespace, "no namespace in common"
	}
	return "", ""
}

// sharedSet is the namespaces both sides serve; nil when either serves any.
func sharedSet(ours, theirs []string) map[string]bool {
	if len(ours) == 0 && len(theirs) == 0 {
		return nil
	}
	if len(ours) == 0 {
		ours, theirs = theirs, ours
	}
	set := map[string]bool{}
	for _, a := range ours {
		if len(theirs) == 0 || contains(theirs, a) {
			set[a] = true
		}
	}
	return set
}

func sharedNamespace(ours []string, ns string) bool {
	return len(ours) == 0 || contains(ours, ns)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// frameEpoch is the epoch a frame carries (Hello has none to check).
func frameEpoch(f wire.Frame) (uint64, bool) {
	switch f := f.(type) {
	case *wire.Welcome:
		return f.Epoch, true
	case *wire.Auth:
		return f.Epoch, true
	case *wire.Ready:
		return f.Epoch, true
	case *wire.Refuse:
		return f.Epoch, true
	case *wire.Lookup:
		return f.Epoch, true
	case *wire.LookupResp:
		return f.Epoch, true
	case *wire.Fetch:
		return f.Epoch, true
	case *wire.TransferDone:
		return f.Epoch, true
	case *wire.Abort:
		return f.Epoch, true
	case *wire.AbortAck:
		return f.Epoch, true
	case *wire.Ping:
		return f.Epoch, true
	case *wire.Pong:
		return f.Epoch, true
	case *wire.Bye:
		return f.Epoch, true
	}
	return 0, false
}

// --- drain (peermsg.Shutdown) ---------------------------------------------------

func (s *Session) beginDrain(ctx actor.Context, m *drain) {
	if s.drain != nil {
		return
	}
	s.drain = &draining{plane: ctx.Sender()}
	s.carryOut(ctx, s.rounds.releaseLeased(s.linkNow())) // no fetch will follow
	if s.gate.in != nil {
		// Rounds the peer leased but has not fetched are not waited for: a
		// consumer that died would hold the drain to its deadline. A Fetch
		// that still comes is refused (unknown round); writes in flight
		// finish.
		s.carry(ctx, s.gate.in.releaseLeased())
	}
	if s.out.phase != outReady && s.out.timer != nil {
		s.out.timer.Stop() // no redial, no handshake to finish
	}
	self, root := ctx.Self(), ctx.ActorSystem().Root
	s.drain.timer = s.cfg.Clock.AfterFunc(m.deadline.Sub(s.cfg.Clock.Now()), func() { root.Send(self, &drainDeadline{}) })
}

// inFlight counts the rounds still running in either direction.
func (s *Session) inFlight() int {
	n := s.rounds.inFlight()
	if s.gate.in != nil {
		n += len(s.gate.in.rounds)
	}
	return n
}

func (s *Session) checkDrained(ctx actor.Context) {
	if s.inFlight() == 0 {
		s.finishDrain(ctx)
	}
}

// forceDrain aborts what is still running at the deadline.
func (s *Session) forceDrain(ctx actor.Context) {
	if s.drain == nil || s.drain.done {
		return
	}
	s.drain.aborted = s.inFlight()
	s.carryOut(ctx, s.rounds.failAll(fmt.Errorf("%w: shutting down", messages.ErrPeerUnavailable)))
	s.finishDrain(ctx)
}

// finishDrain says Bye both ways, releases producer holds (pins of writes
// still running are released when the transport lets go) and answers.
func (s *Session) finishDrain(ctx actor.Context) {
	s.drain.done = true
	s.drain.timer.Stop()
	if s.out.phase == outReady {
		s.sendOut(&wire.Bye{Epoch: s.out.epoch, Reason: "shutdown"})
		s.pc.ready.Store(false)
		ctx.Send(s.cfg.Tier, &Down{Node: s.node, Session: ctx.Self(), Epoch: s.out.epoch, Reason: "shutdown"})
		s.out.phase = outIdle
	}
	if s.out.hb != nil {
		s.out.hb.Stop()
	}
	if s.gate.in != nil && s.gate.in.ready {
		s.sendInbound(&wire.Bye{Epoch: s.gate.in.epoch, Reason: "shutdown"})
	}
	s.dropIn(ctx, "shutdown")
	ctx.Send(s.drain.plane, &drained{node: s.node, aborted: s.drain.aborted})
}

// toWireProv and fromWireProv carry a block's provenance across the peer
// wire (bounds: messages.Provenance's, enforced by peer/wire).
func toWireProv(p *messages.Provenance) *wire.Provenance {
	if !fitsWire(p) {
		return nil // announced as a placeholder by the consumer, never a broken frame
	}
	return &wire.Provenance{ParentHash: p.ParentHash, TokenIDs: p.TokenIDs, BlockSize: p.BlockSize,
		LoRAID: p.LoRAID, LoRAName: p.LoRAName, ExtraKeys: p.ExtraKeys}
}

func fromWireProv(p *wire.Provenance) *messages.Provenance {
	return &messages.Provenance{ParentHash: p.ParentHash, TokenIDs: p.TokenIDs, BlockSize: p.BlockSize,
		LoRAID: p.LoRAID, LoRAName: p.LoRAName, ExtraKeys: p.ExtraKeys}
}

// fitsWire reports whether p is within the peer wire's bounds.
func fitsWire(p *messages.Provenance) bool {
	if p.Validate() != nil || len(p.TokenIDs) > wire.MaxTokenIDs || p.BlockSize > wire.MaxTokenIDs ||
		len(p.LoRAName) > wire.MaxStringBytes || len(p.ExtraKeys) > wire.MaxExtraKeys {
		return false
	}
	for _, k := range p.ExtraKeys {
		if len(k) > wire.MaxStringBytes {
			return false
		}
	}
	return true
}

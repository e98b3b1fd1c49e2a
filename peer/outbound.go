package peer

import (
	"time"

	"github.com/kvtier/kvtier/peer/wire"
	"github.com/kvtier/kvtier/supervision"
)

// The outbound session's core: the handshake's phase, the generation its
// link's frames and timers are checked against, the redial back-off and
// the heartbeat's books. Its methods decide; the session carries their
// decisions out (the link, the seals, the timers, Up and Down to the P2P
// tier). outbound_test.go drives it alone.

// outbound is our side of the session we dial.
type outbound struct {
	phase   outPhase
	gen     uint64 // link / timer generation
	link    *link
	epoch   uint64
	hello   *wire.Hello
	timer   supervision.Timer // redial or handshake deadline
	backoff time.Duration
	meta    []byte       // data-plane metadata we Connected for the peer
	seal    *wire.Sealer // seals what we send, from our Auth on (this epoch's keys)
	open    *wire.Opener // checks what the peer sends, from its Ready on
	hbArmed bool         // a heartbeat timer is armed
	pingSeq uint64       // the heartbeat's last Ping
	pongSeq uint64       // the highest heartbeat Pong
	missed  int          // heartbeat ticks in a row whose Ping was unanswered
	hb      supervision.Timer
	// probeSeq is the last liveness probe's Ping (members.go), probe the
	// highest one answered: a seq space of their own (probeSeqBit), so a
	// probe never reads as a heartbeat Ping left unanswered.
	probeSeq, probe uint64
	// peerBlock is the producer's slot size, from its Welcome: a hit of a
	// LookupResp without sizes is that long.
	peerBlock int
}

type outPhase uint8

const (
	outIdle outPhase = iota // waiting to (re)dial
	outDialing
	outHello // Hello sent, waiting for Welcome
	outAuth  // Auth sent, waiting for Ready
	outReady
)

// missedToDead is how many heartbeat ticks in a row may find their Ping
// unanswered before the peer is taken for dead.
const missedToDead = 2

// begin starts a fresh link under epoch with hello: what the link and its
// timers carry from now on is the returned generation.
func (o *outbound) begin(epoch uint64, hello *wire.Hello) uint64 {
	o.gen++
	o.epoch, o.hello = epoch, hello
	o.seal, o.open = nil, nil // keys are per epoch: derived again at its Welcome
	o.hbArmed = false         // a tick armed for an older link is stale now
	o.phase = outDialing
	return o.gen
}

// linkUp says whether the Hello goes out now: the link of this generation
// came up while we were dialing.
func (o *outbound) linkUp(gen uint64) bool {
	if gen != o.gen || o.phase != outDialing {
		return false
	}
	o.phase = outHello
	return true
}

// outTimerStep is what a redial or handshake timer asks for.
type outTimerStep uint8

const (
	outTimerStale            outTimerStep = iota // armed for a link since replaced, or nothing to do
	outTimerDial                                 // the back-off passed: dial
	outTimerHandshakeTimeout                     // the handshake took too long: reset
)

func (o *outbound) timerFired(gen uint64) outTimerStep {
	if gen != o.gen {
		return outTimerStale
	}
	switch o.phase {
	case outIdle:
		return outTimerDial
	case outDialing, outHello, outAuth:
		return outTimerHandshakeTimeout
	}
	return outTimerStale
}

// welcomed moves to Auth on the peer's Welcome; false if none was expected.
func (o *outbound) welcomed() bool {
	if o.phase != outHello {
		return false
	}
	o.phase = outAuth
	return true
}

// ready ends the handshake on the peer's Ready; false if none was
// expected. The back-off starts over.
func (o *outbound) ready() bool {
	if o.phase != outAuth {
		return false
	}
	o.phase, o.backoff = outReady, 0
	return true
}

// lost ends the session under this generation (its frames and timers go
// stale): wasReady says the P2P tier had it Up. With redial, wait is the
// back-off before the next dial: doubled from the last, within
// [retryMin, retryMax].
func (o *outbound) lost(redial bool, retryMin, retryMax time.Duration) (wasReady bool, wait time.Duration) {
	wasReady = o.phase == outReady
	o.hbArmed, o.pingSeq, o.pongSeq, o.missed = false, 0, 0, 0
	o.gen++
	o.phase = outIdle
	if redial {
		o.backoff = min(max(2*o.backoff, retryMin), retryMax)
		wait = o.backoff
	}
	return wasReady, wait
}

// hbStep is what a heartbeat tick asks for.
type hbStep struct {
	ping uint64 // send a Ping with this seq and arm the next tick (0: neither)
	dead bool   // the peer answered none of the last missedToDead Pings: reset
}

// heartbeat is the tick of generation gen; busy says a round of ours waits
// on the peer. An idle or not yet ready session stops ticking (no wake-ups
// while nothing waits) and its books start over.
func (o *outbound) heartbeat(gen uint64, busy bool) hbStep {
	if gen != o.gen {
		return hbStep{}
	}
	o.hbArmed = false
	if o.phase != outReady {
		return hbStep{}
	}
	if !busy {
		o.pingSeq, o.pongSeq, o.missed = 0, 0, 0
		return hbStep{}
	}
	if o.pongSeq < o.pingSeq {
		if o.missed++; o.missed >= missedToDead {
			return hbStep{dead: true}
		}
	}
	o.pingSeq++
	return hbStep{ping: o.pingSeq}
}

// armHeartbeat says whether a heartbeat timer is to be armed now (none is).
func (o *outbound) armHeartbeat() bool {
	if o.hbArmed {
		return false
	}
	o.hbArmed = true
	return true
}

// pong books a Pong: a probe's, or the heartbeat's (a late one for an
// older Ping counts as nothing new).
func (o *outbound) pong(seq uint64) {
	switch {
	case seq&probeSeqBit != 0:
		o.probe = max(o.probe, seq)
	case seq > o.pongSeq && seq <= o.pingSeq:
		o.pongSeq, o.missed = seq, 0
	}
}

// nextProbe is the seq of a new liveness probe's Ping.
func (o *outbound) nextProbe() uint64 {
	o.probeSeq++
	return probeSeqBit | o.probeSeq
}

// probeAnswered says whether the probe seq was answered.
func (o *outbound) probeAnswered(seq uint64) bool { return o.probe >= seq }

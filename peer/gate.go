package peer

import (
	"github.com/kvtier/kvtier/peer/wire"
)

// The inbound side's gate: the handshake a peer starts on our ROUTER
// (Hello → Welcome → Auth → Ready) and the check every later frame passes
// before the producer (producer.go) sees it. Its methods decide; the
// session carries their decisions out (the Refuse and Ready it sends, the
// data plane it connects, the rounds of a session that ends). A Hello's
// own verdict is admitHello's. gate_test.go drives it alone.

// gate holds the authenticated inbound session and the handshake that may
// replace it.
//
// Invariants:
//   - only an Auth that proves the secret for the handshake in progress
//     makes a session ready, and only it replaces a ready one: a Hello, a
//     replayed or forged Auth, or any frame of another epoch leaves the
//     serving session as it was;
//   - a frame reaches the producer only from the ready session, of its
//     epoch, under its seal;
//   - a session ends for malformed frames only once MaxMalformed of them
//     came since its handshake.
type gate struct {
	hs  *inbound // an inbound handshake in progress, until its Auth
	in  *inbound // the ready inbound session, nil until one completes its handshake
	bad int      // malformed frames since the last authenticated handshake
}

// admitted is the gate's decision on one inbound frame (other than a
// Hello). At most one of drop, refuse and serve is set; ended and ready
// are carried out in that order (the old session's holds are released
// before the new one is announced).
type admitted struct {
	drop   string       // count the frame dropped for this reason; nothing else
	refuse *wire.Refuse // send this to the peer, unsealed
	ended  *inbound     // this session ended: release its rounds' holds ...
	why    string       // ... for this reason
	ready  *inbound     // this handshake is authenticated: connect its data plane, send Ready
	serve  bool         // the frame is the ready session's: the producer decides it
}

// Why the gate ends a ready inbound session (logged; the session warns of
// the first).
const (
	endMalformed = "malformed" // MaxMalformed frames since the handshake did not decode
	endNewEpoch  = "new_epoch" // the peer's redial proved the secret: its new session replaces this one
)

// welcomed records the handshake a Welcome was just sent for. The ready
// session, if any, keeps serving until this one proves the secret.
func (g *gate) welcomed(hs *inbound) { g.hs = hs }

// frame decides one inbound frame that is not a Hello: decodeErr is how it
// failed to decode, raw and seal what came on the wire.
func (g *gate) frame(f wire.Frame, decodeErr error, raw, seal []byte, secret []byte, maxMalformed int) admitted {
	if decodeErr != nil {
		return g.malformed(decodeErr, maxMalformed)
	}
	if a, ok := f.(*wire.Auth); ok {
		return g.auth(secret, a)
	}
	if g.in == nil {
		return admitted{drop: "no_session"}
	}
	if e, ok := frameEpoch(f); !ok || e != g.in.epoch {
		return admitted{drop: "stale_epoch"}
	}
	if err := g.in.open.Open(raw, seal); err != nil {
		return admitted{drop: wire.SealReason(err)}
	}
	return admitted{serve: true}
}

// malformed counts a frame that did not decode; the MaxMalformed-th since
// the handshake ends the ready session.
func (g *gate) malformed(decodeErr error, maxMalformed int) admitted {
	v := admitted{drop: wire.Reason(decodeErr)}
	if g.bad++; g.bad >= maxMalformed && g.in != nil {
		v.ended, v.why = g.end(), endMalformed
	}
	return v
}

// auth checks the peer's Auth against the handshake in progress: the
// right MAC makes it the ready session (ending the one it replaces, whose
// rounds died with the peer's redial); a wrong one is refused and the
// handshake forgotten.
func (g *gate) auth(secret []byte, a *wire.Auth) admitted {
	hs := g.hs
	if hs == nil || a.Epoch != hs.epoch {
		return admitted{drop: "unexpected_auth"}
	}
	g.hs = nil
	if !wire.CheckMAC(wire.ClientMAC(secret, hs.hello, hs.welcome), a.MAC) {
		return admitted{refuse: &wire.Refuse{Epoch: hs.epoch, Reason: wire.RefuseAuth, Msg: "wrong secret"}}
	}
	var v admitted
	if g.in != nil {
		v.ended, v.why = g.end(), endNewEpoch
	}
	hs.ready = true
	dialer, listener := wire.SessionKeys(secret, hs.hello, hs.welcome)
	hs.seal, hs.open = wire.NewSealer(listener), wire.NewOpener(dialer)
	g.in, g.bad = hs, 0
	v.ready = hs
	return v
}

// end takes the ready session away (nil when there is none): the caller
// releases what its rounds hold.
func (g *gate) end() *inbound {
	in := g.in
	g.in = nil
	return in
}

// closed is the connection's end: the handshake in progress is forgotten
// and the ready session ends.
func (g *gate) closed() *inbound {
	g.hs = nil
	return g.end()
}

// idle reports that the gate neither serves nor expects anyone.
func (g *gate) idle() bool { return g.in == nil && g.hs == nil }

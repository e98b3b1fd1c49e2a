package peer

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/peer/wire"
)

var gateSecret = []byte("gate-test-secret")

// dialer is the peer's side of one inbound handshake: what it sent and
// received, and the sealer for its frames once Ready.
type dialer struct {
	hello   *wire.Hello
	welcome *wire.Welcome
	seal    *wire.Sealer
}

// hello plays a Hello under epoch and our Welcome to it (as onHello
// builds it), recording the handshake at the gate.
func hello(g *gate, epoch uint64) *dialer {
	h := &wire.Hello{Version: wire.Version, Node: "them", Epoch: epoch, Nonce: wire.NewNonce(), BlockBytes: 4096, Transport: "tcp"}
	w := &wire.Welcome{Version: wire.Version, Node: "us", Epoch: epoch, Nonce: wire.NewNonce(), BlockBytes: 4096, Transport: "tcp"}
	w.MAC = wire.ServerMAC(gateSecret, h, w)
	g.welcomed(newInbound("them", h, w, nil, time.Minute, time.Now, nil))
	return &dialer{hello: h, welcome: w}
}

// auth is the peer's Auth under secret; with the right one it also keys
// the dialer's sealer.
func (d *dialer) auth(secret []byte) *wire.Auth {
	if string(secret) == string(gateSecret) {
		key, _ := wire.SessionKeys(secret, d.hello, d.welcome)
		d.seal = wire.NewSealer(key)
	}
	return &wire.Auth{Epoch: d.hello.Epoch, MAC: wire.ClientMAC(secret, d.hello, d.welcome)}
}

// sealed is a Ping of the dialer's session as it comes off the wire.
type sealed struct {
	frame     wire.Frame
	raw, seal []byte
}

func (d *dialer) ping(t *testing.T, seq uint64) sealed {
	f := &wire.Ping{Epoch: d.hello.Epoch, Seq: seq}
	raw, err := wire.Encode(f)
	require.NoError(t, err)
	return sealed{frame: f, raw: raw, seal: d.seal.Seal(raw)}
}

func (g *gate) offer(s sealed) admitted {
	return g.frame(s.frame, nil, s.raw, s.seal, gateSecret, DefaultMaxMalformed)
}

func (g *gate) authFrame(a *wire.Auth) admitted {
	return g.frame(a, nil, nil, nil, gateSecret, DefaultMaxMalformed)
}

// readyGate is a gate whose handshake under epoch completed.
func readyGate(t *testing.T, epoch uint64) (*gate, *dialer) {
	g := &gate{}
	d := hello(g, epoch)
	v := g.authFrame(d.auth(gateSecret))
	require.Equal(t, admitted{ready: g.in}, v)
	require.NotNil(t, g.in)
	return g, d
}

// An Auth makes a session ready only for the handshake in progress, of
// its epoch, with the secret's MAC; otherwise it is dropped (no handshake,
// another epoch: the handshake waits on) or refused (wrong secret: the
// handshake is forgotten, so the right MAC sent after it is unexpected).
func TestGateAuth(t *testing.T) {
	t.Run("no handshake", func(t *testing.T) {
		g := &gate{}
		require.Equal(t, admitted{drop: "unexpected_auth"}, g.authFrame(&wire.Auth{Epoch: 1}))
	})
	t.Run("another epoch", func(t *testing.T) {
		g := &gate{}
		d := hello(g, 7)
		a := d.auth(gateSecret)
		a.Epoch = 8
		require.Equal(t, admitted{drop: "unexpected_auth"}, g.authFrame(a))
		a.Epoch = 7
		v := g.authFrame(a)
		require.NotNil(t, v.ready, "the handshake still waited for its own epoch's Auth")
	})
	t.Run("wrong secret", func(t *testing.T) {
		g := &gate{}
		d := hello(g, 7)
		v := g.authFrame(d.auth([]byte("guess")))
		require.Equal(t, admitted{refuse: &wire.Refuse{Epoch: 7, Reason: wire.RefuseAuth, Msg: "wrong secret"}}, v)
		require.Nil(t, g.in)
		require.Equal(t, admitted{drop: "unexpected_auth"}, g.authFrame(d.auth(gateSecret)),
			"a refused handshake is over: the right MAC after it is not a second try")
	})
	t.Run("right secret", func(t *testing.T) {
		g, d := readyGate(t, 7)
		require.True(t, g.in.ready)
		require.Equal(t, d.hello, g.in.hello)
		require.Equal(t, admitted{serve: true}, g.offer(d.ping(t, 1)), "the session's keys are the dialer's")
		require.False(t, g.idle())
	})
}

// A peer that redials keeps its old session serving through the new
// handshake; the new session's Auth ends the old one (its rounds died
// with the redial) and makes the new one ready, whose epoch alone serves
// from then on.
func TestGateRedial(t *testing.T) {
	g, old := readyGate(t, 1)
	oldIn := g.in
	next := hello(g, 2)
	require.Equal(t, admitted{serve: true}, g.offer(old.ping(t, 1)), "a Hello alone ends nothing")
	v := g.authFrame(next.auth(gateSecret))
	require.Equal(t, admitted{ended: oldIn, why: "new_epoch", ready: g.in}, v)
	require.NotSame(t, oldIn, g.in)
	require.Equal(t, admitted{drop: "stale_epoch"}, g.offer(old.ping(t, 2)))
	require.Equal(t, admitted{serve: true}, g.offer(next.ping(t, 1)))
}

// A frame other than a handshake's reaches the producer only from the
// ready session, of its epoch, under its seal, never twice.
func TestGateFrames(t *testing.T) {
	t.Run("no session", func(t *testing.T) {
		g := &gate{}
		hello(g, 3)
		p := &wire.Ping{Epoch: 3, Seq: 1}
		require.Equal(t, admitted{drop: "no_session"}, g.offer(sealed{frame: p}), "a handshake in progress serves nothing")
	})
	g, d := readyGate(t, 3)
	good := d.ping(t, 1)
	for _, c := range []struct {
		name string
		s    sealed
		drop string
	}{
		{"another epoch", sealed{frame: &wire.Ping{Epoch: 4, Seq: 1}, raw: good.raw, seal: good.seal}, "stale_epoch"},
		{"a frame that carries no epoch", sealed{frame: &wire.Hello{}, raw: good.raw, seal: good.seal}, "stale_epoch"},
		{"unsealed", sealed{frame: good.frame, raw: good.raw}, "unsealed_frame"},
		{"sealed for other bytes", sealed{frame: good.frame, raw: append([]byte{0}, good.raw...), seal: good.seal}, "bad_seal"},
		{"sealed under another key", func() sealed {
			s := d.ping(t, 1)
			s.seal = wire.NewSealer([]byte("not the key")).Seal(s.raw)
			return s
		}(), "bad_seal"},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, admitted{drop: c.drop}, g.offer(c.s))
		})
	}
	require.Equal(t, admitted{serve: true}, g.offer(good))
	require.Equal(t, admitted{drop: "replayed_frame"}, g.offer(good), "a frame is served once")
}

// Frames that do not decode are dropped and counted; the MaxMalformed-th
// since the last authenticated handshake ends the ready session (none
// ends without one), and a new handshake starts the count over.
func TestGateMalformed(t *testing.T) {
	const limit = 4
	bad := &wire.Error{Kind: wire.ErrMalformed, Field: "keys"}
	drop := admitted{drop: wire.Reason(bad)}
	malformed := func(g *gate) admitted { return g.frame(nil, bad, nil, nil, gateSecret, limit) }

	g := &gate{}
	for range 2 * limit {
		require.Equal(t, drop, malformed(g), "no session to end")
	}
	d := hello(g, 5)
	require.NotNil(t, g.frame(d.auth(gateSecret), nil, nil, nil, gateSecret, limit).ready)
	for range limit - 1 {
		require.Equal(t, drop, malformed(g), "the count starts over at the handshake")
	}
	in := g.in
	require.Equal(t, admitted{drop: drop.drop, ended: in, why: "malformed"}, malformed(g))
	require.Nil(t, g.in)
	require.True(t, g.idle())
}

// Seeded schedules of what anyone who can reach our ROUTER under the
// peer's identity may send without the secret — Hellos that start new
// handshakes, Auths with a wrong MAC or replayed from an earlier
// handshake, frames of other epochs, forged, unsealed or replayed seals —
// between the ready peer's own sealed frames: the peer's session is never
// ended or replaced, every one of its frames is served once, and nothing
// the attacker sends is.
func TestGateAttackerSeeded(t *testing.T) {
	for seed := range uint64(200) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x9a7e))
			g, peer := readyGate(t, 1)
			in := g.in
			var seq uint64
			var sent []sealed // the peer's frames so far, for replays
			var oldAuths []*wire.Auth
			attack := func() admitted {
				switch rng.IntN(6) {
				case 0:
					d := hello(g, 2+rng.Uint64N(4))
					oldAuths = append(oldAuths, d.auth(gateSecret)) // what it would take: never sent
					return admitted{}
				case 1:
					if g.hs == nil {
						return g.authFrame(&wire.Auth{Epoch: 1, MAC: make([]byte, 32)})
					}
					return g.authFrame(&wire.Auth{Epoch: g.hs.epoch, MAC: wire.NewNonce()})
				case 2:
					if len(oldAuths) == 0 {
						return admitted{}
					}
					a := oldAuths[rng.IntN(len(oldAuths))]
					if g.hs != nil && a.Epoch == g.hs.epoch && string(a.MAC) == string(wire.ClientMAC(gateSecret, g.hs.hello, g.hs.welcome)) {
						return admitted{} // the handshake it belongs to is the one in progress: not a replay
					}
					return g.authFrame(a)
				case 3:
					return g.offer(sealed{frame: &wire.Ping{Epoch: 1 + rng.Uint64N(5), Seq: 9}, raw: []byte{1}, seal: make([]byte, wire.SealBytes)})
				case 4:
					raw, _ := wire.Encode(&wire.Ping{Epoch: 1, Seq: 9})
					return g.offer(sealed{frame: &wire.Ping{Epoch: 1, Seq: 9}, raw: raw})
				default:
					if len(sent) == 0 {
						return admitted{}
					}
					return g.offer(sent[rng.IntN(len(sent))])
				}
			}
			for step := range 300 {
				if rng.IntN(3) == 0 {
					seq++
					s := peer.ping(t, seq)
					sent = append(sent, s)
					require.Equal(t, admitted{serve: true}, g.offer(s), "step %d: the peer's frame %d", step, seq)
					continue
				}
				v := attack()
				require.False(t, v.serve, "step %d: an attacker's frame was served", step)
				require.Nil(t, v.ended, "step %d: the peer's session ended", step)
				require.Nil(t, v.ready, "step %d: a session became ready without the secret", step)
				require.Same(t, in, g.in, "step %d", step)
			}
		})
	}
}

package node

// A hostile or broken peer against a real producer node: a raw ZeroMQ
// DEALER speaking the peer protocol by hand. Every bad handshake is refused
// with its reason and counted; bad frames are dropped and counted; bad
// rounds are refused without leaking a lease; and the node keeps serving a
// well-behaved consumer throughout.

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/internal/zmqx"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/peer/wire"
)

type rawPeer struct {
	t     *testing.T
	ctx   context.Context
	id    string
	sock  zmq4.Socket
	in    chan rawIn
	epoch uint64
	seal  *wire.Sealer // from the Auth on: the session's dialer key
	open  *wire.Opener // the node's frames after its Ready
}

// rawIn is a frame from the node, with its seal part (nil: unsealed).
type rawIn struct {
	f         wire.Frame
	raw, seal []byte
}

func dialRaw(t *testing.T, ctx context.Context, addr, id string) *rawPeer {
	t.Helper()
	sock := zmq4.NewDealer(context.Background(), zmq4.WithID(zmq4.SocketIdentity(id)))
	require.NoError(t, sock.Dial(addr))
	r := &rawPeer{t: t, ctx: ctx, id: id, sock: sock, in: make(chan rawIn, 64)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		zmqx.Serve(sock, func(m zmq4.Msg) bool {
			if f, err := wire.Decode(m.Frames[0]); err == nil {
				in := rawIn{f: f, raw: m.Frames[0]}
				if len(m.Frames) == 2 {
					in.seal = m.Frames[1]
				}
				r.in <- in
			}
			return true
		}, func(error) bool { return ctx.Err() == nil })
	}()
	t.Cleanup(func() {
		sock.Close()
		<-done
	})
	return r
}

// dialSession dials prod's peer endpoint as id and opens a session (see
// session).
func dialSession(t *testing.T, prod *harness, id string, msgAndArgs ...any) *rawPeer {
	t.Helper()
	r := dialRaw(t, prod.ctx, prod.node.PeerAddr(), id)
	r.session(msgAndArgs...)
	return r
}

// session handshakes with the shared secret: the node must answer Ready.
func (r *rawPeer) session(msgAndArgs ...any) {
	r.t.Helper()
	_, ok := r.handshake(testSecret, r.hello()).(*wire.Ready)
	require.True(r.t, ok, msgAndArgs...)
}

func (r *rawPeer) sendBytes(b []byte) {
	r.t.Helper()
	require.NoError(r.t, r.sock.Send(zmq4.NewMsg(b)))
}

// send sends f, sealed once the session's keys are derived (after Auth).
func (r *rawPeer) send(f wire.Frame) {
	r.t.Helper()
	b, err := wire.Encode(f)
	require.NoError(r.t, err)
	if r.seal == nil {
		r.sendBytes(b)
		return
	}
	require.NoError(r.t, r.sock.Send(zmq4.NewMsgFrom(b, r.seal.Seal(b))))
}

// sendSealed sends an encoded frame with the seal part given.
func (r *rawPeer) sendSealed(b, seal []byte) {
	r.t.Helper()
	require.NoError(r.t, r.sock.Send(zmq4.NewMsgFrom(b, seal)))
}

// recv returns the node's next frame; after the handshake every frame must
// come sealed under the session's listener key.
func (r *rawPeer) recv() wire.Frame {
	r.t.Helper()
	select {
	case in := <-r.in:
		if _, refuse := in.f.(*wire.Refuse); r.open != nil && !(refuse && in.seal == nil) {
			require.NoError(r.t, r.open.Open(in.raw, in.seal), "the node seals its %T", in.f)
		}
		return in.f
	case <-r.ctx.Done():
		r.t.Fatal("no frame from the node before the test deadline")
		return nil
	}
}

func (r *rawPeer) hello() *wire.Hello {
	r.epoch = wire.NewEpoch()
	return &wire.Hello{Version: wire.Version, Node: r.id, Epoch: r.epoch, Nonce: wire.NewNonce(),
		BlockBytes: testBlock, Slots: 16, Transport: "tcp", DataMeta: []byte{0}}
}

// handshake completes a session with secret and returns the node's last
// frame (Ready, or the Refuse).
func (r *rawPeer) handshake(secret string, h *wire.Hello) wire.Frame {
	r.t.Helper()
	r.seal, r.open = nil, nil // a new session: new keys, once it proves the secret
	r.send(h)
	f := r.recv()
	w, ok := f.(*wire.Welcome)
	if !ok {
		return f
	}
	require.True(r.t, wire.CheckMAC(wire.ServerMAC([]byte(testSecret), h, w), w.MAC), "the node proves the secret")
	r.send(&wire.Auth{Epoch: h.Epoch, MAC: wire.ClientMAC([]byte(secret), h, w)})
	dialer, listener := wire.SessionKeys([]byte(secret), h, w)
	r.seal, r.open = wire.NewSealer(dialer), wire.NewOpener(listener)
	return r.recv()
}

// wireKeys are ks as peer frames carry them.
func wireKeys(ks []messages.Key) []wire.Key {
	wk := make([]wire.Key, len(ks))
	for i, k := range ks {
		wk[i] = wire.Key{Namespace: string(k.Namespace), Hash: []byte(k.Hash), Group: k.Group}
	}
	return wk
}

func requireRefused(t *testing.T, f wire.Frame, reason string) {
	t.Helper()
	ref, ok := f.(*wire.Refuse)
	require.True(t, ok, "want Refuse{%s}, got %T %+v", reason, f, f)
	require.Equal(t, reason, ref.Reason)
}

func TestPeersRefuseBadHandshakes(t *testing.T) {
	prod, cons := openPair(t, 32, func(c *config.Config) {
		c.Peers.Allow = []string{"cons", "mallory", "old", "ns", "cons-spoof", "tenant-b"}
		c.Peers.Namespaces = []string{string(testNS)}
	})
	addr := prod.node.PeerAddr()

	m := dialRaw(t, prod.ctx, addr, "mallory")
	requireRefused(t, m.handshake("wrong-secret-0123456789", m.hello()), wire.RefuseAuth)

	s := dialRaw(t, prod.ctx, addr, "stranger")
	requireRefused(t, s.handshake(testSecret, s.hello()), wire.RefuseNotAllow)

	o := dialRaw(t, prod.ctx, addr, "old")
	b, err := wire.Encode(o.hello())
	require.NoError(t, err)
	v1 := []byte{0xa1, 'v', wire.Version}
	require.True(t, bytes.Contains(b, v1), "the version field is encoded as documented")
	o.sendBytes(bytes.Replace(b, v1, []byte{0xa1, 'v', wire.Version + 1}, 1)) // a newer node
	requireRefused(t, o.recv(), wire.RefuseVersion)

	// A pool of another slot size is no reason to refuse (peer protocol 3:
	// each block travels at its own length, one too long for a slot is a
	// miss): the session opens.
	g := dialRaw(t, prod.ctx, addr, "ns")
	h := g.hello()
	h.BlockBytes = testBlock * 2
	_, ready := g.handshake(testSecret, h).(*wire.Ready)
	require.True(t, ready, "a peer of another slot size is refused")

	spoof := dialRaw(t, prod.ctx, addr, "cons-spoof")
	h = spoof.hello()
	h.Node = "cons" // claims another identity than its connection's
	requireRefused(t, spoof.handshake(testSecret, h), wire.RefuseAuth)

	tb := dialRaw(t, prod.ctx, addr, "tenant-b")
	h = tb.hello()
	h.Namespaces = []string{"another-tenant"}
	requireRefused(t, tb.handshake(testSecret, h), wire.RefuseNamespace)

	refused := prod.node.peerCounters().Refused()
	require.Equal(t, uint64(2), refused[wire.RefuseAuth])
	require.Equal(t, uint64(1), refused[wire.RefuseNotAllow])
	require.Equal(t, uint64(1), refused[wire.RefuseVersion])
	require.Zero(t, refused[wire.RefuseGeometry])
	require.Equal(t, uint64(1), refused[wire.RefuseNamespace])

	requireStillServes(t, prod, cons, 0)
}

// requireStillServes stores blocks on prod and fetches them on cons.
func requireStillServes(t *testing.T, prod, cons *harness, from int) {
	t.Helper()
	prod.storeReady(ids(from, 4)...)
	ks := keys(ids(from, 4)...)
	req := &messages.ReqContext{RequestID: "r"}
	cons.lookup(req, ks, true)
	cons.idle()
	require.Equal(t, statuses(4, messages.Hit), cons.lookup(req, ks, true))
	cons.loadAndVerify(req, ids(from, 4)...)
	prod.quiet()
}

func TestPeersBadFramesAndRoundsAreDroppedAndCounted(t *testing.T) {
	prod, cons := openPair(t, 32)
	prod.storeReady(ids(0, 4)...)
	ks := keys(ids(0, 4)...)

	p := dialSession(t, prod, "raw", "a peer with the secret gets a session")

	// Garbage: dropped and counted, no answer, the session survives.
	p.sendBytes([]byte{0xc1, 0x00, 0xff})
	p.sendBytes([]byte("not msgpack at all"))

	wk := wireKeys(ks)
	p.send(&wire.Lookup{Epoch: p.epoch, Round: 5, Keys: wk})
	resp, ok := p.recv().(*wire.LookupResp)
	require.True(t, ok)
	require.Equal(t, []bool{true, true, true, true}, resp.Hits, "the session still serves after garbage")
	require.Equal(t, 4, prod.stats().Leased, "the round's hits are leased to it")

	// A replayed (or late duplicate) round is dropped: no second answer.
	p.send(&wire.Lookup{Epoch: p.epoch, Round: 5, Keys: wk})
	// A frame of another epoch is dropped.
	p.send(&wire.Lookup{Epoch: p.epoch + 1, Round: 6, Keys: wk})
	// A Fetch into slots outside the advertised pool is refused; the round's
	// leases are released.
	p.send(&wire.Fetch{Epoch: p.epoch, Round: 5, Keys: wk, Dest: []int{0, 1, 2, 99}, Token: make([]byte, wire.TokenBytes), TTLms: 5000})
	done, ok := p.recv().(*wire.TransferDone)
	require.True(t, ok, "the next answer is the refused fetch: the replay and the stale epoch got none")
	require.False(t, done.OK)
	require.Equal(t, "bad_slot", done.Reason)
	// A second Fetch of the finished round is refused too.
	p.send(&wire.Fetch{Epoch: p.epoch, Round: 5, Keys: wk, Dest: []int{0, 1, 2, 3}, Token: make([]byte, wire.TokenBytes), TTLms: 5000})
	done, ok = p.recv().(*wire.TransferDone)
	require.True(t, ok)
	require.Equal(t, "unknown_round", done.Reason)

	prod.quiet()
	dropped := prod.node.peerCounters().Dropped()
	require.GreaterOrEqual(t, dropped["malformed"]+dropped["unknown_op"]+dropped["too_large"], uint64(2), "%v", dropped)
	require.Equal(t, uint64(1), dropped["replayed_round"], "%v", dropped)
	require.Equal(t, uint64(1), dropped["stale_epoch"], "%v", dropped)
	require.Equal(t, uint64(1), dropped["bad_slot"], "%v", dropped)

	requireStillServes(t, prod, cons, 10)
}

// Every frame after the handshake is sealed (protocol v2): a replayed, a
// forged, an unsealed and a cross-session frame (sealed under an earlier
// session's key) are each dropped and counted without an answer, the
// session they hit keeps serving its rounds, and so does the node for
// everyone else.
func TestPeersForgedReplayedAndCrossSessionFramesAreDroppedAndCounted(t *testing.T) {
	prod, cons := openPair(t, 32)
	prod.storeReady(ids(0, 4)...)
	wk := wireKeys(keys(ids(0, 4)...))
	p := dialSession(t, prod, "raw")
	lookup := func(round uint64) []byte {
		b, err := wire.Encode(&wire.Lookup{Epoch: p.epoch, Round: round, Keys: wk})
		require.NoError(t, err)
		return b
	}
	requireAnswer := func(round uint64) {
		t.Helper()
		resp, ok := p.recv().(*wire.LookupResp)
		require.True(t, ok)
		require.Equal(t, round, resp.Round, "the next answer is round %d's: nothing dropped got one", round)
		require.Equal(t, []bool{true, true, true, true}, resp.Hits)
	}

	first := lookup(1)
	firstSeal := p.seal.Seal(first)
	p.sendSealed(first, firstSeal)
	requireAnswer(1)
	p.sendSealed(first, firstSeal) // replayed, byte for byte
	forged := make([]byte, wire.SealBytes)
	copy(forged, firstSeal[:8])
	forged[7] = 9 // a fresh counter, but a tag made up
	p.sendSealed(lookup(2), forged)
	p.sendBytes(lookup(3)) // unsealed
	p.send(&wire.Lookup{Epoch: p.epoch, Round: 4, Keys: wk})
	requireAnswer(4)

	// A new session of the same peer: a frame sealed under the old
	// session's key, in the new epoch, is refused.
	old := p.seal
	p.session()
	cross := lookup(5)
	p.sendSealed(cross, old.Seal(cross))
	p.send(&wire.Lookup{Epoch: p.epoch, Round: 6, Keys: wk})
	requireAnswer(6)
	p.send(&wire.Abort{Epoch: p.epoch, Round: 6}) // its leases go back
	_, ok := p.recv().(*wire.AbortAck)
	require.True(t, ok)

	dropped := prod.node.peerCounters().Dropped()
	require.Equal(t, uint64(1), dropped["replayed_frame"], "%v", dropped)
	require.Equal(t, uint64(2), dropped["bad_seal"], "forged and cross-session: %v", dropped)
	require.Equal(t, uint64(1), dropped["unsealed_frame"], "%v", dropped)
	require.Zero(t, dropped["replayed_round"], "the seal refused the replay before its round was looked at")
	requireStillServes(t, prod, cons, 10)
}

// A producer that completes the handshake and then never answers (hung,
// not dead: its connection stays up): the consumer's lookup round passes
// its deadline, the engine gets MISS instead of RETRY forever, and the
// session starts over with a fresh epoch.
func TestPeersHungProducerIsAMissAndTheSessionResets(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	hung := zmq4.NewRouter(context.Background(), zmq4.WithID(zmq4.SocketIdentity("hung")))
	require.NoError(t, hung.Listen("tcp://127.0.0.1:0"))
	hellos := make(chan *wire.Hello, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var h *wire.Hello
		var w *wire.Welcome
		for {
			m, err := hung.Recv()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				select {
				case <-done:
					return
				default:
				}
				if err == context.Canceled {
					return
				}
				continue
			}
			f, err := wire.Decode(m.Frames[1])
			if err != nil {
				continue
			}
			reply := func(f wire.Frame) {
				b, _ := wire.Encode(f)
				_ = hung.Send(zmq4.NewMsgFrom(m.Frames[0], b))
			}
			switch f := f.(type) {
			case *wire.Hello:
				h = f
				hellos <- f
				w = &wire.Welcome{Version: wire.Version, Node: "hung", Epoch: f.Epoch, Nonce: wire.NewNonce(),
					BlockBytes: f.BlockBytes, Slots: 16, Transport: f.Transport, DataMeta: f.DataMeta}
				w.MAC = wire.ServerMAC([]byte(testSecret), h, w)
				reply(w)
			case *wire.Auth:
				_, listener := wire.SessionKeys([]byte(testSecret), h, w)
				b, _ := wire.Encode(&wire.Ready{Epoch: f.Epoch})
				_ = hung.Send(zmq4.NewMsgFrom(m.Frames[0], b, wire.NewSealer(listener).Seal(b)))
			default:
				// Hung: Lookups and everything else go unanswered.
			}
		}
	}()
	t.Cleanup(func() {
		hung.Close()
		<-done
	})
	cons := open(t, 16, withPeers("cons", config.PeerAddr{NodeID: "hung", Addr: "tcp://" + hung.Addr().String()}))
	require.NoError(t, cons.node.WaitPeers(cons.ctx, "hung"))
	first := <-hellos

	req := &messages.ReqContext{RequestID: "r"}
	ks := keys(1, 2)
	require.Equal(t, messages.Retry, cons.lookup(req, ks, true)[0])
	// Nothing answers: once the deadlines pass (the manual clock), the
	// lookup resolves as absent. NB: the deadlines are armed in the actors'
	// own mailboxes — the tiering actor's before RETRY was answered, the
	// peer session's round deadline possibly after the clock moved (a
	// lookup then joins the round still open and answers RETRY once more):
	// time moves on until the answer is not RETRY, bounded by the ctx.
	var st []messages.LookupStatus
	for {
		cons.clock.Advance(2 * time.Second)
		cons.idle()
		if st = cons.lookup(req, ks, true); st[0] != messages.Retry {
			break
		}
		require.NoError(t, ctx.Err(), "RETRY forever")
	}
	require.Equal(t, statuses(2, messages.Miss), st, "MISS, not RETRY forever")
	cons.quiet()

	// The session's own round deadline resets it; it redials with a new
	// epoch after its backoff. Its timers are armed by its own mailbox, so
	// time is advanced until the Hello comes (bounded by the test's ctx).
	var again *wire.Hello
	for again == nil {
		cons.clock.Advance(time.Second)
		select {
		case again = <-hellos:
		case <-ctx.Done():
			t.Fatal("no new Hello after the round timed out")
		case <-time.After(5 * time.Millisecond): // NB: a probe period, then time moves on again
		}
	}
	require.NotEqual(t, first.Epoch, again.Epoch, "a fresh epoch")
	ps, err := cons.node.PeerStats(cons.ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, ps[0].Failures, uint64(1), "the hung round counted as failed")
}

// A session that keeps sending malformed frames loses its inbound session
// (its next round is not served) and must handshake again; the node keeps
// serving everyone else.
func TestPeersMalformedFloodDropsTheSession(t *testing.T) {
	prod, cons := openPair(t, 32)
	p := dialSession(t, prod, "flood")
	for range 16 {
		p.sendBytes([]byte{0x81, 0xa1, 'v'}) // truncated map
	}
	wk := []wire.Key{{Namespace: string(testNS), Hash: []byte("12345678")}}
	p.send(&wire.Lookup{Epoch: p.epoch, Round: 1, Keys: wk})
	// A fresh handshake works and is served: the flood cost only its session.
	p.session("the lookup of the dropped session got no answer; the next frame is the new Welcome/Ready")
	p.send(&wire.Lookup{Epoch: p.epoch, Round: 1, Keys: wk})
	_, ok := p.recv().(*wire.LookupResp)
	require.True(t, ok)
	require.GreaterOrEqual(t, prod.node.peerCounters().Dropped()["no_session"], uint64(1))
	requireStillServes(t, prod, cons, 0)
}

// A consumer that dies with a round leased: its connection's end releases
// the round's leases at once (not at the lease TTL), and the node keeps
// serving others.
func TestPeersDeadConsumerReleasesItsLeasesAtOnce(t *testing.T) {
	prod, cons := openPair(t, 32)
	prod.storeReady(ids(0, 4)...)
	ks := keys(ids(0, 4)...)

	p := dialSession(t, prod, "doomed")
	wk := wireKeys(ks)
	p.send(&wire.Lookup{Epoch: p.epoch, Round: 1, Keys: wk})
	_, ok := p.recv().(*wire.LookupResp)
	require.True(t, ok)
	require.Equal(t, 4, prod.stats().Leased)

	require.NoError(t, p.sock.Close()) // the consumer dies
	for prod.stats().Leased != 0 {     // the manual clock never reaches the lease TTL
		require.NoError(t, prod.ctx.Err(), "leases of a dead consumer's round were not released")
	}
	requireStillServes(t, prod, cons, 10)
}

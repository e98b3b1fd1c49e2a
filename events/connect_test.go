package events

// Bind or connect (mode.go): the node's PUB connecting to a router's bound
// SUB (llm-d's topology), and a learning SUB that binds for engines whose
// PUB connects. Real ZeroMQ sockets (zmq4) on loopback, over tcp and ipc.
// ZeroMQ drops what a PUB sends before a subscriber has joined (the slow
// joiner), so each check publishes until the message arrives, within a
// bounded deadline; nothing waits a fixed time for a socket to be ready.

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/internal/testutil/freeport"
	"github.com/kvtier/kvtier/internal/testutil/testnet"
	"github.com/kvtier/kvtier/internal/zmqx"
)

func TestVLLMBindRuleDecidesAutoMode(t *testing.T) {
	// vllm/distributed/kv_events.py, ZmqEventPublisher._is_bind_endpoint.
	for ep, binds := range map[string]bool{
		"tcp://*:5557":         true,
		"tcp://[::]:5557":      true,
		"tcp://[::1]:5557":     true, // NB: vLLM's test is a substring
		"ipc:///run/kv/events": true,
		"inproc://cache":       true,
		"tcp://epp:5557":       false,
		"tcp://127.0.0.1:5557": false,
		"tcp://0.0.0.0:5557":   false,
	} {
		assert.Equal(t, binds, VLLMBinds(ep), ep)
		got, err := PublisherBinds(ModeAuto, ep)
		require.NoError(t, err, ep)
		assert.Equal(t, binds, got, ep)
	}
	for _, mode := range []string{"", ModeBind} {
		got, err := PublisherBinds(mode, "tcp://epp:5557")
		require.NoError(t, err)
		assert.True(t, got, "the publisher binds by default, whatever the address")
	}
	got, err := PublisherBinds(ModeConnect, "ipc:///run/kv/events")
	require.NoError(t, err)
	assert.False(t, got)
	_, err = PublisherBinds(ModeConnect, "tcp://*:5557")
	assert.ErrorIs(t, err, ErrBadConfig, "a wildcard cannot be connected to")
	_, err = PublisherBinds("listen", "tcp://*:5557")
	assert.ErrorIs(t, err, ErrBadConfig)

	// A subscriber in auto mode is the other end of vLLM's rule: it binds
	// where vLLM connects (vLLM's endpoint names this host, ours is a
	// wildcard) and connects where vLLM binds.
	for ep, binds := range map[string]bool{
		"tcp://*:5558":         true,
		"tcp://[::]:5558":      true,
		"tcp://[::1]:5557":     false,
		"tcp://vllm-0:5557":    false,
		"ipc:///run/kv/events": false,
	} {
		got, err := SubscriberBinds(ModeAuto, ep)
		require.NoError(t, err, ep)
		assert.Equal(t, binds, got, ep)
	}
	got, err = SubscriberBinds("", "tcp://*:5558")
	assert.ErrorIs(t, err, ErrBadConfig, "connect (the default) to a wildcard")
	assert.False(t, got)
	got, err = SubscriberBinds(ModeBind, "ipc:///run/kv/learn")
	require.NoError(t, err)
	assert.True(t, got)
}

// received is what a test SUB read, one message at a time.
type received chan zmq4.Msg

// bindSub binds a plain zmq4 SUB (a router's: llm-d's EPP binds one) at
// addr, subscribed to topic, and reads it into the returned channel until
// the test ends or stop is called.
func bindSub(t *testing.T, addr, topic string) (r received, bound string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx)
	require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, topic))
	require.NoError(t, sub.Listen(addr))
	bound = addr
	if a := sub.Addr(); a != nil && a.Network() == "tcp" {
		bound = "tcp://" + a.String()
	}
	r = make(received, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		zmqx.Serve(sub, func(m zmq4.Msg) bool {
			select {
			case r <- m:
				return true
			case <-ctx.Done():
				return false
			}
		}, nil) // NB: a publisher's connection ended: serve the others
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			_ = sub.Close()
			<-done
		})
	}
	t.Cleanup(stop)
	return r, bound, stop
}

// publishUntil publishes a batch with the next sequence number every
// pace until got says what arrived is what it waited for, or fails the
// test after a deadline. It returns the next sequence number.
func publishUntil(t *testing.T, p *Publisher, seq uint64, payload []byte, r received, got func(zmq4.Msg) bool) uint64 {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	pace := time.NewTicker(20 * time.Millisecond) // NB: the pace of a publisher waiting for a slow joiner
	defer pace.Stop()
	for {
		p.Publish(Entry{Seq: seq, Payload: payload})
		seq++
		for waiting := true; waiting; {
			select {
			case m := <-r:
				if got(m) {
					return seq
				}
			case <-pace.C:
				waiting = false
			case <-deadline.C:
				t.Fatalf("nothing arrived through %s within 20s (%d published)", p.Endpoint(), seq)
			}
		}
	}
}

// connectingPublisher is a publisher in connect mode toward addr, closed
// when the test ends.
func connectingPublisher(t *testing.T, addr, topic string) *Publisher {
	t.Helper()
	return listenUntilCleanup(t, PublisherConfig{Endpoint: addr, Mode: ModeConnect, Topic: topic, Linger: -1,
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond, Log: zerolog.Nop()})
}

// addrs are the loopback addresses each test runs on: a tcp port picked
// free (a router restarted on the same address) and an ipc path.
func addrs(t *testing.T) map[string]string {
	t.Helper()
	port, err := freeport.Port()
	require.NoError(t, err)
	return map[string]string{
		"tcp": fmt.Sprintf("tcp://127.0.0.1:%d", port),
		"ipc": "ipc://" + filepath.Join(t.TempDir(), "events.sock"),
	}
}

// The node's PUB connects to a router's bound SUB: it starts before the
// router is up, its batches reach the router once it is (frames as vLLM's
// publisher sends them), and after the router restarts on the same address
// it connects again by itself.
func TestConnectingPublisherReachesARoutersBoundSubscriber(t *testing.T) {
	for name, addr := range addrs(t) {
		t.Run(name, func(t *testing.T) {
			const topic = "kv@10.0.0.7@llama"
			p := connectingPublisher(t, addr, topic)
			assert.True(t, p.Connecting())
			assert.Equal(t, addr, p.Endpoint())
			batch := Batch{TS: 1, HasDPRank: true, Events: []Event{{Type: TypeBlockStored, BlockHashes: []Hash{{Int: 42}},
				TokenIDs: []int32{1, 2}, BlockSize: 2, Medium: "CPU"}}}
			payload, err := EncodeBatch(&batch)
			require.NoError(t, err)
			isBatch := func(m zmq4.Msg) bool {
				if len(m.Frames) != 3 || string(m.Frames[0]) != topic || len(m.Frames[1]) != 8 {
					return false
				}
				b, err := DecodeBatch(m.Frames[2])
				return err == nil && assert.Equal(t, batch, *b)
			}

			// The router comes up after the publisher.
			r, _, stop := bindSub(t, addr, "kv@")
			seq := publishUntil(t, p, 0, payload, r, isBatch)

			// The router restarts on the same address.
			stop()
			r, _, _ = bindSub(t, addr, "kv@")
			from := seq
			publishUntil(t, p, seq, payload, r, func(m zmq4.Msg) bool {
				return isBatch(m) && binary.BigEndian.Uint64(m.Frames[1]) >= from
			})
			assert.GreaterOrEqual(t, p.Connects.Load(), uint64(2), "connected again after the router restarted")
		})
	}
}

// A router that accepts and never greets (its handshake would hold zmq4's
// Dial forever) is given up on after the handshake timeout and dialled
// again; Close ends a connecting publisher promptly whatever it waits on:
// a dial toward an address nobody binds, or such a handshake.
func TestConnectingPublisherOutlastsASilentRouter(t *testing.T) {
	for _, name := range []string{"refused", "silent", "silent, given up"} {
		t.Run(name, func(t *testing.T) {
			cfg := PublisherConfig{Endpoint: addrs(t)["tcp"], Mode: ModeConnect, Topic: "t", Linger: -1,
				ReconnectMin: 10 * time.Millisecond, Log: zerolog.Nop()}
			var accepted <-chan net.Conn
			if name != "refused" {
				ln := testnet.Listen(t, "tcp", "127.0.0.1:0")
				cfg.Endpoint, accepted = "tcp://"+ln.Addr().String(), testnet.Accept(t, ln)
			}
			if name == "silent, given up" {
				cfg.HandshakeTimeout = 50 * time.Millisecond
			}
			p, err := Listen(cfg)
			require.NoError(t, err)
			dials := map[string]int{"refused": 0, "silent": 1, "silent, given up": 2}[name]
			for i := range dials {
				select {
				case <-accepted: // the dial waits for a greeting that never comes
				case <-time.After(10 * time.Second):
					t.Fatalf("the publisher dialled %d times, not %d", i, dials)
				}
			}
			p.Publish(Entry{Seq: 0, Payload: []byte{1}})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			require.NoError(t, p.Close(ctx))
			assert.Zero(t, p.Connects.Load())
			assert.Equal(t, uint64(1), p.Published.Load(), "sent to no one, as a PUB does")
		})
	}
}

// A learning SUB that binds hears every engine whose PUB connects to it,
// each numbering its own batches from 0; one engine going away, or sending
// garbage, does not deafen it to the others.
func TestBoundSubscriberHearsEveryConnectingPublisher(t *testing.T) {
	for name, addr := range addrs(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			deliveries := make(chan Delivery, 64)
			skipped := make(chan error, 64)
			ended := make(chan error, 1)
			go func() {
				ended <- Subscribe(ctx, SubscriberConfig{Endpoint: addr, Mode: ModeBind, ReplayFrom: -1,
					Skipped: func(err error) { skipped <- err }},
					func(d Delivery) error { deliveries <- d; return nil })
			}()
			defer func() {
				cancel()
				assert.ErrorIs(t, <-ended, context.Canceled)
			}()

			payload, err := EncodeBatch(&Batch{TS: 2, Events: []Event{{Type: TypeAllBlocksCleared}}})
			require.NoError(t, err)
			// publishUntil reads zmq4 messages: hand it the deliveries as such.
			heard := func(p *Publisher, from uint64) {
				t.Helper()
				r := make(received, 64)
				stopRelay := relay(deliveries, r)
				defer stopRelay()
				publishUntil(t, p, from, payload, r, func(m zmq4.Msg) bool {
					return string(m.Frames[0]) == p.cfg.Topic
				})
			}
			vllm0 := connectingPublisher(t, addr, "kv@vllm-0@m")
			vllm1 := connectingPublisher(t, addr, "kv@vllm-1@m")
			heard(vllm0, 0)
			heard(vllm1, 0) // from 0 again: a bound SUB tracks no sequence

			// An engine that goes away is skipped, the others still heard.
			closeCtx, closeCancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer closeCancel()
			require.NoError(t, vllm0.Close(closeCtx))
			select {
			case err := <-skipped:
				assert.ErrorContains(t, err, "connection ended")
			case <-time.After(10 * time.Second):
				t.Fatal("the engine's end was not reported")
			}
			heard(vllm1, 100)

			// Garbage from one publisher is skipped too.
			raw := zmq4.NewPub(ctx)
			defer raw.Close()
			require.NoError(t, raw.Dial(addr))
			deadline := time.NewTimer(20 * time.Second)
			defer deadline.Stop()
			for sent := false; !sent; {
				require.NoError(t, raw.Send(zmq4.NewMsgFrom([]byte("kv@bad"), []byte{1})))
				select {
				case err := <-skipped:
					assert.ErrorIs(t, err, ErrMalformed)
					sent = true
				case <-time.After(20 * time.Millisecond): // NB: the slow joiner's pace
				case <-deadline.C:
					t.Fatal("the malformed message never arrived")
				}
			}
			heard(vllm1, 200)
		})
	}
}

// relay copies deliveries to r as [topic, seq, payload] messages until
// the returned func is called.
func relay(deliveries <-chan Delivery, r received) (stop func()) {
	done, over := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(over)
		for {
			select {
			case d := <-deliveries:
				seq := binary.BigEndian.AppendUint64(nil, d.Seq)
				select {
				case r <- zmq4.NewMsgFrom([]byte(d.Topic), seq, nil):
				case <-done:
					return
				}
			case <-done:
				return
			}
		}
	}()
	return func() { close(done); <-over }
}

// A bound subscriber takes no replay endpoint: its publishers are many.
func TestBoundSubscriberRefusesReplay(t *testing.T) {
	err := Subscribe(context.Background(), SubscriberConfig{Endpoint: "tcp://*:1", Mode: ModeAuto,
		Replay: "tcp://127.0.0.1:2", ReplayFrom: 0}, func(Delivery) error { return nil })
	assert.ErrorIs(t, err, ErrBadConfig)
}

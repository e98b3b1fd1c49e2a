package node

// Peers through whole nodes in one process: real ZeroMQ sockets and the
// real tcp data plane on loopback between two nodes' pools. A block stored
// on one node is found by the other (RETRY, then HIT once promoted) and
// every byte is verified; producer leases and pins end with the round.

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/rdma/faulty"
	"github.com/kvtier/kvtier/rdma/tcp"
)

const testSecret = "0123456789abcdef-test-secret"

func withPeers(node string, static ...config.PeerAddr) func(*config.Config) {
	return func(c *config.Config) {
		c.Peers = config.PeersConfig{NodeID: node, Listen: "tcp://127.0.0.1:0", Secret: testSecret, Static: static}
	}
}

// openPair opens a producer and a consumer that dials it.
func openPair(t *testing.T, slots int, tweak ...func(*config.Config)) (prod, cons *harness) {
	t.Helper()
	prod = open(t, slots, append([]func(*config.Config){withPeers("prod")}, tweak...)...)
	cons = open(t, slots, append([]func(*config.Config){withPeers("cons", config.PeerAddr{NodeID: "prod", Addr: prod.node.PeerAddr()})}, tweak...)...)
	require.NoError(t, cons.node.WaitPeers(cons.ctx, "prod"))
	return prod, cons
}

func TestPeersFetchStoredBlocksAndVerify(t *testing.T) {
	prod, cons := openPair(t, 64)
	prod.storeReady(ids(0, 16)...)
	ks := keys(ids(0, 16)...)

	req := &messages.ReqContext{RequestID: "r"}
	first := cons.lookup(req, ks, true)
	require.Equal(t, messages.Retry, first[0], "a CPU miss held by a peer is RETRY first")
	cons.idle()
	require.Equal(t, statuses(16, messages.Hit), cons.lookup(req, ks, true), "fetched from the peer: the whole prefix hits")
	cons.loadAndVerify(req, ids(0, 16)...)
	cons.quiet()
	prod.quiet() // the round's leases and pins at the producer are gone

	ts := cons.tiering()
	require.Equal(t, uint64(16), ts.Promoted["peers"])
	ps, err := cons.node.PeerStats(cons.ctx)
	require.NoError(t, err)
	require.Len(t, ps, 1)
	require.Equal(t, uint64(16), ps[0].Fetched)
	require.Equal(t, uint64(16*testBlock), ps[0].FetchBytes)
	require.False(t, cons.pending(), "peer fetches are never engine work")
}

func TestPeersMissEverywhereIsAMiss(t *testing.T) {
	_, cons := openPair(t, 16)
	req := &messages.ReqContext{RequestID: "r"}
	ks := keys(100, 101)
	require.Equal(t, messages.Retry, cons.lookup(req, ks, true)[0])
	cons.idle()
	require.Equal(t, statuses(2, messages.Miss), cons.lookup(req, ks, true), "no peer holds them: MISS, not RETRY forever")
	cons.quiet()
}

func TestPeersShutdownRefusesNewRoundsAndSaysBye(t *testing.T) {
	prod, cons := openPair(t, 32)
	prod.storeReady(ids(0, 4)...)
	ks := keys(ids(0, 4)...)

	res, err := prod.node.shutdownPeers(prod.ctx, time.Now().Add(time.Second))
	require.NoError(t, err)
	require.Equal(t, 1, res.Sessions, "the consumer's session was drained")
	require.Zero(t, res.Aborted, "nothing was in flight")

	req := &messages.ReqContext{RequestID: "r"}
	cons.lookup(req, ks, true)
	cons.idle()
	require.Equal(t, messages.Miss, cons.lookup(req, ks, true)[0], "a stopping producer serves nothing: MISS, and the consumer recomputes")
	cons.quiet()
	prod.quiet()
}

// A request naming its peer sources (vLLM's remote_kv_source) fetches only
// from them: a source that is not a ready peer means MISS.
func TestPeersPerRequestSource(t *testing.T) {
	prod, cons := openPair(t, 32)
	prod.storeReady(ids(0, 4)...)
	ks := keys(ids(0, 4)...)
	probe := &messages.ReqContext{RequestID: "probe"}

	other := &messages.ReqContext{RequestID: "other", PeerSources: []string{"elsewhere"}}
	cons.lookup(other, ks, true)
	cons.idle()
	require.Equal(t, messages.Miss, cons.lookup(other, ks, true)[0], "its only source is not a peer of ours")
	require.NoError(t, cons.m.RequestFinished(cons.ctx, other))

	// NB: the MISS above is cached as absent for NegativeTTL; a later
	// request naming prod is a new key set here.
	prod.store(&messages.ReqContext{RequestID: "w2"}, ids(10, 4)...)
	ks = keys(ids(10, 4)...)
	require.Equal(t, statuses(4, messages.Hit), prod.lookupUntilSettled(probe, ks))
	require.NoError(t, prod.m.RequestFinished(prod.ctx, probe))
	named := &messages.ReqContext{RequestID: "named", PeerSources: []string{"prod"}}
	cons.lookup(named, ks, true)
	cons.idle()
	require.Equal(t, statuses(4, messages.Hit), cons.lookup(named, ks, true))
	cons.loadAndVerify(named, ids(10, 4)...)
}

// A block fetched from a peer is announced by the consumer with the
// provenance its producer stored it with (token ids, block size, parent):
// never a placeholder.
func TestPeersFetchedBlocksCarryProvenance(t *testing.T) {
	prod, cons := openPair(t, 32)
	const blockTokens = 4
	tokens := make([]int32, 3*blockTokens)
	for i := range tokens {
		tokens[i] = int32(1000 + i)
	}
	parent := []byte("parent-hash-0000")
	w := &messages.ReqContext{RequestID: "w", TokenIDs: tokens, BlockSize: blockTokens, ParentBlockHash: parent, LoRAID: 7, LoRAName: "lora-7"}
	prod.store(w, ids(0, 3)...)
	ks := keys(ids(0, 3)...)
	probe := &messages.ReqContext{RequestID: "probe"}
	require.Equal(t, statuses(3, messages.Hit), prod.lookupUntilSettled(probe, ks))
	require.NoError(t, prod.m.RequestFinished(prod.ctx, probe))
	_, err := cons.m.TakeEvents(cons.ctx) // nothing of interest before the fetch
	require.NoError(t, err)

	req := &messages.ReqContext{RequestID: "r"}
	cons.lookup(req, ks, true)
	cons.idle()
	require.Equal(t, statuses(3, messages.Hit), cons.lookup(req, ks, true))
	evs, err := cons.m.TakeEvents(cons.ctx)
	require.NoError(t, err)
	var stored *messages.Event
	for i := range evs {
		if evs[i].Kind == messages.BlockStored && evs[i].Medium == messages.MediumCPU {
			stored = &evs[i]
		}
	}
	require.NotNil(t, stored, "the fetched blocks are announced stored: %+v", evs)
	require.Len(t, stored.Prov, 3)
	for i, p := range stored.Prov {
		require.NotNil(t, p, "block %d has its producer's provenance", i)
		require.True(t, p.Full(), "block %d: full token ids", i)
		require.Equal(t, tokens[i*blockTokens:(i+1)*blockTokens], p.TokenIDs)
		require.Equal(t, 7, p.LoRAID)
		if i == 0 {
			require.Equal(t, parent, p.ParentHash)
		} else {
			require.Equal(t, []byte(ks[i-1].Hash), p.ParentHash)
		}
	}
	cons.loadAndVerify(req, ids(0, 3)...)
}

// Bit flips on the data plane are caught by the checksums: the corrupt
// block never becomes readable (MISS, recompute), the rest of the round
// commits, and the corruption is counted.
func TestPeersBitFlipOnTheDataPlaneIsNeverCommitted(t *testing.T) {
	prod := open(t, 32, withPeers("prod"))
	inner, err := tcp.New(tcp.Config{Node: "cons"})
	require.NoError(t, err)
	flip := faulty.Wrap(inner, func(kind string, _ int) faulty.Fault {
		if kind == "expect" {
			return faulty.Flip
		}
		return faulty.None
	})
	cons := open(t, 32, withPeers("cons", config.PeerAddr{NodeID: "prod", Addr: prod.node.PeerAddr()}),
		func(c *config.Config) { c.Peers.TransportImpl = flip })
	require.NoError(t, cons.node.WaitPeers(cons.ctx, "prod"))

	prod.storeReady(ids(0, 8)...)
	ks := keys(ids(0, 8)...)

	req := &messages.ReqContext{RequestID: "r"}
	cons.lookup(req, ks, false)
	cons.idle()
	st := cons.lookup(req, ks, false)
	require.Equal(t, uint64(1), flip.Flips.Load())
	var hit []int
	misses := 0
	for i, s := range st {
		switch s {
		case messages.Hit:
			hit = append(hit, i)
		case messages.Miss:
			misses++
		}
	}
	require.Equal(t, 1, misses, "exactly the flipped block is not readable: %v", st)
	cons.loadAndVerify(req, hit...)
	cons.quiet()
	ps, err := cons.node.PeerStats(cons.ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), ps[0].Corrupt)
	require.Equal(t, uint64(7), ps[0].Fetched)
}

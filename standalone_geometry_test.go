package kvtier_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/internal/testutil/testclose"
	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/scheduler/client"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/cpu/residency"
)

// Two engines of different block sizes on one node with one byte budget:
// each maps the pool as slots of its own size and is answered slot numbers
// of them; the second one's stores take the first one's least recent
// blocks (one eviction order across both), never passing the budget; each
// reads back its own bytes, and neither is handed a slot of the other's
// blocks, asked with or without want_slots.
func TestEnginesOfTwoBlockSizesShareOneBudget(t *testing.T) {
	for _, transport := range []string{"unix", "ipc"} {
		t.Run(transport, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			const small, large, budget = 4096, 3 * 4096, 12 * 4096
			node := openEngineTestNode(t, ctx, transport, kvtier.Config{PoolBytes: budget})

			a, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: "small", BlockBytes: small})
			require.NoError(t, err)
			defer a.Close(ctx) //nolint:errcheck // closed with the node
			b, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: "large", BlockBytes: large - 100})
			require.NoError(t, err)
			defer b.Close(ctx) //nolint:errcheck // closed with the node
			require.Equal(t, small, a.Hello().BlockBytes)
			require.Equal(t, []int{large, budget / large}, []int{b.Hello().BlockBytes, b.Hello().Slots},
				"the declared size rounded to a page, as many slots as the budget holds")
			require.Equal(t, a.Hello().PoolPath, b.Hello().PoolPath, "one pool file for every size, each numbering its own slots")

			aKeys, bKeys := nsKeys("a", 12), nsKeys("b", 2)
			store(ctx, t, a, "a0", aKeys)
			plan := store(ctx, t, b, "b0", bKeys)
			require.Equal(t, aKeys[:6], plan.Evicted, "two large blocks take six small ones' bytes, the least recent first")
			for _, s := range plan.Slots {
				require.True(t, s >= 0 && s < b.Hello().Slots, "slot %d is a number of the large region", s)
			}
			requireBudget(ctx, t, node, budget)

			st, slots, err := a.LookupSlots(ctx, &messages.ReqContext{RequestID: "ra"}, aKeys, false)
			require.NoError(t, err)
			for i := range aKeys {
				want := messages.Hit
				if i < 6 {
					want = messages.Miss
				}
				require.Equal(t, want, st[i], "a's key %d", i)
				if want == messages.Hit {
					require.Equal(t, block("a", i, small), a.Pool().Slot(slots[i]), "a's block %d is intact", i)
				}
			}
			st, slots, err = b.LookupSlots(ctx, &messages.ReqContext{RequestID: "rb"}, bKeys, false)
			require.NoError(t, err)
			require.Equal(t, []messages.LookupStatus{messages.Hit, messages.Hit}, st)
			for i := range bKeys {
				require.Equal(t, block("b", i, large), b.Pool().Slot(slots[i]), "b's block %d is intact", i)
			}
			st, _, err = b.LookupSlots(ctx, &messages.ReqContext{RequestID: "rb2"}, aKeys[6:], false)
			require.NoError(t, err)
			for _, s := range st {
				require.Equal(t, messages.Miss, s, "a block of another geometry is never handed to b")
			}
			plain, err := b.Lookup(ctx, &messages.ReqContext{RequestID: "rb3"}, aKeys[6:], false)
			require.NoError(t, err)
			require.Equal(t, slices.Repeat([]messages.LookupStatus{messages.Miss}, 6), plain, "without want_slots too")
			plain, err = a.Lookup(ctx, &messages.ReqContext{RequestID: "ra2"}, bKeys, false)
			require.NoError(t, err)
			require.Equal(t, []messages.LookupStatus{messages.Miss, messages.Miss}, plain, "and the other way round")
			require.NoError(t, a.RequestFinished(ctx, &messages.ReqContext{RequestID: "ra"}))
			require.NoError(t, b.RequestFinished(ctx, &messages.ReqContext{RequestID: "rb"}))
			require.NoError(t, b.RequestFinished(ctx, &messages.ReqContext{RequestID: "rb2"}))
			require.NoError(t, b.RequestFinished(ctx, &messages.ReqContext{RequestID: "rb3"}))
			require.NoError(t, a.RequestFinished(ctx, &messages.ReqContext{RequestID: "ra2"}))

			// The small engine wakes: its stores take back the large blocks'
			// bytes once its own older blocks are gone.
			more := nsKeys("a2", 9)
			plan = store(ctx, t, a, "a1", more)
			require.ElementsMatch(t, append(append([]messages.Key{}, aKeys[6:]...), bKeys[0]), plan.Evicted,
				"its own six older blocks first, then the least recent large one")
			requireBudget(ctx, t, node, budget)
		})
	}
}

// nsKeys are n keys of namespace ns.
func nsKeys(ns string, n int) []messages.Key {
	out := make([]messages.Key, n)
	for i := range out {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(i))
		out[i] = messages.Key{Namespace: messages.Namespace(ns), Hash: string(b[:])}
	}
	return out
}

// block is the bytes of namespace ns's block i, n long.
func block(ns string, i, n int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("%s%03d|", ns, i)), n)[:n]
}

// store writes keys through c as an engine does: its slots get each block's
// bytes, and the job is reported done.
func store(ctx context.Context, t *testing.T, c *client.Client, id string, keys []messages.Key) messages.StorePlan {
	t.Helper()
	req := &messages.ReqContext{RequestID: id}
	plan, err := c.PrepareStore(ctx, req, keys)
	require.NoError(t, err)
	require.Equal(t, keys, plan.ToStore)
	for i, s := range plan.Slots {
		copy(c.Pool().Slot(s), block(string(keys[i].Namespace), keyIndexOf(keys[i]), c.Hello().BlockBytes))
	}
	require.NoError(t, c.JobDone(ctx, plan.Job, 0, true))
	require.NoError(t, c.RequestFinished(ctx, req))
	return plan
}

func keyIndexOf(k messages.Key) int { return int(binary.BigEndian.Uint64([]byte(k.Hash))) }

// requireBudget checks that the pool's memory stays within its budget.
func requireBudget(ctx context.Context, t *testing.T, node *kvtier.Node, budget int64) {
	t.Helper()
	requireBudgetOf(ctx, t, node, budget, 2)
}

// requireBudgetOf checks that the pool's memory stays within its budget,
// shared by sizes block sizes.
func requireBudgetOf(ctx context.Context, t *testing.T, node *kvtier.Node, budget int64, sizes int) {
	t.Helper()
	s, err := node.Manager().Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, budget, s.PoolBytes)
	require.LessOrEqual(t, s.CommittedBytes, budget, "committed bytes within the budget")
	require.Len(t, s.Geometries, sizes)
}

// A busy geometry takes memory from an idle one: engine A fills the pool,
// then engine B, of blocks twice as large, runs its trace. B's hit rate is
// what B gets alone on the same budget, what B evicted is A's (its least
// recent first), and A, waking, takes the bytes back from B the same way.
func TestABusyGeometryTakesMemoryFromAnIdleOne(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const small, large, budget = 4096, 8192, 64 * 4096
	trace := func(c *client.Client, ns string) (rate float64, evicted []messages.Key) {
		const prefixes, blocks, rounds = 6, 4, 4 // 24 large blocks: 3/4 of the budget
		hits, lookups := 0, 0
		for r := range rounds {
			for p := range prefixes {
				keys := nsKeys(ns, prefixes*blocks)[p*blocks : (p+1)*blocks]
				req := &messages.ReqContext{RequestID: fmt.Sprintf("%s-%d-%d", ns, r, p)}
				st, err := c.Lookup(ctx, req, keys, true)
				require.NoError(t, err)
				for _, s := range st {
					lookups++
					if s == messages.Hit {
						hits++
					}
				}
				require.NoError(t, c.RequestFinished(ctx, req))
				if st[len(st)-1] != messages.Hit {
					evicted = append(evicted, storeMissing(ctx, t, c, req.RequestID+"-w", keys)...)
				}
			}
		}
		return float64(hits) / float64(lookups), evicted
	}

	alone := openEngineTestNode(t, ctx, "unix", kvtier.Config{PoolBytes: budget})
	b, err := client.Dial(ctx, alone.EngineAddr(), client.Options{Name: "b", BlockBytes: large})
	require.NoError(t, err)
	rateAlone, _ := trace(b, "b")
	require.NoError(t, b.Close(ctx))

	node := openEngineTestNode(t, ctx, "unix", kvtier.Config{PoolBytes: budget})
	a, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: "a", BlockBytes: small})
	require.NoError(t, err)
	defer a.Close(ctx) //nolint:errcheck // closed with the node
	aKeys := nsKeys("a", budget/small)
	store(ctx, t, a, "fill", aKeys)
	b, err = client.Dial(ctx, node.EngineAddr(), client.Options{Name: "b", BlockBytes: large})
	require.NoError(t, err)
	defer b.Close(ctx) //nolint:errcheck // closed with the node
	rate, evicted := trace(b, "b")
	require.InDelta(t, rateAlone, rate, 0.01, "B's hit rate beside an idle A is B's alone")
	require.Positive(t, rate)
	require.Equal(t, aKeys[:24*large/small], evicted, "B took A's least recent blocks, just the bytes it needed")
	requireBudget(ctx, t, node, budget)

	// A wakes: its stores take the bytes back, B's least recent first.
	more := nsKeys("a2", 24*large/small)
	plan := store(ctx, t, a, "wake", more)
	// 48 small blocks: A's 16 older ones' bytes, then 16 of B's 24 (B's
	// least recent first: its prefixes in the trace's order).
	require.Equal(t, aKeys[24*large/small:], plan.Evicted[:16], "A's own older blocks first")
	require.Equal(t, nsKeys("b", 16), plan.Evicted[16:], "then B's least recent, just the bytes needed")
	requireBudget(ctx, t, node, budget)
}

// storeMissing stores the keys of a prefix through c, as an engine stores
// what its lookup missed, and returns what the store evicted.
func storeMissing(ctx context.Context, t *testing.T, c *client.Client, id string, keys []messages.Key) []messages.Key {
	t.Helper()
	req := &messages.ReqContext{RequestID: id}
	plan, err := c.PrepareStore(ctx, req, keys)
	require.NoError(t, err)
	for i, s := range plan.Slots {
		copy(c.Pool().Slot(s), block(string(plan.ToStore[i].Namespace), keyIndexOf(plan.ToStore[i]), c.Hello().BlockBytes))
	}
	if plan.Job != 0 {
		require.NoError(t, c.JobDone(ctx, plan.Job, 0, true))
	}
	require.NoError(t, c.RequestFinished(ctx, req))
	return plan.Evicted
}

// Blocks of two geometries cascade to an fs tier at their own lengths and,
// once evicted from the CPU pool, come back through a promotion into the
// asking engine's geometry, every byte intact.
func TestBlocksOfTwoGeometriesCascadeAndComeBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const small, large, budget = 4096, 3 * 4096, 12 * 4096
	node := openEngineTestNode(t, ctx, "unix", kvtier.Config{PoolBytes: budget,
		SecondaryTiers: []kvtier.TierConfig{{Kind: tiers.KindFS, Root: t.TempDir()}}})
	a, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: "a", BlockBytes: small})
	require.NoError(t, err)
	defer a.Close(ctx) //nolint:errcheck // closed with the node
	b, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: "b", BlockBytes: large})
	require.NoError(t, err)
	defer b.Close(ctx) //nolint:errcheck // closed with the node

	aKeys, bKeys := nsKeys("a", 3), nsKeys("b", 2)
	store(ctx, t, a, "wa", aKeys)
	store(ctx, t, b, "wb", bKeys)
	require.NoError(t, node.TieringIdle(ctx))
	ts, err := node.TieringStats(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(len(aKeys)+len(bKeys)), ts.CascadeWritten["fs"], "both geometries' blocks cascaded")

	store(ctx, t, a, "evict", nsKeys("x", budget/small)) // a's new blocks push every older one out
	// NB: their cascades pin them while they write: a promotion finds room
	// once they are done.
	require.NoError(t, node.TieringIdle(ctx))
	promoted(ctx, t, node, a, aKeys, "evicted from the CPU, found in the fs tier")
	promoted(ctx, t, node, b, bKeys, "evicted from the CPU, found in the fs tier")
	requireBudget(ctx, t, node, budget)
}

// promoted looks keys up through c, an engine of node, as missing from the
// CPU but held elsewhere (why): RETRY, then, once node's tiering is idle,
// every key a HIT in a slot of c's size holding the key's bytes.
func promoted(ctx context.Context, t *testing.T, node *kvtier.Node, c *client.Client, keys []messages.Key, why string) {
	t.Helper()
	req := &messages.ReqContext{RequestID: "r-" + string(keys[0].Namespace)}
	st, err := c.Lookup(ctx, req, keys, true)
	require.NoError(t, err)
	require.Equal(t, messages.Retry, st[0], why)
	require.NoError(t, node.TieringIdle(ctx))
	st, slots, err := c.LookupSlots(ctx, req, keys, true)
	require.NoError(t, err)
	for i, k := range keys {
		require.Equal(t, messages.Hit, st[i], "promoted: %v", k)
		require.Equal(t, block(string(k.Namespace), i, c.Hello().BlockBytes), c.Pool().Slot(slots[i]),
			"promoted into the asker's geometry, every byte intact")
	}
	require.NoError(t, c.RequestFinished(ctx, req))
}

// Blocks of two sizes come from a peer: the producer holds blocks of its
// first size and of a second one; the consumer, whose pool numbers the
// second size's slots differently (a third size came first), finds each
// key at the peer (RETRY), fetches it over the real tcp data plane into a
// slot of the asking engine's size, and its engine reads every byte.
func TestBlocksOfTwoGeometriesComeFromAPeer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const small, large, other, budget = 4096, 3 * 4096, 2 * 4096, 24 * 4096
	const secret = "0123456789abcdef-geometry-peers"
	prod := openEngineTestNode(t, ctx, "unix", kvtier.Config{PoolBytes: budget,
		Peers: kvtier.PeersConfig{NodeID: "prod", Listen: "tcp://127.0.0.1:0", Secret: secret}})
	cons := openEngineTestNode(t, ctx, "unix", kvtier.Config{PoolBytes: budget,
		Peers: kvtier.PeersConfig{NodeID: "cons", Listen: "tcp://127.0.0.1:0", Secret: secret,
			Static: []kvtier.PeerAddr{{NodeID: "prod", Addr: prod.PeerAddr()}}}})
	dial := func(node *kvtier.Node, name string, blockBytes int) *client.Client {
		c, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: name, BlockBytes: blockBytes})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close(context.Background()) }) //nolint:errcheck // closed with the node
		return c
	}
	aKeys, bKeys := nsKeys("a", 3), nsKeys("b", 2)
	store(ctx, t, dial(prod, "a", small), "wa", aKeys)
	prodB := dial(prod, "b", large)
	store(ctx, t, prodB, "wb", bKeys)
	probe := nsKeys("p", 2) // NB: keys of their own: a miss is remembered a while
	store(ctx, t, prodB, "wp", probe)

	first := dial(cons, "first", other) // the consumer's large slots are numbered after these
	require.NoError(t, cons.WaitPeers(ctx, "prod"))
	tooLarge := &messages.ReqContext{RequestID: "too-large"}
	_, err := first.Lookup(ctx, tooLarge, probe, true) // NB: RETRY while the peers are asked
	require.NoError(t, err)
	require.NoError(t, cons.TieringIdle(ctx))
	st, err := first.Lookup(ctx, tooLarge, probe, true)
	require.NoError(t, err)
	require.Equal(t, []messages.LookupStatus{messages.Miss, messages.Miss}, st,
		"a peer's block longer than every slot here is a miss, not a fetch that must fail")
	require.NoError(t, first.RequestFinished(ctx, tooLarge))
	ps, err := cons.PeerStats(ctx)
	require.NoError(t, err)
	require.Equal(t, []uint64{0, 0}, []uint64{ps[0].Hits, ps[0].Failures}, "no hit taken, no round failed")
	a, b := dial(cons, "a", small), dial(cons, "b", large)
	promoted(ctx, t, cons, a, aKeys, "a miss here, held by the peer")
	promoted(ctx, t, cons, b, bKeys, "a miss here, held by the peer")
	ps, err = cons.PeerStats(ctx)
	require.NoError(t, err)
	require.Len(t, ps, 1)
	require.Equal(t, []uint64{5, 3*small + 2*large}, []uint64{ps[0].Fetched, ps[0].FetchBytes}, "each block at its own length")
	require.Zero(t, ps[0].Failures)
	requireBudgetOf(ctx, t, cons, budget, 3)
}

// The residency index holds every block of a size smaller than the pool's
// first: a pool of 16 KiB slots filled with 4 KiB blocks (four times as
// many keys as it has first-size slots) has each of them in the index's
// CPU region, none dropped, so an engine that trusts the index
// (index_complete) never recomputes a block kvtierd holds.
func TestTheIndexHoldsEveryBlockOfASmallerSize(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const first, small, slots = 4 * 4096, 4096, 64
	dir := t.TempDir()
	node, err := kvtier.Open(ctx, kvtier.Config{PoolPath: filepath.Join(dir, "pool"), BlockBytes: first,
		PoolBytes: slots * first, EngineListen: "unix://" + filepath.Join(dir, "engine.sock")})
	require.NoError(t, err)
	testclose.AtCleanup(t, 30*time.Second, node.Close)
	c, err := client.Dial(ctx, node.EngineAddr(), client.Options{Name: "small", BlockBytes: small})
	require.NoError(t, err)
	defer c.Close(ctx) //nolint:errcheck // closed with the node
	require.True(t, c.Hello().IndexComplete, "no tier the index leaves out: engines trust it")

	keys := nsKeys("s", slots*first/small-int(c.Hello().Slots)/8) // NB: room for the session's credit (CreditLimit: less than an eighth)
	for i := 0; i < len(keys); i += 32 {
		store(ctx, t, c, fmt.Sprintf("w%d", i), keys[i:min(i+32, len(keys))])
	}
	require.NoError(t, node.TieringIdle(ctx))
	idx, err := residency.Open(c.Hello().IndexPath)
	require.NoError(t, err)
	defer idx.Close()
	for _, k := range keys {
		require.Equal(t, residency.StateCPU, idx.State(residency.KeyFingerprint(k)), "%v is in the index", k)
	}
}

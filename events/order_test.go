package events

// Parents first: the translator holds a stored block whose parent is being
// written (or held) in any medium and announced in none, and releases it right after the parent, or
// as it is when the parent's write is abandoned; a held block removed
// before it was announced never reaches the wire; provenance given whole
// (promotions, peers) makes full events and joins chains.

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

func note(kind messages.EventKind, med, owner string, keys ...messages.Key) *messages.Event {
	return &messages.Event{Kind: kind, Medium: med, Ownership: owner, Keys: keys}
}

// chainProv is the provenance of block i of the chain a, b, c, ... (2
// tokens a block).
func chainProv(i int) *messages.Provenance {
	p := &messages.Provenance{BlockSize: 2, TokenIDs: []int32{int32(10 * i), int32(10*i + 1)}}
	if i > 0 {
		p.ParentHash = []byte{byte('a' + i - 1)}
	}
	return p
}

func chainKey(i int) messages.Key { return key(string(rune('a'+i)), 0) }

func storedProv(med, owner string, idx ...int) *messages.Event {
	e := &messages.Event{Kind: messages.BlockStored, Medium: med, Ownership: owner}
	for _, i := range idx {
		e.Keys = append(e.Keys, chainKey(i))
		e.Prov = append(e.Prov, chainProv(i))
	}
	return e
}

func hashes(evs []Event) [][]Hash {
	var out [][]Hash
	for _, e := range evs {
		out = append(out, e.BlockHashes)
	}
	return out
}

func h(s string) Hash { return WireHash(s, HashBytes) }

func TestChildWaitsForItsParentsWrite(t *testing.T) {
	tr := NewTranslator(HashBytes)
	// Two jobs: a b (first) and c d (second, the children), c d land first.
	require.Empty(t, tr.Apply(note(messages.BlockWriting, "CPU", "", chainKey(0), chainKey(1))))
	require.Empty(t, tr.Apply(note(messages.BlockWriting, "CPU", "", chainKey(2), chainKey(3))))
	assert.Empty(t, tr.Apply(storedProv("CPU", "", 2, 3)), "c's parent b is being written: c and d wait")
	assert.Equal(t, 2, tr.Holding())
	out := tr.Apply(storedProv("CPU", "", 0, 1))
	require.Len(t, out, 1, "a b then the released c d: one chain, one event")
	assert.Equal(t, []Hash{h("a"), h("b"), h("c"), h("d")}, out[0].BlockHashes)
	assert.Nil(t, out[0].Parent)
	assert.Equal(t, []int32{0, 1, 10, 11, 20, 21, 30, 31}, out[0].TokenIDs, "tokens of provenance-given blocks concatenated")
	assert.Equal(t, 2, out[0].BlockSize)
	assert.Zero(t, tr.Holding())
	assert.Equal(t, uint64(2), tr.Held)
	assert.Zero(t, tr.Placeholders)

	// Across media: a block waits for a parent no medium has announced yet
	// while any medium is writing it (a STORAGE copy must not name a parent
	// whose CPU copy is still held, nor a CPU copy one still being written
	// to disk only).
	require.Empty(t, tr.Apply(note(messages.BlockWriting, "STORAGE", "fs", chainKey(4))))
	assert.Empty(t, tr.Apply(storedProv("CPU", "", 5)), "f waits for e, being written in STORAGE")
	assert.Empty(t, tr.Apply(storedProv("STORAGE", "obj", 5)), "so does its STORAGE copy")
	out = tr.Apply(storedProv("STORAGE", "fs", 4))
	require.Equal(t, [][]Hash{{h("e")}, {h("f")}, {h("f")}}, hashes(out), "f released in both media right behind e")
	assert.Equal(t, []string{"STORAGE", "CPU", "STORAGE"}, []string{out[0].Medium, out[1].Medium, out[2].Medium})

	// Once a parent is announced in one medium, its children go at once in
	// any other, even while that one is still writing the parent.
	require.Empty(t, tr.Apply(note(messages.BlockWriting, "CPU", "", chainKey(6))))
	require.Empty(t, tr.Apply(note(messages.BlockWriting, "STORAGE", "fs", chainKey(6))))
	out = tr.Apply(storedProv("STORAGE", "fs", 6))
	require.Len(t, out, 1)
	out = tr.Apply(storedProv("CPU", "", 7))
	assert.Equal(t, [][]Hash{{h("h")}}, hashes(out), "h's parent g is announced in STORAGE")
}

// The bug a router saw: a parent's CPU copy is held for its own parent's
// write while its child's copy lands on disk. The STORAGE child must wait
// for the parent to be announced anywhere — here in CPU, after the
// grandparent.
func TestStorageChildWaitsForAParentHeldInCPU(t *testing.T) {
	tr := NewTranslator(HashBytes)
	require.Empty(t, tr.Apply(note(messages.BlockWriting, "CPU", "", chainKey(0))))
	require.Empty(t, tr.Apply(note(messages.BlockWriting, "CPU", "", chainKey(1), chainKey(2))))
	require.Empty(t, tr.Apply(storedProv("CPU", "", 1, 2)), "b c wait in CPU for a")
	require.Empty(t, tr.Apply(note(messages.BlockWriting, "STORAGE", "fs", chainKey(2))))
	assert.Empty(t, tr.Apply(storedProv("STORAGE", "fs", 2)), "c on disk waits: b is announced nowhere")
	out := tr.Apply(storedProv("CPU", "", 0))
	require.Equal(t, [][]Hash{{h("a"), h("b"), h("c")}, {h("c")}}, hashes(out))
	assert.Equal(t, []string{"CPU", "STORAGE"}, []string{out[0].Medium, out[1].Medium})
	require.NoError(t, tr.CheckInvariants())
	assert.Zero(t, tr.Holding())
}

func TestAbandonedParentReleasesItsChildren(t *testing.T) {
	tr := NewTranslator(HashBytes)
	tr.Apply(note(messages.BlockWriting, "CPU", "", chainKey(0), chainKey(1)))
	tr.Apply(note(messages.BlockWriting, "CPU", "", chainKey(2)))
	assert.Empty(t, tr.Apply(storedProv("CPU", "", 2)))
	assert.Empty(t, tr.Apply(note(messages.BlockWriteAborted, "CPU", "", chainKey(0))), "c waits for b, not a")
	out := tr.Apply(note(messages.BlockWriteAborted, "CPU", "", chainKey(1)))
	require.Len(t, out, 1, "b will never be held: c goes out as it is")
	assert.Equal(t, []Hash{h("c")}, out[0].BlockHashes)
	assert.Equal(t, h("b"), *out[0].Parent, "its parent is still named")
	assert.Equal(t, map[string][]messages.Key{"CPU": {chainKey(2)}}, tr.Inventory())
}

func TestHeldBlockRemovedNeverReachesTheWire(t *testing.T) {
	tr := NewTranslator(HashBytes)
	tr.Apply(note(messages.BlockWriting, "CPU", "", chainKey(0)))
	tr.Apply(note(messages.BlockWriting, "CPU", "", chainKey(1), chainKey(2)))
	assert.Empty(t, tr.Apply(storedProv("CPU", "", 1, 2)))
	out := tr.Apply(note(messages.BlockRemoved, "CPU", "", chainKey(1)))
	require.Len(t, out, 1, "b evicted while held: no removal; c no longer waits for a parent kvtier will hold")
	assert.Equal(t, TypeBlockStored, out[0].Type)
	assert.Equal(t, []Hash{h("c")}, out[0].BlockHashes)
	assert.Zero(t, tr.UnknownRemovals)
	out = tr.Apply(storedProv("CPU", "", 0))
	assert.Equal(t, [][]Hash{{h("a")}}, hashes(out))
	assert.Len(t, tr.Inventory()["CPU"], 2)

	// A clear drops held copies too.
	tr.Apply(note(messages.BlockWriting, "CPU", "", chainKey(3)))
	tr.Apply(storedProv("CPU", "", 4))
	out = tr.Apply(&messages.Event{Kind: messages.AllBlocksCleared, Medium: "CPU"})
	assert.Equal(t, []Event{{Type: TypeAllBlocksCleared}}, out)
	assert.Zero(t, tr.Holding())
	assert.Equal(t, [][]Hash{{h("d")}}, hashes(tr.Apply(storedProv("CPU", "", 3))), "d lands after the clear; e, held for it, went with the clear")
}

func TestHoldingNeverFormsACycle(t *testing.T) {
	tr := NewTranslator(HashBytes)
	x, y := key("x", 0), key("y", 0)
	px := &messages.Provenance{ParentHash: []byte("y"), BlockSize: 1, TokenIDs: []int32{1}}
	py := &messages.Provenance{ParentHash: []byte("x"), BlockSize: 1, TokenIDs: []int32{2}}
	tr.Apply(note(messages.BlockWriting, "CPU", "", x, y))
	assert.Empty(t, tr.Apply(&messages.Event{Kind: messages.BlockStored, Medium: "CPU", Keys: []messages.Key{x}, Prov: []*messages.Provenance{px}}))
	out := tr.Apply(&messages.Event{Kind: messages.BlockStored, Medium: "CPU", Keys: []messages.Key{y}, Prov: []*messages.Provenance{py}})
	assert.Equal(t, [][]Hash{{h("y"), h("x")}}, hashes(out), "y would wait on x waiting on y: announced, then x")
	assert.Zero(t, tr.Holding())
}

func TestProvenanceMixesWithContextsInOneChain(t *testing.T) {
	tr := NewTranslator(HashBytes)
	// a (promoted, provenance) then b c (stored by a call whose parent is a).
	call := []messages.Key{chainKey(1), chainKey(2)}
	ctx := &messages.ReqContext{RequestID: "r", BlockSize: 2, TokenIDs: []int32{10, 11, 20, 21}, ParentBlockHash: []byte("a"),
		ExtraKeys: []string{"salt"}}
	tr.Apply(note(messages.BlockWriting, "CPU", "", chainKey(0)))
	assert.Empty(t, tr.Apply(&messages.Event{Kind: messages.BlockStored, Medium: "CPU", Keys: call, Ctx: ctx,
		Place: messages.Place(call, call, []byte("a"))}))
	out := tr.Apply(storedProv("CPU", "", 0))
	require.Len(t, out, 1)
	assert.Equal(t, []Hash{h("a"), h("b"), h("c")}, out[0].BlockHashes)
	assert.Equal(t, []int32{0, 1, 10, 11, 20, 21}, out[0].TokenIDs)
	assert.Equal(t, [][]string{nil, {"salt"}, {"salt"}}, out[0].ExtraKeys, "extra keys per block")

	// A context's consecutive blocks alias its token ids: no copy.
	tr2 := NewTranslator(HashBytes)
	out = tr2.Apply(&messages.Event{Kind: messages.BlockStored, Medium: "CPU", Keys: call, Ctx: ctx,
		Place: messages.Place(call, call, []byte("a"))})
	require.Len(t, out, 1)
	assert.Same(t, &ctx.TokenIDs[0], &out[0].TokenIDs[0])
	assert.Equal(t, 4, cap(out[0].TokenIDs), "clipped: appending never writes into the context")

	// A placeholder never joins a full chain.
	tr3 := NewTranslator(HashBytes)
	bare := &messages.Provenance{ParentHash: []byte("a"), BlockSize: 2}
	out = tr3.Apply(&messages.Event{Kind: messages.BlockStored, Medium: "CPU", Keys: []messages.Key{chainKey(0), chainKey(1)},
		Prov: []*messages.Provenance{chainProv(0), bare}})
	assert.Equal(t, [][]Hash{{h("a")}, {h("b")}}, hashes(out))
	assert.Empty(t, out[1].TokenIDs)
	assert.Equal(t, uint64(1), tr3.Placeholders)
}

// A seeded random history of writes begun, landed, abandoned, copies
// removed (alone, or with the same tier's copies of their children in one
// removal, in any order: held parents with their held children) and tiers
// cleared, over one prefix chain in two tiers of two media. After every
// step the bookkeeping is consistent; no block reaches the wire before a
// parent some tier of some medium holds or is writing is announced in one; the wire never removes
// a block it does not hold announced, never stores one the tiers no longer
// hold (nor one it holds already, nor one removed earlier in the same
// output) and never holds one the tiers do not. Once every write has ended,
// nothing is held and the wire's stored − removed is what the tiers hold.
func TestRandomHistoriesKeepParentsFirst(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { randomHistory(t, seed) })
	}
}

func randomHistory(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 42))
	const n = 12
	media, owners := []string{"CPU", "STORAGE"}, []string{"x", "y"}
	tr := NewTranslator(HashBytes)
	type copyKey struct {
		med, owner string
		i          int
	}
	holds := map[copyKey]bool{}   // readable in that tier
	writing := map[copyKey]bool{} // write in flight
	wire := map[string]map[string]bool{}
	heldBy := func(med string, i int) bool {
		for _, o := range owners {
			if holds[copyKey{med, o, i}] {
				return true
			}
		}
		return false
	}
	writtenBy := func(med string, i int) bool {
		return writing[copyKey{med, "x", i}] || writing[copyKey{med, "y", i}]
	}
	// pending: some tier of some medium holds i or is writing it.
	pending := func(i int) bool {
		for _, med := range media {
			if heldBy(med, i) || writtenBy(med, i) {
				return true
			}
		}
		return false
	}
	// announced: the wire says some medium holds i.
	announced := func(i int) bool {
		for _, m := range wire {
			if m[string(rune('a'+i))] {
				return true
			}
		}
		return false
	}
	step := 0
	apply := func(e *messages.Event) {
		out := tr.Apply(e)
		removedNow := map[string]bool{}
		for _, w := range out {
			m := wire[w.Medium]
			if m == nil {
				m = map[string]bool{}
				wire[w.Medium] = m
			}
			switch w.Type {
			case TypeBlockStored:
				for j, hh := range w.BlockHashes {
					i := int(hh.Bytes[0] - 'a')
					if j == 0 && i > 0 && pending(i-1) {
						require.True(t, announced(i-1), "seed %d step %d: %c announced in %s before its parent, held or being written in some medium, was announced in any", seed, step, 'a'+i, w.Medium)
					}
					require.False(t, removedNow[w.Medium+string(hh.Bytes)], "seed %d step %d: %s %c stored after its removal in the same output %v", seed, step, w.Medium, 'a'+i, out)
					require.True(t, heldBy(w.Medium, i), "seed %d step %d: %s %c stored, but no tier there holds it (%v → %v)", seed, step, w.Medium, 'a'+i, e, out)
					require.False(t, m[string(hh.Bytes)], "seed %d step %d: %s %c stored twice", seed, step, w.Medium, 'a'+i)
					m[string(hh.Bytes)] = true
				}
			case TypeBlockRemoved:
				for _, hh := range w.BlockHashes {
					require.True(t, m[string(hh.Bytes)], "seed %d step %d: %s %c removed, not announced stored (%v → %v)", seed, step, w.Medium, 'a'+int(hh.Bytes[0]-'a'), e, out)
					delete(m, string(hh.Bytes))
					removedNow[w.Medium+string(hh.Bytes)] = true
				}
			case TypeAllBlocksCleared:
				clear(wire)
			}
		}
		require.NoError(t, tr.CheckInvariants(), "seed %d step %d", seed, step)
		for med, m := range wire {
			for hh := range m {
				require.True(t, heldBy(med, int(hh[0]-'a')), "seed %d step %d: %s %s on the wire, held by no tier there", seed, step, med, hh)
			}
		}
	}
	for ; step < 300; step++ {
		c := copyKey{media[rng.IntN(2)], owners[rng.IntN(2)], rng.IntN(n)}
		switch op := rng.IntN(12); {
		case op < 3 && !holds[c] && !writing[c]:
			writing[c] = true
			apply(note(messages.BlockWriting, c.med, c.owner, chainKey(c.i)))
		case op < 6 && writing[c]:
			delete(writing, c)
			holds[c] = true
			apply(storedProv(c.med, c.owner, c.i))
		case op < 7 && writing[c]:
			delete(writing, c)
			apply(note(messages.BlockWriteAborted, c.med, c.owner, chainKey(c.i)))
		case op < 9 && holds[c]:
			delete(holds, c)
			apply(note(messages.BlockRemoved, c.med, c.owner, chainKey(c.i)))
		case op < 11 && holds[c]:
			// c and the same tier's copies of the children after it, often
			// held for c (or for c's parent) themselves; in any order.
			keys := []messages.Key{chainKey(c.i)}
			delete(holds, c)
			for j := c.i + 1; j < n && rng.IntN(4) > 0; j++ {
				d := copyKey{c.med, c.owner, j}
				if !holds[d] {
					break
				}
				delete(holds, d)
				keys = append(keys, chainKey(j))
			}
			rng.Shuffle(len(keys), func(a, b int) { keys[a], keys[b] = keys[b], keys[a] })
			apply(note(messages.BlockRemoved, c.med, c.owner, keys...))
		case op == 11 && rng.IntN(8) == 0:
			for d := range holds {
				if d.med == c.med && d.owner == c.owner {
					delete(holds, d)
				}
			}
			apply(note(messages.AllBlocksCleared, c.med, c.owner))
		}
	}
	for c := range writing {
		delete(writing, c)
		apply(note(messages.BlockWriteAborted, c.med, c.owner, chainKey(c.i)))
	}
	require.Zero(t, tr.Holding(), "seed %d: every write ended, nothing held", seed)
	for _, med := range media {
		want := map[string]bool{}
		for i := range n {
			if heldBy(med, i) {
				want[string(rune('a'+i))] = true
			}
		}
		if len(want) == 0 {
			want = nil
		}
		got := wire[med]
		if len(got) == 0 {
			got = nil
		}
		require.Equal(t, want, got, "seed %d: %s stored − removed = what the tiers hold", seed, med)
	}
}

// BenchmarkTranslatorStoreCycle is one engine store of 64 blocks as the hub
// sees it: the reservation's note, the commit's stored event (one chain,
// tokens aliased) and, later, the blocks' eviction.
func BenchmarkTranslatorStoreCycle(b *testing.B) {
	const n, bs = 64, 16
	ctx := &messages.ReqContext{RequestID: "r", BlockSize: bs, TokenIDs: make([]int32, n*bs)}
	keys := make([]messages.Key, n)
	tr := NewTranslator(HashInt)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for j := range keys {
			var h [8]byte
			binary.BigEndian.PutUint64(h[:], uint64(i*n+j))
			keys[j] = messages.Key{Namespace: "ns", Hash: string(h[:])}
		}
		place := messages.Place(keys, keys, nil)
		tr.Apply(&messages.Event{Kind: messages.BlockWriting, Medium: "CPU", Keys: keys})
		out := tr.Apply(&messages.Event{Kind: messages.BlockStored, Medium: "CPU", Keys: keys, Ctx: ctx, Place: place})
		if len(out) != 1 || len(out[0].BlockHashes) != n {
			b.Fatalf("%d events", len(out))
		}
		tr.Apply(&messages.Event{Kind: messages.BlockRemoved, Medium: "CPU", Keys: keys})
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/block")
}

// vLLM 0.33's BlockStored fields: the spec kind, sliding window and session
// the request gave, else the configured kind; a stored block's provenance
// (promoted, from a peer) carries none of them. They survive the wire.
func TestSpecKindWindowAndSessionReachTheWire(t *testing.T) {
	tr := NewTranslator(HashInt)
	tr.SpecKind = "full_attention"
	ctx := &messages.ReqContext{RequestID: "r", BlockSize: 2, TokenIDs: []int32{1, 2},
		SpecKind: "sliding_window", SlidingWindow: 4096, SessionID: "chat-7"}
	out := tr.Apply(&messages.Event{Kind: messages.BlockStored, Medium: "CPU", Keys: []messages.Key{chainKey(0)},
		Ctx: ctx, Place: []messages.Placement{{Index: 0}}})
	require.Len(t, out, 1)
	assert.Equal(t, "sliding_window", out[0].SpecKind)
	require.NotNil(t, out[0].Window)
	assert.Equal(t, int64(4096), *out[0].Window)
	assert.Equal(t, "chat-7", out[0].SessionID)
	out = append(out, tr.Apply(storedProv("CPU", "", 1))...)
	require.Len(t, out, 2, "other meta: another event")
	assert.Equal(t, "full_attention", out[1].SpecKind, "the configured kind when the source says none")
	assert.Nil(t, out[1].Window)
	assert.Empty(t, out[1].SessionID)

	payload, err := EncodeBatch(&Batch{TS: 1, Events: out})
	require.NoError(t, err)
	back, err := DecodeBatch(payload)
	require.NoError(t, err)
	assert.Equal(t, out, back.Events)
}

package events

// Removals that cover held-back blocks: a block held for its parent and
// removed before it was announced never reaches the wire, neither stored
// nor removed, even when the same removal covers its held parent (whose
// removal would otherwise release it) — and the wire's stored − removed per
// medium stays what the tiers hold.

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

// wireModel is a subscriber: it applies a translator's output and fails the
// test on a removal of a block it does not hold, a store of a block it
// already holds, or a store of a block removed earlier in the same output.
type wireModel struct {
	t    *testing.T
	held map[string]map[string]bool // medium → wire hash → held
}

// newWired is a fresh translator, and the wire model of what it publishes.
func newWired(t *testing.T) (*Translator, *wireModel) {
	return NewTranslator(HashBytes), &wireModel{t: t, held: map[string]map[string]bool{}}
}

func (w *wireModel) apply(out []Event) []Event {
	w.t.Helper()
	removedNow := map[string]bool{}
	for _, e := range out {
		m := w.held[e.Medium]
		if m == nil {
			m = map[string]bool{}
			w.held[e.Medium] = m
		}
		switch e.Type {
		case TypeBlockStored:
			for _, hh := range e.BlockHashes {
				k := string(hh.Bytes)
				require.False(w.t, removedNow[e.Medium+"/"+k], "%s %q stored after its removal in the same output %v", e.Medium, k, out)
				require.False(w.t, m[k], "%s %q stored twice", e.Medium, k)
				m[k] = true
			}
		case TypeBlockRemoved:
			for _, hh := range e.BlockHashes {
				k := string(hh.Bytes)
				require.True(w.t, m[k], "%s %q removed but never announced stored: %v", e.Medium, k, out)
				delete(m, k)
				removedNow[e.Medium+"/"+k] = true
			}
		case TypeAllBlocksCleared:
			clear(w.held)
		}
	}
	return out
}

// inventory is the model's holdings in the translator's Inventory shape.
func (w *wireModel) inventory() map[string][]string {
	out := map[string][]string{}
	for med, m := range w.held {
		for k := range m {
			out[med] = append(out[med], k)
		}
		slices.Sort(out[med])
	}
	return out
}

// agrees checks the model holds what tr says the tiers hold, and tr's
// invariants.
func (w *wireModel) agrees(tr *Translator) {
	w.t.Helper()
	assert.Equal(w.t, w.inventory(), inventoryHashes(tr))
	require.NoError(w.t, tr.CheckInvariants())
}

func inventoryHashes(tr *Translator) map[string][]string {
	out := map[string][]string{}
	for med, keys := range tr.Inventory() {
		for _, k := range keys {
			out[med] = append(out[med], k.Hash)
		}
		slices.Sort(out[med])
	}
	return out
}

// heldChain sets up, in med for owner, the chain z ← y ← x: z being
// written, y and x stored and held (y for z, x for y). It returns z, y, x.
func heldChain(t *testing.T, tr *Translator, w *wireModel, med, owner string) (z, y, x messages.Key) {
	t.Helper()
	z, y, x = chainKey(0), chainKey(1), chainKey(2)
	require.Empty(t, w.apply(tr.Apply(note(messages.BlockWriting, med, owner, z))))
	require.Empty(t, w.apply(tr.Apply(storedProv(med, owner, 1))), "y waits for z")
	require.Empty(t, w.apply(tr.Apply(storedProv(med, owner, 2))), "x waits for y, itself held")
	require.Equal(t, 2, tr.Holding())
	return z, y, x
}

func removal(med, owner string, keys ...messages.Key) *messages.Event {
	return note(messages.BlockRemoved, med, owner, keys...)
}

// The chaos run's sequence: BlockWriting[z]; BlockStored[y, parent z];
// BlockStored[x, parent y]; BlockRemoved[y, x].
func TestRemovingHeldParentAndHeldChildAnnouncesNeither(t *testing.T) {
	for _, order := range []string{"y x", "x y"} {
		t.Run(order, func(t *testing.T) {
			tr, w := newWired(t)
			z, y, x := heldChain(t, tr, w, "CPU", "")
			keys := []messages.Key{y, x}
			if order == "x y" {
				keys = []messages.Key{x, y}
			}
			assert.Empty(t, w.apply(tr.Apply(removal("CPU", "", keys...))),
				"both held and both removed: never announced, so neither stored nor removed")
			assert.Zero(t, tr.Holding())
			assert.Zero(t, tr.UnknownRemovals, "held copies are known")
			assert.Empty(t, tr.Inventory())
			require.NoError(t, tr.CheckInvariants())

			// z's write completes: z alone.
			assert.Equal(t, [][]Hash{{h("a")}}, hashes(w.apply(tr.Apply(storedProv("CPU", "", 0)))))
			assert.Equal(t, w.inventory(), inventoryHashes(tr))
			assert.Equal(t, []messages.Key{z}, tr.Inventory()["CPU"])
		})
	}
}

func TestRemovingHeldChainThenParentsWriteFails(t *testing.T) {
	tr, w := newWired(t)
	z, y, x := heldChain(t, tr, w, "CPU", "")
	assert.Empty(t, w.apply(tr.Apply(removal("CPU", "", y, x))))
	assert.Empty(t, w.apply(tr.Apply(note(messages.BlockWriteAborted, "CPU", "", z))), "nothing left waiting on z")
	assert.Zero(t, tr.Holding())
	assert.Empty(t, tr.Inventory())
	assert.Empty(t, w.inventory())
	require.NoError(t, tr.CheckInvariants())
}

func TestRemovingOnlyTheHeldChild(t *testing.T) {
	tr, w := newWired(t)
	_, _, x := heldChain(t, tr, w, "CPU", "")
	assert.Empty(t, w.apply(tr.Apply(removal("CPU", "", x))), "x goes silently; y still waits for z")
	assert.Equal(t, 1, tr.Holding())
	out := w.apply(tr.Apply(storedProv("CPU", "", 0)))
	assert.Equal(t, [][]Hash{{h("a"), h("b")}}, hashes(out), "z then the released y, one chain; never x")
	w.agrees(tr)
}

func TestRemovingOnlyTheHeldParent(t *testing.T) {
	tr, w := newWired(t)
	_, y, _ := heldChain(t, tr, w, "CPU", "")
	out := w.apply(tr.Apply(removal("CPU", "", y)))
	require.Equal(t, [][]Hash{{h("c")}}, hashes(out), "y goes silently; x no longer waits for a parent kvtier will hold")
	assert.Equal(t, h("b"), *out[0].Parent, "x's parent still named")
	assert.Zero(t, tr.Holding())
	assert.Equal(t, [][]Hash{{h("a")}}, hashes(w.apply(tr.Apply(storedProv("CPU", "", 0)))))
	w.agrees(tr)
}

// Five generations held on a (a ← b ← c ← d ← e ← f), removed in parts and
// in orders that put children before parents.
func TestRemovingHeldGenerations(t *testing.T) {
	setup := func(t *testing.T) (*Translator, *wireModel) {
		tr, w := newWired(t)
		require.Empty(t, w.apply(tr.Apply(note(messages.BlockWriting, "CPU", "", chainKey(0)))))
		require.Empty(t, w.apply(tr.Apply(storedProv("CPU", "", 1, 2))))
		require.Empty(t, w.apply(tr.Apply(storedProv("CPU", "", 3))))
		require.Empty(t, w.apply(tr.Apply(storedProv("CPU", "", 4, 5))))
		require.Equal(t, 5, tr.Holding())
		return tr, w
	}
	ks := func(idx ...int) []messages.Key {
		var out []messages.Key
		for _, i := range idx {
			out = append(out, chainKey(i))
		}
		return out
	}
	t.Run("all", func(t *testing.T) {
		tr, w := setup(t)
		assert.Empty(t, w.apply(tr.Apply(removal("CPU", "", ks(5, 3, 1, 4, 2)...))))
		assert.Zero(t, tr.Holding())
		assert.Equal(t, [][]Hash{{h("a")}}, hashes(w.apply(tr.Apply(storedProv("CPU", "", 0)))))
		w.agrees(tr)
	})
	t.Run("middle", func(t *testing.T) {
		tr, w := setup(t)
		out := w.apply(tr.Apply(removal("CPU", "", ks(4, 2, 3)...)))
		require.Equal(t, [][]Hash{{h("f")}}, hashes(out), "f's parent e is gone: f goes as it is; c d e never")
		assert.Equal(t, h("e"), *out[0].Parent)
		assert.Equal(t, 1, tr.Holding(), "b still waits for a")
		assert.Equal(t, [][]Hash{{h("a"), h("b")}}, hashes(w.apply(tr.Apply(storedProv("CPU", "", 0)))))
		w.agrees(tr)
	})
	t.Run("tail", func(t *testing.T) {
		tr, w := setup(t)
		assert.Empty(t, w.apply(tr.Apply(removal("CPU", "", ks(5, 4, 3)...))))
		assert.Equal(t, 2, tr.Holding())
		out := w.apply(tr.Apply(note(messages.BlockWriteAborted, "CPU", "", chainKey(0))))
		assert.Equal(t, [][]Hash{{h("b"), h("c")}}, hashes(out), "a failed: b c go as they are")
		w.agrees(tr)
	})
}

// The same chain held in two media: a removal in one leaves the other's
// held blocks alone.
func TestRemovingHeldChainInOneMediumOnly(t *testing.T) {
	tr, w := newWired(t)
	z, y, x := heldChain(t, tr, w, "CPU", "")
	require.Empty(t, w.apply(tr.Apply(note(messages.BlockWriting, "STORAGE", "fs", z))))
	require.Empty(t, w.apply(tr.Apply(storedProv("STORAGE", "fs", 1, 2))))
	require.Equal(t, 4, tr.Holding())

	assert.Empty(t, w.apply(tr.Apply(removal("CPU", "", x, y))))
	assert.Equal(t, 2, tr.Holding(), "STORAGE's y and x still wait for its z")
	out := w.apply(tr.Apply(storedProv("STORAGE", "fs", 0)))
	require.Len(t, out, 1)
	assert.Equal(t, "STORAGE", out[0].Medium)
	assert.Equal(t, []Hash{h("a"), h("b"), h("c")}, out[0].BlockHashes)
	assert.Equal(t, [][]Hash{{h("a")}}, hashes(w.apply(tr.Apply(storedProv("CPU", "", 0)))))
	assert.Equal(t, w.inventory(), inventoryHashes(tr))
	assert.ElementsMatch(t, []string{"a"}, w.inventory()["CPU"])
	require.NoError(t, tr.CheckInvariants())
}

// Two tiers of one medium: fs's held y and x are removed while obj holds
// its own copy of x back for y. obj's x, no longer waiting for a parent
// kvtier will hold, is the one announced.
func TestRemovingHeldChainReleasesAnotherTiersChild(t *testing.T) {
	tr, w := newWired(t)
	_, y, x := heldChain(t, tr, w, "STORAGE", "fs")
	require.Empty(t, w.apply(tr.Apply(storedProv("STORAGE", "obj", 2))), "obj's x waits for y too")
	out := w.apply(tr.Apply(removal("STORAGE", "fs", y, x)))
	require.Equal(t, [][]Hash{{h("c")}}, hashes(out))
	assert.Equal(t, "obj", out[0].Ownership, "the copy that stays is obj's")
	assert.Zero(t, tr.Holding())
	w.agrees(tr)
}

// A removal of fs's announced x and its held y releases obj's x, held for
// y: x stays in the medium throughout, so the wire sees nothing — not a
// removal of x followed by its store.
func TestRemovalThatReleasesAnotherCopyIsSilent(t *testing.T) {
	for _, order := range []string{"y x", "x y"} {
		t.Run(order, func(t *testing.T) {
			tr, w := newWired(t)
			y, x := chainKey(1), chainKey(2)
			require.Len(t, w.apply(tr.Apply(storedProv("STORAGE", "fs", 2))), 1, "fs's x: y is not being written")
			require.Empty(t, w.apply(tr.Apply(note(messages.BlockWriting, "STORAGE", "fs", chainKey(0)))))
			require.Empty(t, w.apply(tr.Apply(storedProv("STORAGE", "fs", 1))), "fs's y waits for z")
			require.Empty(t, w.apply(tr.Apply(storedProv("STORAGE", "obj", 2))), "obj's x waits for y")
			keys := []messages.Key{y, x}
			if order == "x y" {
				keys = []messages.Key{x, y}
			}
			assert.Empty(t, w.apply(tr.Apply(removal("STORAGE", "fs", keys...))), "x never left the medium")
			assert.Equal(t, map[string][]messages.Key{"STORAGE": {x}}, tr.Inventory())
			assert.Zero(t, tr.Holding())
			require.NoError(t, tr.CheckInvariants())
		})
	}
}

// A clear of a tier drops its held blocks all at once: a held child whose
// held parent the clear also drops is not released by it. (The clear walks
// a map; repeat to cover its orders.)
func TestClearingHeldParentAndHeldChildAnnouncesNeither(t *testing.T) {
	for range 32 {
		tr, w := newWired(t)
		heldChain(t, tr, w, "CPU", "")
		require.Len(t, w.apply(tr.Apply(storedProv("STORAGE", "fs", 5))), 1, "STORAGE holds something: the clear is removals")
		assert.Empty(t, w.apply(tr.Apply(&messages.Event{Kind: messages.AllBlocksCleared, Medium: "CPU"})))
		assert.Zero(t, tr.Holding())
		assert.Equal(t, [][]Hash{{h("a")}}, hashes(w.apply(tr.Apply(storedProv("CPU", "", 0)))))
		w.agrees(tr)
	}
}

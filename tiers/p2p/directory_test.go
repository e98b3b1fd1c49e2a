package p2p

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/messages"
)

// The directory is plain data: these drive it with batches as a peer's
// event stream delivers them, and ask it whom a lookup should go to.

func dkey(i uint64) messages.Key {
	var h [32]byte
	binary.BigEndian.PutUint64(h[24:], i) // the low 64 bits are what events carry
	h[0] = 0xee                           // high bytes events do not carry
	return messages.Key{Namespace: "ns", Hash: string(h[:])}
}

func intHashes(ids ...uint64) []events.Hash {
	out := make([]events.Hash, len(ids))
	for i, id := range ids {
		out[i] = events.Hash{Int: id}
	}
	return out
}

func stored(medium string, ids ...uint64) events.Event {
	return events.Event{Type: events.TypeBlockStored, Medium: medium, BlockHashes: intHashes(ids...)}
}

func removed(medium string, ids ...uint64) events.Event {
	return events.Event{Type: events.TypeBlockRemoved, Medium: medium, BlockHashes: intHashes(ids...)}
}

func batch(evs ...events.Event) *events.Batch { return &events.Batch{Events: evs} }

var (
	peerA = peerRef{node: "a"}
	peerB = peerRef{node: "b"}
	peerC = peerRef{node: "c"}
	all   = []peerRef{peerA, peerB, peerC}
)

func nodes(ps []peerRef) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.node
	}
	return out
}

func TestDirectoryNamesOnlyThePeersWhoseCPUTierHoldsAKey(t *testing.T) {
	d := newDirectory(100)
	for _, p := range all {
		d.watch(p.node)
	}
	d.apply("a", 0, 0, batch(stored(messages.MediumCPU, 1, 2, 3)))
	d.apply("b", 0, 0, batch(stored(messages.MediumStorage, 1, 2, 3), stored(messages.MediumCPU, 9)))
	d.apply("c", 0, 0, batch())

	assert.Equal(t, []string{"a"}, nodes(d.holders(all, []messages.Key{dkey(2)})), "b holds 2 on disk only: peers serve their CPU tier")
	assert.Equal(t, []string{"a", "b"}, nodes(d.holders(all, []messages.Key{dkey(3), dkey(9)})))
	assert.Empty(t, d.holders(all, []messages.Key{dkey(7)}), "nobody holds 7 and every set is complete: nobody is asked")
	d.watch("fresh")
	assert.Equal(t, []string{"fresh"}, nodes(d.holders(append(all, peerRef{node: "fresh"}), []messages.Key{dkey(7)})),
		"a peer whose stream has not been read yet may hold anything")

	d.apply("a", 1, 0, batch(removed(messages.MediumStorage, 2)))
	assert.Equal(t, []string{"a"}, nodes(d.holders(all, []messages.Key{dkey(2)})), "a removal from another medium is not one from the CPU tier")
	d.apply("a", 2, 0, batch(removed(messages.MediumCPU, 2)))
	assert.Empty(t, d.holders(all, []messages.Key{dkey(2)}))
	d.apply("a", 3, 0, batch(events.Event{Type: events.TypeAllBlocksCleared}))
	assert.Empty(t, d.holders(all, []messages.Key{dkey(1)}), "a clear empties the peer's set")

	keys, bytes := d.size()
	assert.Equal(t, 1, keys, "only b's 9 is left")
	assert.Equal(t, int64(directoryEntryBytes), bytes)
}

func TestDirectoryAsksPeersItCannotVouchForOnlyWhenNoneIsNamed(t *testing.T) {
	d := newDirectory(100)
	d.watch("a")
	d.watch("b")
	d.apply("a", 0, 0, batch(stored(messages.MediumCPU, 1)))
	d.apply("b", 5, 0, batch(stored(messages.MediumCPU, 2))) // joined late: batches 0-4 unknown
	// c is not watched at all (no event addresses).

	assert.Equal(t, []string{"a"}, nodes(d.holders(all, []messages.Key{dkey(1)})), "a complete holder is enough")
	assert.Equal(t, []string{"b"}, nodes(d.holders(all, []messages.Key{dkey(2)})))
	assert.Equal(t, []string{"b", "c"}, nodes(d.holders(all, []messages.Key{dkey(3)})),
		"nobody named: ask the peers whose sets may be missing it")
	assert.Equal(t, []string{"a"}, nodes(d.holders([]peerRef{peerA}, []messages.Key{dkey(1)})), "only candidates are returned")
}

func TestDirectoryMarksAGapIncomplete(t *testing.T) {
	cases := []struct {
		name     string
		seqs     []uint64
		missed   uint64
		complete bool
	}{
		{"from the first batch, in order", []uint64{0, 1, 2}, 0, true},
		{"started after the first batch", []uint64{3, 4}, 0, false},
		{"a batch skipped", []uint64{0, 1, 3}, 0, false},
		{"a batch the subscriber could not replay", []uint64{0, 1, 2}, 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newDirectory(100)
			d.watch("a")
			for i, seq := range tc.seqs {
				missed := uint64(0)
				if i == len(tc.seqs)-1 {
					missed = tc.missed
				}
				d.apply("a", seq, missed, batch(stored(messages.MediumCPU, seq)))
			}
			assert.Equal(t, tc.complete, d.peers["a"].complete)
		})
	}
}

func TestDirectoryBoundsEachPeersSet(t *testing.T) {
	d := newDirectory(2)
	d.watch("a")
	d.apply("a", 0, 0, batch(stored(messages.MediumCPU, 1, 2, 3)))
	p := d.peers["a"]
	require.Len(t, p.keys, 2)
	assert.Equal(t, uint64(1), p.overflow)
	assert.False(t, p.complete, "a key it could not record may be there: the peer is asked when nobody is named")
	assert.Equal(t, []string{"a"}, nodes(d.holders([]peerRef{peerA}, []messages.Key{dkey(3)})))
}

func TestDirectoryReadsBytesFormatHashesAsTheirLow64Bits(t *testing.T) {
	d := newDirectory(100)
	d.watch("a")
	k := dkey(42)
	d.apply("a", 0, 0, batch(events.Event{Type: events.TypeBlockStored, Medium: messages.MediumCPU,
		BlockHashes: []events.Hash{{Bytes: []byte(k.Hash), IsBytes: true}}}))
	assert.Equal(t, []string{"a"}, nodes(d.holders([]peerRef{peerA}, []messages.Key{dkey(42)})))
	assert.Empty(t, d.holders([]peerRef{peerA}, []messages.Key{dkey(43)}))
}

func TestDirectoryForgetsAPeerAndStartsItOverOnWatch(t *testing.T) {
	d := newDirectory(100)
	d.watch("a")
	d.apply("a", 0, 0, batch(stored(messages.MediumCPU, 1)))
	d.forget("a")
	d.apply("a", 1, 0, batch(stored(messages.MediumCPU, 2))) // a late batch of the old stream
	assert.Nil(t, d.peers["a"], "a forgotten peer records nothing")
	d.watch("a")
	assert.Empty(t, d.peers["a"].keys, "a restarted peer's set is rebuilt from its stream")
	assert.Equal(t, []string{"a"}, nodes(d.holders([]peerRef{peerA}, []messages.Key{dkey(1)})),
		"but nothing is read yet, and its first batch decides: asked meanwhile")
}

// A key is fetched from one peer: the directory names the fewest peers that
// together hold what any holds, the longest cached prefix first.
func TestDirectoryNamesTheFewestPeersThatCoverTheKeys(t *testing.T) {
	cases := []struct {
		name string
		held map[string][]uint64
		want []string
	}{
		{"one peer holds the whole prefix", map[string][]uint64{"a": {1, 2, 3, 4}, "b": {1, 2, 3, 4, 5, 6}, "c": {1, 2}}, []string{"b"}},
		{"no peer holds it all", map[string][]uint64{"a": {1, 2}, "b": {5, 6}, "c": {1, 2, 3}}, []string{"c", "b"}},
		{"ties go to the earlier peer", map[string][]uint64{"a": {1, 2}, "b": {1, 2}, "c": {1, 2}}, []string{"a"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newDirectory(100)
			for node, ids := range tc.held {
				d.watch(node)
				d.apply(node, 0, 0, batch(stored(messages.MediumCPU, ids...)))
			}
			keys := []messages.Key{dkey(1), dkey(2), dkey(3), dkey(4), dkey(5), dkey(6)}
			assert.Equal(t, tc.want, nodes(d.holders(all, keys)))
		})
	}
}

func TestDirectoryVouchesForAPeerThatHasPublishedNothing(t *testing.T) {
	d := newDirectory(100)
	d.watch("a")
	d.watch("b")
	d.empty("a") // a's replay from its first batch found none
	assert.Equal(t, []string{"b"}, nodes(d.holders([]peerRef{peerA, peerB}, []messages.Key{dkey(1)})),
		"a has stored nothing: only b, whose stream is not read yet, may hold the key")
	d.apply("a", 0, 0, batch(stored(messages.MediumCPU, 1)))
	assert.True(t, d.peers["a"].complete, "its first batch follows")
	d.empty("a") // a late replay result changes nothing once batches were read
	assert.Equal(t, []string{"a"}, nodes(d.holders([]peerRef{peerA, peerB}, []messages.Key{dkey(1)})))

	d.watch("c")
	d.apply("c", 4, 0, batch())
	d.empty("c")
	assert.False(t, d.peers["c"].complete, "batches were read first: the replay result is stale")
}

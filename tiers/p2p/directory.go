package p2p

// The directory: which peer holds which block in its CPU tier, as that
// peer's own KV events announce it (its BlockStored and BlockRemoved events
// of the CPU medium). With it a miss asks only the peers that hold one of
// its keys, instead of every ready peer.
//
// It is a hint, never an authority: a peer's Lookup answer decides. An entry
// the peer no longer holds (an event not yet seen) costs one MISS; a block
// it holds but the directory has not seen yet (the event still in flight)
// costs one missed peer hit. Memory is bounded per peer; a peer whose
// stream this node could not read from its first batch, or whose set
// overflowed, is "incomplete" and is asked when no complete peer is named,
// as before the directory.
//
// Keys are recorded by the low 64 bits of their block hash, the form vLLM's
// events carry by default (events.HashInt; a bytes-format stream is reduced
// the same way): a collision between namespaces or groups is a stale entry,
// never a wrong block.

import (
	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/messages"
)

// directoryEntryBytes is what one recorded key costs, for the bound and the
// figures: a Go map of uint64 to struct{} takes about this much per entry at
// its usual load.
const directoryEntryBytes = 24

// directory is plain data, owned by the tier actor.
type directory struct {
	maxKeys int // per peer
	peers   map[string]*peerKeys
}

// peerKeys is one peer's recorded CPU-tier keys.
type peerKeys struct {
	keys     map[uint64]struct{}
	complete bool   // read from the stream's first batch on, nothing missed, never overflowed
	started  bool   // a batch was applied; next is meaningful
	next     uint64 // the sequence number of the batch expected next
	overflow uint64 // stores not recorded because the set was full
}

func newDirectory(maxKeys int) *directory {
	return &directory{maxKeys: maxKeys, peers: map[string]*peerKeys{}}
}

// watch starts (or restarts, after a reconnect) recording node: its set is
// rebuilt from the batches that follow, and is complete only once the
// stream's first batch arrived.
func (d *directory) watch(node string) {
	d.peers[node] = &peerKeys{keys: map[uint64]struct{}{}}
}

// empty records that node's stream has no batch yet: its set, empty, is
// complete, and its first batch must be the stream's first.
func (d *directory) empty(node string) {
	if p := d.peers[node]; p != nil && !p.started {
		p.complete, p.started, p.next = true, true, 0
	}
}

// forget drops node's set (it left, or its stream ended).
func (d *directory) forget(node string) { delete(d.peers, node) }

// apply records one of node's batches (a publisher numbers them from 0).
// A batch that is not the next one (missed > 0, or a first batch that is
// not the stream's first) makes the set incomplete: stores announced in the
// batches it missed are unknown.
func (d *directory) apply(node string, seq, missed uint64, b *events.Batch) {
	p := d.peers[node]
	if p == nil {
		return // not watched (left before its stream stopped)
	}
	switch {
	case !p.started:
		p.complete = seq == 0 && missed == 0
	case missed > 0 || seq != p.next:
		p.complete = false
	}
	p.started, p.next = true, seq+1
	for i := range b.Events {
		d.applyEvent(p, &b.Events[i])
	}
}

func (d *directory) applyEvent(p *peerKeys, e *events.Event) {
	switch e.Type {
	case events.TypeAllBlocksCleared:
		clear(p.keys)
	case events.TypeBlockStored:
		if e.Medium != messages.MediumCPU {
			return
		}
		for _, h := range e.BlockHashes {
			if len(p.keys) >= d.maxKeys {
				p.overflow++
				p.complete = false
				continue
			}
			p.keys[low64(h)] = struct{}{}
		}
	case events.TypeBlockRemoved:
		if e.Medium != messages.MediumCPU {
			return
		}
		for _, h := range e.BlockHashes {
			delete(p.keys, low64(h))
		}
	}
}

// holders returns, of candidates, the fewest peers that together hold
// every key any of them is recorded to hold: the peer holding the most of
// keys first (the longest cached prefix, usually all of them), then the
// one holding the most of the rest, and so on — a key is fetched from one
// peer, so a second holder of it is a message for nothing. When no peer is
// named, it returns the incomplete ones (and those not watched), which may
// hold keys the directory cannot see.
func (d *directory) holders(candidates []peerRef, keys []messages.Key) []peerRef {
	hashes := make([]uint64, len(keys))
	for i, k := range keys {
		hashes[i] = keyLow64(k)
	}
	var named, unsure []peerRef
	var held [][]bool // per named peer: which keys it holds
	for _, c := range candidates {
		p := d.peers[c.node]
		if h := p.held(hashes); h != nil {
			named, held = append(named, c), append(held, h)
		} else if p == nil || !p.complete {
			unsure = append(unsure, c)
		}
	}
	if len(named) == 0 {
		return unsure
	}
	return cover(named, held, len(keys))
}

// held is which of hashes p holds, or nil if none (or p is nil).
func (p *peerKeys) held(hashes []uint64) []bool {
	if p == nil {
		return nil
	}
	var out []bool
	for i, h := range hashes {
		if _, ok := p.keys[h]; ok {
			if out == nil {
				out = make([]bool, len(hashes))
			}
			out[i] = true
		}
	}
	return out
}

// cover picks, greedily, peers until every key some peer holds is held by
// a picked one; ties go to the earlier candidate.
func cover(peers []peerRef, held [][]bool, n int) []peerRef {
	covered := make([]bool, n)
	var out []peerRef
	for {
		best, gain := -1, 0
		for i, h := range held {
			g := 0
			for k, ok := range h {
				if ok && !covered[k] {
					g++
				}
			}
			if g > gain {
				best, gain = i, g
			}
		}
		if best < 0 {
			return out
		}
		out = append(out, peers[best])
		for k, ok := range held[best] {
			covered[k] = covered[k] || ok
		}
	}
}

// size is the directory's key count and its approximate bytes.
func (d *directory) size() (keys int, bytes int64) {
	for _, p := range d.peers {
		keys += len(p.keys)
	}
	return keys, int64(keys) * directoryEntryBytes
}

// low64 reduces an event's hash to the directory's form.
func low64(h events.Hash) uint64 {
	if h.IsBytes {
		return events.WireHash(string(h.Bytes), events.HashInt).Int
	}
	return h.Int
}

// keyLow64 is a key's hash in the directory's form.
func keyLow64(k messages.Key) uint64 { return events.WireHash(k.Hash, events.HashInt).Int }

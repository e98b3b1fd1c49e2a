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

// holders returns, of candidates, the peers whose recorded set has at least
// one of keys; when none has, the incomplete ones (and those not watched),
// which may hold keys the directory cannot see.
func (d *directory) holders(candidates []peerRef, keys []messages.Key) []peerRef {
	hashes := make([]uint64, len(keys))
	for i, k := range keys {
		hashes[i] = keyLow64(k)
	}
	var named, unsure []peerRef
	for _, c := range candidates {
		p := d.peers[c.node]
		switch {
		case p != nil && p.holdsAny(hashes):
			named = append(named, c)
		case p == nil || !p.complete:
			unsure = append(unsure, c)
		}
	}
	if len(named) > 0 {
		return named
	}
	return unsure
}

func (p *peerKeys) holdsAny(hashes []uint64) bool {
	for _, h := range hashes {
		if _, ok := p.keys[h]; ok {
			return true
		}
	}
	return false
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

package events

import (
	"encoding/binary"

	"github.com/kvtier/kvtier/messages"
)

// Learned is what engines' own KV events taught the node about the blocks
// they cache: each block's token ids, parent hash, block size and LoRA, by
// the block's hash as the engine publishes it. vLLM's offloading manager
// API hands kvtier keys only, while vLLM announces every block it caches
// in its GPU prefix cache — with the token ids — before it can offload it;
// so the node announces the blocks an engine wrote into kvtier (CPU, and
// every medium they reach later) with the payload the engine gave its own
// copy (docs/VLLM.md, "Events").
//
// Plain data, owned by the hub actor (or a test). Bounded: at most
// capacity blocks, the oldest learned forgotten first.
//
// Blocks are found by the low 64 bits of their hash (the last 8 bytes, big
// endian): vLLM's default int hashes are exactly that, and a raw kvtier key
// hash ends with them. Two different blocks colliding there is as likely
// as vLLM's own int hashes colliding on a router.
type Learned struct {
	capacity int
	blocks   map[uint64]*messages.Provenance
	topics   map[uint64]string // the topic of the stream each block was learned from, where it had one
	order    []uint64          // ring of learned hashes, oldest at next once full
	next     int
	sizes    map[int]struct{} // block sizes learned
	// Counters (monotonic).
	Blocks  uint64 // blocks learned (a block learned again counts again)
	Skipped uint64 // stored events that could not be learned (token ids not BlockSize per block)
}

// DefaultLearnCapacity bounds the blocks a node remembers from engines'
// events: 65,536 blocks of 32 tokens are ~17 MiB.
const DefaultLearnCapacity = 1 << 16

// NewLearned remembers at most capacity blocks (capacity ≥ 1).
func NewLearned(capacity int) *Learned {
	return &Learned{capacity: max(capacity, 1), blocks: map[uint64]*messages.Provenance{},
		topics: map[uint64]string{}, sizes: map[int]struct{}{}}
}

// Len is how many blocks it remembers.
func (l *Learned) Len() int { return len(l.blocks) }

// Learn takes every block of b's BlockStored events (in any medium) whose
// token ids are BlockSize per block; it returns how many.
func (l *Learned) Learn(b *Batch) int { return l.LearnFrom(b, "") }

// LearnFrom is Learn for a batch that came under topic (the engine's
// identity on its own stream, kv@<pod>@<model>; "" for none): TopicOf
// then names it for each block learned.
func (l *Learned) LearnFrom(b *Batch, topic string) int {
	n := 0
	for i := range b.Events {
		e := &b.Events[i]
		if e.Type != TypeBlockStored || len(e.BlockHashes) == 0 {
			continue
		}
		if e.BlockSize <= 0 || len(e.TokenIDs) != e.BlockSize*len(e.BlockHashes) {
			l.Skipped++
			continue
		}
		l.sizes[e.BlockSize] = struct{}{}
		parent := e.Parent
		for j := range e.BlockHashes {
			h := &e.BlockHashes[j]
			l.put(lowBits(*h), topic, &messages.Provenance{
				ParentHash: hashBytes(parent),
				TokenIDs:   e.TokenIDs[j*e.BlockSize : (j+1)*e.BlockSize : (j+1)*e.BlockSize],
				BlockSize:  e.BlockSize,
				LoRAID:     loraID(e.LoRAID),
				LoRAName:   e.LoRAName,
				ExtraKeys:  extraKeys(e.ExtraKeys, j),
			})
			parent = h
			n++
		}
	}
	l.Blocks += uint64(n)
	return n
}

// HasBlockSize reports whether blocks of size tokens were ever learned.
func (l *Learned) HasBlockSize(size int) bool {
	_, ok := l.sizes[size]
	return ok
}

// Sizes is how many different block sizes were learned.
func (l *Learned) Sizes() int { return len(l.sizes) }

// Lookup is the learned provenance of the block whose raw hash is hash,
// nil when none was learned (or it was forgotten).
func (l *Learned) Lookup(hash string) *messages.Provenance {
	if len(hash) == 0 {
		return nil
	}
	return l.blocks[WireHash(hash, HashInt).Int]
}

// TopicOf is the topic of the stream the block whose raw hash is hash was
// learned from; "" when none (or it was forgotten).
func (l *Learned) TopicOf(hash string) string {
	if len(hash) == 0 || len(l.topics) == 0 {
		return ""
	}
	return l.topics[WireHash(hash, HashInt).Int]
}

func (l *Learned) put(h uint64, topic string, p *messages.Provenance) {
	if _, known := l.blocks[h]; !known {
		if len(l.order) < l.capacity {
			l.order = append(l.order, h)
		} else {
			old := l.order[l.next]
			delete(l.blocks, old)
			delete(l.topics, old)
			l.order[l.next] = h
			l.next = (l.next + 1) % l.capacity
		}
	} // NB: a block learned again keeps its place in the ring
	l.blocks[h] = p
	if topic != "" {
		l.topics[h] = topic
	} else {
		delete(l.topics, h)
	}
}

// lowBits is a wire hash's low 64 bits (an int hash is just that).
func lowBits(h Hash) uint64 {
	if !h.IsBytes {
		return h.Int
	}
	return WireHash(string(h.Bytes), HashInt).Int
}

// hashBytes is a parent hash as a raw hash: the bytes the engine sent, or
// an int hash's 8 big-endian bytes (whose low 64 bits, all the int format
// writes, are the int again); nil for none.
func hashBytes(h *Hash) []byte {
	switch {
	case h == nil:
		return nil
	case h.IsBytes:
		return h.Bytes
	}
	return binary.BigEndian.AppendUint64(nil, h.Int)
}

func loraID(id *int64) int {
	if id == nil {
		return 0
	}
	return int(*id)
}

func extraKeys(all [][]string, i int) []string {
	if i < len(all) {
		return all[i]
	}
	return nil
}

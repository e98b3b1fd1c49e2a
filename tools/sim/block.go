package sim

import (
	"encoding/binary"
	"hash/fnv"

	"github.com/kvtier/kvtier/messages"
)

// DefaultLayout is the layout the simulated model's keys live in.
var DefaultLayout = messages.Layout{
	Model:       "kvtier-sim",
	Revision:    "v1",
	DType:       "fp16",
	KVLayout:    "NHD",
	BlockTokens: TokensPerBlock,
	TPSize:      1,
}

// TokensPerBlock is the block size in tokens (the Mooncake traces hash one id
// per 512-token block).
const TokensPerBlock = 512

// KeyFor returns the key of block id in namespace ns: the hash is
// BlockHash(id) as 8 bytes big-endian, group 0.
func KeyFor(ns messages.Namespace, id uint64) messages.Key {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], BlockHash(id))
	return messages.Key{Namespace: ns, Hash: string(b[:]), Group: 0}
}

// Keys returns the keys of a prompt's blocks in namespace ns (KeyFor of
// each id).
func Keys(ns messages.Namespace, blocks []uint64) []messages.Key {
	keys := make([]messages.Key, len(blocks))
	for i, id := range blocks {
		keys[i] = KeyFor(ns, id)
	}
	return keys
}

// BlockHash is the 64-bit hash of block id, as realistic as an engine's:
// uniform over 64 bits (vLLM's are the low 64 bits of sha256 or xxh3) and
// never 0 for a workload's ids, so KV events carry it in msgpack's 64-bit
// form and no block's hash reads as "no parent". A workload's id already
// names a block with its whole prefix (equal ids are a reusable prefix
// block, as in the traces), so a bijective mix of the id is a chained hash.
func BlockHash(id uint64) uint64 {
	z := id + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// seedOf is the FNV-1a digest of everything in key, the seed of its bytes.
func seedOf(key messages.Key) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key.Namespace))
	h.Write([]byte{0})
	h.Write([]byte(key.Hash))
	var g [4]byte
	binary.BigEndian.PutUint32(g[:], key.Group)
	h.Write(g[:])
	return h.Sum64()
}

// splitmix64 advances state and returns the next word of the stream.
func splitmix64(state *uint64) uint64 {
	*state += 0x9e3779b97f4a7c15
	z := *state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// FillRange writes bytes [off, off+len(dst)) of key's block content into
// dst. off must be a multiple of 8. A block's content is a splitmix64 stream
// seeded by FNV of the key, 8 bytes little-endian per word.
func FillRange(dst []byte, key messages.Key, off int) {
	state := seedOf(key) + uint64(off/8)*0x9e3779b97f4a7c15
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		binary.LittleEndian.PutUint64(dst[i:], splitmix64(&state))
	}
	if i < len(dst) {
		var tail [8]byte
		binary.LittleEndian.PutUint64(tail[:], splitmix64(&state))
		copy(dst[i:], tail[:])
	}
}

// Fill writes key's whole block content into dst.
func Fill(dst []byte, key messages.Key) { FillRange(dst, key, 0) }

// VerifyRange reports whether src holds bytes [off, off+len(src)) of key's
// content. off must be a multiple of 8.
func VerifyRange(src []byte, key messages.Key, off int) bool {
	state := seedOf(key) + uint64(off/8)*0x9e3779b97f4a7c15
	i := 0
	for ; i+8 <= len(src); i += 8 {
		if binary.LittleEndian.Uint64(src[i:]) != splitmix64(&state) {
			return false
		}
	}
	if i < len(src) {
		var tail [8]byte
		binary.LittleEndian.PutUint64(tail[:], splitmix64(&state))
		for j := range len(src) - i {
			if src[i+j] != tail[j] {
				return false
			}
		}
	}
	return true
}

// Verify reports whether src is exactly key's block content.
func Verify(src []byte, key messages.Key) bool { return VerifyRange(src, key, 0) }

// Shard returns worker w's byte range of a block of n bytes split among
// workers: contiguous, 8-byte aligned, together covering the block. Every
// simulated engine (this package's and the chaos harness's) splits a job's
// copy this way.
func Shard(n, workers, w int) (lo, hi int) {
	per := (n/workers + 7) &^ 7
	lo = min(w*per, n)
	hi = min(lo+per, n)
	if w == workers-1 {
		hi = n
	}
	return lo, hi
}

// WriteShard is worker w's part of a store (one of workers): it writes its
// shard of key's block content into slot.
func WriteShard(slot []byte, key messages.Key, workers, w int) {
	lo, hi := Shard(len(slot), workers, w)
	FillRange(slot[lo:hi], key, lo)
}

// VerifyShard is worker w's part of a load (one of workers): it reports
// whether its shard of slot holds key's block content.
func VerifyShard(slot []byte, key messages.Key, workers, w int) bool {
	lo, hi := Shard(len(slot), workers, w)
	return VerifyRange(slot[lo:hi], key, lo)
}

package messages

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
)

// Namespace is a short digest of everything that makes two byte-identical
// block hashes incompatible: model, revision, dtype, KV layout, block size,
// tensor-parallel shard and cache salt. Keys from different namespaces never
// match.
type Namespace string

// Layout is what a Namespace is derived from.
type Layout struct {
	Model       string // model id
	Revision    string // model revision
	DType       string // KV dtype, e.g. "fp16", "fp8_e4m3"
	KVLayout    string // engine KV layout, e.g. "NHD"
	BlockTokens int    // tokens per block
	TPRank      int    // tensor-parallel rank of this shard
	TPSize      int    // tensor-parallel world size
	CacheSalt   string // tenant / cache salt; part of the namespace so tenants never share
}

// Namespace digests the layout into a 16-hex-character namespace. Every field
// takes part, length-prefixed so that no two layouts collide by concatenation.
func (l Layout) Namespace() Namespace {
	h := sha256.New()
	for _, f := range []string{l.Model, l.Revision, l.DType, l.KVLayout,
		strconv.Itoa(l.BlockTokens), strconv.Itoa(l.TPRank), strconv.Itoa(l.TPSize), l.CacheSalt} {
		fmt.Fprintf(h, "%d:%s;", len(f), f)
	}
	return Namespace(hex.EncodeToString(h.Sum(nil)[:8]))
}

// Key names one block in every tier: a block hash of one KV-cache group in
// one layout namespace. It is comparable and used directly as a map key.
type Key struct {
	Namespace Namespace // layout namespace; keys of different namespaces never match
	Hash      string    // the engine's prefix-chained block hash, raw bytes (usually 32)
	Group     uint32    // KV-cache group index
}

// String renders the key for logs: namespace, hex hash prefix, group.
func (k Key) String() string {
	h := hex.EncodeToString([]byte(k.Hash))
	if len(h) > 16 {
		h = h[:16]
	}
	return fmt.Sprintf("%s/%s/%d", k.Namespace, h, k.Group)
}

// MaxHashBytes bounds a block hash; longer hashes are rejected as malformed.
const MaxHashBytes = 64

// Validate reports a malformed key.
func (k Key) Validate() error {
	if len(k.Hash) == 0 || len(k.Hash) > MaxHashBytes {
		return fmt.Errorf("%w: hash of %d bytes (want 1..%d)", ErrBadKey, len(k.Hash), MaxHashBytes)
	}
	return nil
}

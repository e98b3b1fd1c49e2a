package messages

import (
	"errors"
	"fmt"
	"slices"
)

// ErrBadProvenance: a provenance outside the bounds below (a malformed
// stored header or peer frame).
var ErrBadProvenance = errors.New("kvtier: provenance out of bounds")

// Placement locates one stored block in the call that produced it (a
// PrepareStore, later a promotion or a peer fetch), so that its event can be
// built from that call's ReqContext: the context describes every key of the
// call, while a job may write (and a commit may land) only some of them.
type Placement struct {
	// Index is the key's position among the call's keys: its tokens are
	// Ctx.TokenIDs[Index*Ctx.BlockSize : (Index+1)*Ctx.BlockSize].
	Index int
	// Parent is the hash of the block before this one in its prefix chain:
	// the call's previous key, or Ctx.ParentBlockHash for the call's first
	// key. "" when the block starts a prompt.
	Parent string
}

// Place computes the placement of each of keys within call (the keys the
// call named, in chain order), with parent the hash before call[0]. A key
// named twice takes its first position; a key not in call gets Index -1
// (its provenance is unknown).
func Place(call, keys []Key, parent []byte) []Placement {
	firstOf := func(k Key) (int, bool) { i := slices.Index(call, k); return i, i >= 0 }
	if len(call) > placeScanMax {
		first := make(map[Key]int, len(call))
		for i, k := range call {
			if _, seen := first[k]; !seen {
				first[k] = i
			}
		}
		firstOf = func(k Key) (int, bool) { i, ok := first[k]; return i, ok }
	}
	out := make([]Placement, len(keys))
	for i, k := range keys {
		idx, ok := firstOf(k)
		switch {
		case !ok:
			out[i] = Placement{Index: -1}
		case idx == 0:
			out[i] = Placement{Index: 0, Parent: string(parent)}
		default:
			out[i] = Placement{Index: idx, Parent: call[idx-1].Hash}
		}
	}
	return out
}

// placeScanMax is the longest call Place searches key by key rather than
// through a map of it: most calls name a handful of keys.
const placeScanMax = 16

// BlockTokens returns the token ids of the block at placement p of ctx's
// call, and whether ctx holds them all (a full block of ctx.BlockSize
// tokens). It never copies: the result aliases ctx.TokenIDs.
func BlockTokens(ctx *ReqContext, p Placement) ([]int32, bool) {
	if ctx == nil || ctx.BlockSize <= 0 || p.Index < 0 {
		return nil, false
	}
	lo := p.Index * ctx.BlockSize
	hi := lo + ctx.BlockSize
	if hi > len(ctx.TokenIDs) || lo < 0 {
		return nil, false
	}
	return ctx.TokenIDs[lo:hi], true
}

// Provenance is one block's origin, as a KV-aware router needs it (vLLM's
// BlockStored fields): what makes its stored event full. It travels with
// the block where no request context does: in a secondary tier's stored
// block header (tiers/blockfmt), in a tiermsg.Read answer, in a peer's lookup
// answer, and into the CPU tier through CommitSlots.Prov.
//
// A Provenance is immutable once built and may be shared: its slices may
// alias a ReqContext's (NewProvenance never copies token ids), so nobody
// writes through them.
type Provenance struct {
	ParentHash []byte   // hash of the block before this one in its prefix chain; nil at the start of a prompt
	TokenIDs   []int32  // this block's token ids: BlockSize of them when known, else empty
	BlockSize  int      // tokens per block
	LoRAID     int      // LoRA adapter id; 0 = none
	LoRAName   string   // LoRA adapter name; "" = none
	ExtraKeys  []string // extra hash inputs of the block's request (multimodal hashes, cache salt)
}

// Bounds of a Provenance that crosses a process boundary (stored block
// headers, the peer wire): decoders refuse anything larger, encoders leave
// out a provenance that does not fit (the block is then announced as a
// placeholder). vLLM's block sizes are far below MaxProvenanceTokens.
const (
	MaxProvenanceTokens = 1 << 14 // token ids of one block
	MaxLoRANameBytes    = 256
	MaxExtraKeys        = 64
	MaxExtraKeyBytes    = 1024
)

// NewProvenance is the provenance of the block at placement p of ctx's call,
// or nil when it is unknown (no context, or a key the call did not name).
// Token ids alias ctx.TokenIDs (nil when ctx does not hold the whole block);
// only the parent hash is copied (a few bytes).
func NewProvenance(ctx *ReqContext, p Placement) *Provenance {
	if ctx == nil || p.Index < 0 {
		return nil
	}
	toks, _ := BlockTokens(ctx, p)
	var parent []byte
	if p.Parent != "" {
		parent = []byte(p.Parent)
	}
	return &Provenance{ParentHash: parent, TokenIDs: toks, BlockSize: ctx.BlockSize,
		LoRAID: ctx.LoRAID, LoRAName: ctx.LoRAName, ExtraKeys: ctx.ExtraKeys}
}

// Full reports whether p can make a full BlockStored: a block size and
// exactly that many token ids.
func (p *Provenance) Full() bool {
	return p != nil && p.BlockSize > 0 && len(p.TokenIDs) == p.BlockSize
}

// Validate checks p against the bounds above (ErrBadProvenance).
func (p *Provenance) Validate() error {
	switch {
	case p == nil:
		return nil
	case len(p.ParentHash) > MaxHashBytes:
		return fmt.Errorf("%w: parent hash of %d bytes", ErrBadProvenance, len(p.ParentHash))
	case p.BlockSize < 0 || p.BlockSize > MaxProvenanceTokens:
		return fmt.Errorf("%w: block size %d", ErrBadProvenance, p.BlockSize)
	case len(p.TokenIDs) > MaxProvenanceTokens:
		return fmt.Errorf("%w: %d token ids", ErrBadProvenance, len(p.TokenIDs))
	case len(p.LoRAName) > MaxLoRANameBytes:
		return fmt.Errorf("%w: LoRA name of %d bytes", ErrBadProvenance, len(p.LoRAName))
	case len(p.ExtraKeys) > MaxExtraKeys:
		return fmt.Errorf("%w: %d extra keys", ErrBadProvenance, len(p.ExtraKeys))
	}
	for _, k := range p.ExtraKeys {
		if len(k) > MaxExtraKeyBytes {
			return fmt.Errorf("%w: extra key of %d bytes", ErrBadProvenance, len(k))
		}
	}
	return nil
}

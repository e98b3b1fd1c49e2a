package messages

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
	first := make(map[Key]int, len(call))
	for i, k := range call {
		if _, seen := first[k]; !seen {
			first[k] = i
		}
	}
	out := make([]Placement, len(keys))
	for i, k := range keys {
		idx, ok := first[k]
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

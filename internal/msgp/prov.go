package msgp

import "encoding/binary"

// Prov is the part of a block's provenance that both protocols carry under
// the same keys and encodings: the peer protocol in a hit's provenance, the
// engine protocol in a request's context. The parent hash is not here: the
// two protocols differ in when they leave it out.
type Prov struct {
	Tokens    []int32  // "tokens": one bin of little-endian int32s
	BlockSize int      // "block_size": uint
	LoRAID    int      // "lora_id": int
	LoRAName  string   // "lora_name": str
	Extra     []string // "extra": array of str
}

// Fields counts the map entries WriteProv writes for p.
func (p *Prov) Fields() int {
	return Count(len(p.Tokens) > 0, p.BlockSize != 0, p.LoRAID != 0, p.LoRAName != "", len(p.Extra) > 0)
}

// WriteProv writes p's set fields as map entries (key, value), in the
// order of Prov's fields; the caller has counted them in its MapLen.
func (w *Writer) WriteProv(p *Prov) {
	if len(p.Tokens) > 0 {
		w.Str("tokens")
		w.BinHeader(4 * len(p.Tokens))
		for _, t := range p.Tokens {
			w.B = binary.LittleEndian.AppendUint32(w.B, uint32(t))
		}
	}
	w.OptUint("block_size", uint64(p.BlockSize))
	w.OptInt("lora_id", int64(p.LoRAID))
	w.OptStr("lora_name", p.LoRAName)
	w.OptStrs("extra", p.Extra)
}

// Strs writes ss as an array of str.
func (w *Writer) Strs(ss []string) {
	w.ArrayLen(len(ss))
	for _, s := range ss {
		w.Str(s)
	}
}

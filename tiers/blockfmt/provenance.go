package blockfmt

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/kvtier/kvtier/messages"
)

// Provenance section (version 2 headers), little endian:
//
//	size  field
//	   4  CRC32C of the rest of the section
//	   1  section version (1)
//	   1  parent hash length P (≤ 64), then P bytes
//	   4  block size in tokens
//	   8  LoRA id (signed)
//	   2  LoRA name length L (≤ 256), then L bytes
//	   4  token count T (≤ 16384), then T × int32
//	   2  extra key count E (≤ 64), then E × (2-byte length ≤ 1024, bytes)
//
// Every count is bounded (messages.Provenance's bounds), so a section is at
// most MaxProvenance bytes, and a decoder that trusts nothing but the
// bounds allocates at most that much.
const (
	provVersion = 1
	provFixed   = 4 + 1 + 1 + 4 + 8 + 2 + 4 + 2
	// MaxProvenance bounds a provenance section.
	MaxProvenance = provFixed + messages.MaxHashBytes + messages.MaxLoRANameBytes +
		4*messages.MaxProvenanceTokens + messages.MaxExtraKeys*(2+messages.MaxExtraKeyBytes)
)

// ProvenanceSize is the section p encodes to: 0 for nil, -1 when p is
// outside the bounds (it is then not stored).
func ProvenanceSize(p *messages.Provenance) int {
	if p == nil {
		return 0
	}
	if p.Validate() != nil {
		return -1
	}
	n := provFixed + len(p.ParentHash) + len(p.LoRAName) + 4*len(p.TokenIDs)
	for _, k := range p.ExtraKeys {
		n += 2 + len(k)
	}
	return n
}

// appendProvenance appends p's section (p within bounds) to dst.
func appendProvenance(dst []byte, p *messages.Provenance) []byte {
	start := len(dst)
	le := binary.LittleEndian
	dst = le.AppendUint32(dst, 0) // CRC, filled below
	dst = append(dst, provVersion, byte(len(p.ParentHash)))
	dst = append(dst, p.ParentHash...)
	dst = le.AppendUint32(dst, uint32(p.BlockSize))
	dst = le.AppendUint64(dst, uint64(int64(p.LoRAID)))
	dst = le.AppendUint16(dst, uint16(len(p.LoRAName)))
	dst = append(dst, p.LoRAName...)
	dst = le.AppendUint32(dst, uint32(len(p.TokenIDs)))
	for _, t := range p.TokenIDs {
		dst = le.AppendUint32(dst, uint32(t))
	}
	dst = le.AppendUint16(dst, uint16(len(p.ExtraKeys)))
	for _, k := range p.ExtraKeys {
		dst = le.AppendUint16(dst, uint16(len(k)))
		dst = append(dst, k...)
	}
	le.PutUint32(dst[start:], crc32.Checksum(dst[start+4:], Castagnoli))
	return dst
}

// DecodeProvenance parses a provenance section (the ProvLen bytes after a
// version 2 header): nil for an empty one. Any malformation (checksum,
// version, a count past its bound, bytes left over or missing) is
// ErrInvalidBlock.
func DecodeProvenance(src []byte) (*messages.Provenance, error) {
	if len(src) == 0 {
		return nil, nil
	}
	r := provReader{b: src}
	sum := r.u32()
	if r.err == nil && sum != crc32.Checksum(src[4:], Castagnoli) {
		return nil, fmt.Errorf("%w: provenance checksum", messages.ErrInvalidBlock)
	}
	if v := r.u8(); r.err == nil && v != provVersion {
		return nil, fmt.Errorf("%w: provenance version %d", messages.ErrInvalidBlock, v)
	}
	p := &messages.Provenance{}
	if n := r.count(r.u8(), messages.MaxHashBytes); n > 0 {
		p.ParentHash = append([]byte(nil), r.bytes(n)...)
	}
	p.BlockSize = int(r.u32())
	p.LoRAID = int(int64(r.u64()))
	p.LoRAName = string(r.bytes(r.count(int(r.u16()), messages.MaxLoRANameBytes)))
	if n := r.count(int(r.u32()), messages.MaxProvenanceTokens); n > 0 && r.need(4*n) {
		p.TokenIDs = make([]int32, n)
		for i := range p.TokenIDs {
			p.TokenIDs[i] = int32(r.u32())
		}
	}
	if n := r.count(int(r.u16()), messages.MaxExtraKeys); n > 0 {
		p.ExtraKeys = make([]string, 0, n)
		for range n {
			p.ExtraKeys = append(p.ExtraKeys, string(r.bytes(r.count(int(r.u16()), messages.MaxExtraKeyBytes))))
		}
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%d bytes left over", len(r.b))
	}
	if r.err == nil {
		r.err = p.Validate()
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: provenance: %w", messages.ErrInvalidBlock, r.err)
	}
	return p, nil
}

// provReader reads little-endian fields, sticking at the first error.
type provReader struct {
	b   []byte
	err error
}

func (r *provReader) need(n int) bool {
	if r.err == nil && len(r.b) < n {
		r.err = fmt.Errorf("truncated")
	}
	return r.err == nil
}

func (r *provReader) bytes(n int) []byte {
	if n <= 0 || !r.need(n) {
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *provReader) u8() int {
	if b := r.bytes(1); b != nil {
		return int(b[0])
	}
	return 0
}

func (r *provReader) u16() uint16 {
	if b := r.bytes(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (r *provReader) u32() uint32 {
	if b := r.bytes(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *provReader) u64() uint64 {
	if b := r.bytes(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// count checks a decoded count against its bound.
func (r *provReader) count(n, bound int) int {
	if r.err == nil && (n < 0 || n > bound) {
		r.err = fmt.Errorf("count %d over its bound %d", n, bound)
	}
	if r.err != nil {
		return 0
	}
	return n
}

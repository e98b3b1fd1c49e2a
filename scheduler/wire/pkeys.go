package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"

	"github.com/kvtier/kvtier/messages"
)

// Packed keys ("pkeys"): the keys of one call as one map instead of one
// array per key, for the calls that carry hundreds or thousands of keys of
// one namespace and one hash length (every engine's case):
//
//	{"ns": str, "hash_len": uint 1..64, "hashes": bin (n × hash_len bytes),
//	 "group": uint32 (every key's group; absent = 0)
//	 | "groups": bin (n × u32 big-endian, one per key)}
//
// A request carries "keys" or "pkeys", never both; both decode to the same
// Request.Keys. A daemon that reads them says so in its hello reply
// ("packed_keys": true); a client sends them only then. The packing saves
// the per-key msgpack array, namespace string and headers: 2,000 keys of
// 32 bytes are ~66 KB instead of ~120 KB, and the decoder allocates one
// string per key and nothing else.

// pkeys field names, and what each is for.
const (
	pkNamespace = "ns"
	pkHashLen   = "hash_len"
	pkHashes    = "hashes"
	pkGroup     = "group"
	pkGroups    = "groups"
)

// packable reports whether keys can travel packed: at least one, all of one
// namespace and one hash length in 1..MaxHashBytes.
func packable(keys []messages.Key) bool {
	if len(keys) == 0 {
		return false
	}
	ns, hl := keys[0].Namespace, len(keys[0].Hash)
	if hl == 0 || hl > messages.MaxHashBytes {
		return false
	}
	for _, k := range keys[1:] {
		if k.Namespace != ns || len(k.Hash) != hl {
			return false
		}
	}
	return true
}

// encodePackedKeys writes keys (packable) as a pkeys map.
func encodePackedKeys(w *writer, keys []messages.Key) {
	hl := len(keys[0].Hash)
	group, same := keys[0].Group, true
	for _, k := range keys[1:] {
		if k.Group != group {
			same = false
			break
		}
	}
	w.MapLen(4)
	w.Str(pkNamespace)
	w.Str(string(keys[0].Namespace))
	w.Str(pkHashLen)
	w.Uint(uint64(hl))
	w.Str(pkHashes)
	w.BinHeader(hl * len(keys))
	for _, k := range keys {
		w.B = append(w.B, k.Hash...)
	}
	if same {
		w.Str(pkGroup)
		w.Uint(uint64(group))
		return
	}
	w.Str(pkGroups)
	w.BinHeader(4 * len(keys))
	for _, k := range keys {
		w.B = binary.BigEndian.AppendUint32(w.B, k.Group)
	}
}

// packedKeys is a pkeys map as read, before it becomes keys.
type packedKeys struct {
	ns      []byte // aliases the frame until keys() looks it up
	hashLen int
	hashes  []byte // aliases the frame until keys() copies it out
	group   uint32
	groups  []byte
	seen    uint8 // the fields read, a bit each (pkBit)
}

// pkFields are the pkeys map's field names; a field's bit in
// packedKeys.seen is 1 << its index here.
var pkFields = [...]string{pkNamespace, pkHashLen, pkHashes, pkGroup, pkGroups}

// pkBit is name's bit in packedKeys.seen, 0 for a name pkeys has no field
// of. It compares the frame's bytes in place: a call's field names cost no
// allocation.
func pkBit(name []byte) uint8 {
	for i, f := range pkFields {
		if string(name) == f {
			return 1 << i
		}
	}
	return 0
}

// has reports whether the field named (one of pkFields) was read.
func (p *packedKeys) has(name string) bool { return p.seen&pkBit([]byte(name)) != 0 }

// decodePackedKeys reads a pkeys map into at most max keys. A hash length
// outside 1..MaxHashBytes is a bad key (ErrBadKey), as it is in "keys".
func decodePackedKeys(r *reader, max int) ([]messages.Key, error) {
	n, err := r.MapLen(5)
	if err != nil {
		return nil, err
	}
	var p packedKeys
	for range n {
		name, err := r.StrBytes(16)
		if err != nil {
			return nil, fmt.Errorf("field name: %w", err)
		}
		bit := pkBit(name)
		if bit == 0 {
			return nil, fmt.Errorf("unknown field %q", name)
		}
		if p.seen&bit != 0 {
			return nil, fmt.Errorf("field %q repeated", name)
		}
		p.seen |= bit
		if err := p.field(r, bit); err != nil {
			return nil, err
		}
	}
	return p.keys(max)
}

func (p *packedKeys) field(r *reader, bit uint8) error {
	var err error
	switch pkFields[bits.TrailingZeros8(bit)] {
	case pkNamespace:
		p.ns, err = r.StrBytes(MaxNamespaceBytes)
	case pkHashLen:
		var hl uint64
		if hl, err = r.Uint(math.MaxUint64); err == nil { // NB: any length outside 1..64 is BAD_KEY
			if hl == 0 || hl > messages.MaxHashBytes {
				return fmt.Errorf("%w: hash_len %d (want 1..%d)", messages.ErrBadKey, hl, messages.MaxHashBytes)
			}
			p.hashLen = int(hl)
		}
	case pkHashes:
		p.hashes, err = r.Bin(MaxKeys * messages.MaxHashBytes)
	case pkGroup:
		var g uint64
		g, err = r.Uint(math.MaxUint32)
		p.group = uint32(g)
	case pkGroups:
		p.groups, err = r.Bin(4 * MaxKeys)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", pkFields[bits.TrailingZeros8(bit)], err)
	}
	return nil
}

func (p *packedKeys) keys(max int) ([]messages.Key, error) {
	switch {
	case !p.has(pkNamespace):
		return nil, fmt.Errorf("missing field %q", pkNamespace)
	case !p.has(pkHashLen):
		return nil, fmt.Errorf("missing field %q", pkHashLen)
	case !p.has(pkHashes):
		return nil, fmt.Errorf("missing field %q", pkHashes)
	case p.has(pkGroup) && p.has(pkGroups):
		return nil, fmt.Errorf("%q and %q: one or the other", pkGroup, pkGroups)
	case len(p.hashes) == 0 || len(p.hashes)%p.hashLen != 0:
		return nil, fmt.Errorf("hashes: %d bytes is not a positive multiple of hash_len %d", len(p.hashes), p.hashLen)
	}
	n := len(p.hashes) / p.hashLen
	if n > max {
		return nil, fmt.Errorf("%d keys (max %d)", n, max)
	}
	groups := p.has(pkGroups)
	if groups && len(p.groups) != 4*n {
		return nil, fmt.Errorf("groups: %d bytes for %d keys (want %d)", len(p.groups), n, 4*n)
	}
	keys := make([]messages.Key, n)
	ns := canonicalNamespace(p.ns)
	var chunk string
	for i := range keys {
		// NB: the hashes are copied out of the frame hashesPerCopy at a
		// time, each key's a slice of its copy: a key kept by a tier
		// (index, lease, negative cache) pins at most that many hashes,
		// never its whole call's, for one allocation per that many keys
		// rather than one per key (2,000 keys: ~60 of 73 µs).
		j := i % hashesPerCopy
		if j == 0 {
			end := min(i+hashesPerCopy, n)
			chunk = string(p.hashes[i*p.hashLen : end*p.hashLen])
		}
		keys[i] = messages.Key{Namespace: ns, Hash: chunk[j*p.hashLen : (j+1)*p.hashLen], Group: p.group}
		if groups {
			keys[i].Group = binary.BigEndian.Uint32(p.groups[4*i:])
		}
	}
	return keys, nil
}

// hashesPerCopy is how many decoded hashes share one allocation.
const hashesPerCopy = 16

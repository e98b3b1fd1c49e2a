package residency

import (
	"crypto/sha256"
	"encoding/binary"
)

const (
	groupMul = 0x9E3779B97F4A7C15 // golden-ratio odd constant: spreads small group ids
	mixMul1  = 0xBF58476D1CE4E5B9 // splitmix64 finalizer constants
	mixMul2  = 0x94D049BB133111EB
	// stateMask covers the two low bits of an entry, which hold the state;
	// the high 62 bits hold the fingerprint.
	stateMask = 3
	// degenerateFingerprint replaces a mix whose high 62 bits are zero, so
	// no fingerprint ever looks like an empty entry.
	degenerateFingerprint = 4
)

// Fingerprint is the 64-bit key of (namespace, block hash, group) in the
// index. It is part of the file format (see the package doc): the Python
// reader computes the same value bit for bit.
func Fingerprint(ns string, hash []byte, group uint32) uint64 {
	return FingerprintWith(NamespaceFingerprint(ns), hash, group)
}

// NamespaceFingerprint is the namespace's share of a fingerprint: the first
// 8 bytes (little-endian) of sha256(ns). Writers cache it per namespace so
// the per-key cost is a fold and a mix, not a SHA-256.
func NamespaceFingerprint(ns string) uint64 {
	sum := sha256.Sum256([]byte(ns))
	return binary.LittleEndian.Uint64(sum[:8])
}

// FingerprintWith is Fingerprint with the namespace part already computed
// by NamespaceFingerprint.
func FingerprintWith(nsfp uint64, hash []byte, group uint32) uint64 {
	x := mix(fold(hash) ^ nsfp ^ uint64(group)*groupMul)
	if x&^stateMask == 0 {
		return degenerateFingerprint
	}
	return x
}

// fold XORs the hash's 8-byte little-endian words, zero-padding a short last
// word: cheap, and the hash is already uniformly distributed.
func fold(hash []byte) uint64 {
	var h uint64
	for len(hash) >= 8 {
		h ^= binary.LittleEndian.Uint64(hash)
		hash = hash[8:]
	}
	if len(hash) > 0 {
		var tail [8]byte
		copy(tail[:], hash)
		h ^= binary.LittleEndian.Uint64(tail[:])
	}
	return h
}

// mix is the splitmix64 finalizer: a bijection whose output bits each depend
// on every input bit, so bucket choice from any bit range is uniform.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= mixMul1
	x ^= x >> 27
	x *= mixMul2
	x ^= x >> 31
	return x
}

// Package blockfmt is the stored-block format shared by the secondary tiers
// that keep one object per block (tiers/fs files, tiers/obj S3 objects): a
// fixed 160-byte header (magic, format version, key, length, CRC32C of the
// block, CRC32C of the header, provenance length), then the block's
// provenance (messages.Provenance: parent hash, token ids, block size, LoRA,
// extra keys; bounded, with its own CRC32C), then the block; and the names
// those objects get, derived from the key's namespace, hash and group only.
//
// Versions: writers write version 2; version 1 (no provenance section) is
// still read, its blocks coming back with no provenance.
//
// It owns no state and does no I/O: callers build the prefix (Prefix)
// before they write, decode and check the header (Decode, Check) and the
// provenance (DecodeProvenance) when they read, and checksum the bytes with
// Castagnoli.
package blockfmt

// Package blockfmt is the stored-block format shared by the secondary tiers
// that keep one object per block (tiers/fs files, tiers/obj S3 objects): a
// fixed 160-byte header (magic, format version, key, length, CRC32C of the
// block, CRC32C of the header) followed by the block, and the names those
// objects get, derived from the key's namespace, hash and group only.
//
// It owns no state and does no I/O: callers encode a header before they
// write, decode and check it (Check) when they read, and checksum the bytes
// with Castagnoli.
package blockfmt

// Package fs is the filesystem secondary tier: one file per block under a
// root directory, a small validated header, atomic publish by rename, a
// byte capacity with LRU eviction, and an index rebuilt from the directory
// on start so a restarted node serves what it stored before.
//
// Layout: root/<namespace>/<2-hex shard>/<hex hash>-<group>.blk. Paths are
// derived from the key's namespace and hash only (hex), never from any other
// string. Every byte of file I/O goes through the narrow FS interface (OS
// for real files, Faulty to inject ENOSPC, EIO and stalls in tests).
//
// Each file keeps its block's provenance in its header (tiers/blockfmt),
// handed back with every read. The tier announces what it holds to the
// node's event hub (medium STORAGE): blocks stored, removed, and those found
// on disk at start once their headers are read (events.go).
//
// The package owns its directory, its index and its I/O workers. It never
// touches CPU-tier state: slot bytes arrive in TierWrite/TierRead messages
// whose sender holds the slot for the duration.
package fs

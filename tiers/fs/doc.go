// Package fs is the filesystem secondary tier: blocks under a root
// directory, each with a small validated header, visible only once whole,
// a byte capacity with LRU eviction, and an index rebuilt from the
// directory on start so a restarted node serves what it stored before.
//
// Two layouts (Config.Layout):
//
// files: one file per block,
// root/<namespace>/<2-hex shard>/<hex hash>-<group>.blk, written to a
// temporary file and renamed into place; evicted one block at a time.
//
// segments (the default): blocks packed into append-only segment files,
// root/segments/<16-hex id>.seg (segformat.go). A segment has two regions:
// entries at its start, each a block's header and provenance (what a
// block file holds but the block) and where its block is; and the blocks,
// of any length up to the tier's bound (one segment holds every
// namespace's sizes), a block of whole pages at a page-aligned offset, so
// its write covers whole page-cache folios as a sequential file's would. Every read is verified
// as a block file's is. The actor reserves each record at the ends of the
// one active segment's two regions (segLog, in Receive); an I/O worker
// writes the block, then its entry, with pwrite, no lock held, several
// workers at once; the block is indexed only once both are written (and
// synced with Fsync). A segment is sealed at SegmentBytes (64 MiB; at most
// an eighth of the capacity), or earlier when its entries outgrow the
// region kept for them: once its writes are done a footer listing its live
// entries is written after its blocks. Capacity counts whole segments
// (dead records included) and is kept by evicting whole segments, least
// recently used first (reading or writing a block makes its segment
// recent). Removing one block (a bad copy, tiermsg.Delete) marks its record
// dead; a segment with no live record left is removed. Segments are not
// compacted: a cache's blocks are cheap to lose and immutable, so copying
// the live blocks of a cold segment would spend write bandwidth on blocks
// eviction is about to drop anyway, and would add a copy that races
// reads; a segment mostly dead is simply evicted whole in its LRU turn. On
// start the segments are read in id order: a sealed one's entries from
// its footer (each header checked); one being written when the process
// stopped is walked from its header, every record verified whole, and
// truncated after the last good block — its torn tail, counted, never
// served — then sealed. Segments of the first format (records of header,
// provenance and block back to back) are read, recovered and evicted the
// same way, never written to. Block files of the files layout in the same
// root are read through: indexed, served, evicted and removed like
// one-block segments, while new blocks go to segments. (The files layout
// does not read segments.) A dead record in a sealed segment is found
// again after a restart; a bad one is caught again on read.
//
// Paths are derived from the key's namespace and hash (block files) or a
// counter (segments) only, never from any other string. Every byte of file
// I/O goes through the narrow FS interface (OS for real files, Faulty to
// inject ENOSPC, EIO and stalls in tests).
//
// Each stored block keeps its provenance in its header (tiers/blockfmt),
// handed back with every read. The tier announces what it holds to the
// node's event hub (medium STORAGE): blocks stored, removed (evicted: all
// of a segment's blocks at once), and those found on disk at start once
// their headers are read (events.go) — the same in both layouts.
//
// The package owns its directory, its index and its I/O workers. It never
// touches CPU-tier state: slot bytes arrive in tiermsg.Write/tiermsg.Read messages
// whose sender holds the slot for the duration.
package fs

// Package residency owns the shared-memory residency index: a small file,
// written by the daemon's tier actors (region 0 the CPU tier's, one region
// per fs tier after it) and mapped read-only by engine processes, that
// answers "does the daemon hold this key, and in which tier" with a few
// memory loads and no syscall.
//
// The index is a hint. A stale, missing or dropped entry may cost a
// scheduling step or a recompute, never a wrong byte: the engine still asks
// the daemon before it reads a block. That is why the writer may drop a key
// when its buckets are full, why readers take no lock, and why a reader that
// keeps an old mapping after a daemon restart merely sees a dead table.
//
// The package never touches slot memory, leases, pins or a tier's own index
// (the tiers own those), and imports no kvtier package but messages (the
// public vocabulary, for Keys): engine-side clients import it, so it stays
// a leaf over the standard library and golang.org/x/sys/unix.
//
// # Concurrency
//
// Exactly one goroutine writes a given Region (the tier actor it belongs
// to). Readers
// may be anywhere: other goroutines or other processes. Every entry write is
// one aligned 8-byte atomic store and every read one aligned 8-byte load, so
// a reader never sees a torn entry.
//
// # File format (version 1)
//
// This is a wire format shared with clients/python/kvtier_client/residency.py;
// change both or neither. All integers are little-endian.
//
// Header, 64 bytes at offset 0:
//
//	[0:8]   magic, ASCII "KVTRES01" (written last by Create)
//	[8:12]  version u32 = 1
//	[12:16] nregions u32, 1..4
//	[16:24] generation u64, random per Create: identifies the daemon instance
//	[24:64] zero
//
// Region descriptors, 32 bytes each; descriptor r is at 64+32*r, and there is
// room for 4 (offsets 64..192) whatever nregions says:
//
//	[0:8]   offset u64 of the region's first bucket (multiple of 64, >= 192)
//	[8:12]  nbuckets u32 (power of two, >= 1)
//	[12:16] entries per bucket u32 = 8
//	[16:24] published u64: entries currently set (atomic stores by the writer)
//	[24:32] overflow u64: publishes dropped because both buckets were full
//
// Regions follow at offset 192 (a multiple of 64), each right after the
// previous. A bucket is 64 bytes: 8 entries of u64. Entry 0 is empty;
// otherwise it is (fp &^ 3) | state, state 1 (held in CPU memory, readable),
// 2 (held in a secondary tier) or 3 (being written into CPU memory: an
// engine asks the daemon, which answers it pending, rather than recompute
// it; the CPU tier's region only).
//
// A key's fingerprint (Fingerprint) is 64 bits whose high 62 are never all
// zero. Its buckets are b1 = fp & (nbuckets-1) and b2 = (fp>>32) &
// (nbuckets-1), with b2 = b1^1 when they coincide and nbuckets > 1. A lookup
// answers the state of the first entry in b1 then b2 whose value &^ 3 equals
// fp &^ 3, and 0 if there is none. A region built for capacity C has the
// next power of two >= ceil(C/4) buckets (load at most one half).
//
// Readers validate every header and descriptor field before the first
// lookup (Open, and the Python reader likewise), so a corrupt or foreign file
// is an ErrBadIndex, never an out-of-bounds read.
//
// # Restarts
//
// Create always makes a new inode (it removes any old file first), so a
// reader still holding the previous daemon's mapping keeps reading that dead
// table — never a half-built new one, and never a truncated file (SIGBUS).
// A reader that opens the path while Create runs gets ErrBadIndex (the magic
// is written last) and should retry later. Readers notice a restart by
// re-opening the path and comparing Generation.
package residency

"""Read the daemon's shared-memory residency index (Go: tiers/cpu/residency).

The index answers "does the daemon's CPU tier hold this key, and where" with
a couple of memory loads and no syscall, for the scheduler's hot path. It is
a hint: a stale or missing answer may cost a step or a recompute, never a
wrong byte (the daemon is still asked before a block is read).

The file format is documented in tiers/cpu/residency/doc.go; this module
must read it exactly as the Go reader (Open) does, and compute fingerprints
bit for bit as Go's Fingerprint. Standard library only.
"""

import hashlib
import mmap
import os
import struct

MAGIC = b"KVTRES01"
VERSION = 1
HEADER_SIZE = 64
DESC_SIZE = 32
MAX_REGIONS = 4
TABLE_START = HEADER_SIZE + DESC_SIZE * MAX_REGIONS  # 192
BUCKET_BYTES = 64
ENTRIES_PER_BUCKET = 8

STATE_NONE = 0
STATE_CPU = 1  # held in CPU memory, readable
STATE_SECONDARY = 2  # held in a secondary tier
STATE_WRITING = 3  # being written into CPU memory: ask the daemon, do not recompute

MASK64 = (1 << 64) - 1
_KEY_MASK = MASK64 & ~3  # the fingerprint bits of an entry
_GROUP_MUL = 0x9E3779B97F4A7C15
_MIX_MUL1 = 0xBF58476D1CE4E5B9
_MIX_MUL2 = 0x94D049BB133111EB

_HEADER = struct.Struct("<8sIIQ")
_DESC = struct.Struct("<QII")
# NB: on little-endian hosts CPython swaps its native unpacker in for '<Q',
# a memcpy of 8 bytes that compilers emit as one 8-byte load, and our entries
# are 8-byte aligned (the mapping is page-aligned, buckets are 64-byte
# aligned): an aligned 8-byte load is atomic on x86-64 (and aarch64), so an
# entry the Go writer stores atomically is never seen torn. The churn test in
# tests/test_residency.py checks this against a live writer.
_BUCKET = struct.Struct("<8Q")


def ns_fingerprint(ns):
    """The namespace's share of a fingerprint: the first 8 bytes
    (little-endian) of sha256(ns). Cache it per namespace."""
    return int.from_bytes(hashlib.sha256(ns.encode()).digest()[:8], "little")


_HASH32 = struct.Struct("<4Q").unpack_from  # a 32-byte hash as its 4 words
_GROUP_BE = struct.Struct(">I").unpack_from  # an OffloadKey's trailing group


def _fold(h):
    """XOR of the hash's 8-byte little-endian words, zero-padded at the end."""
    if len(h) == 32:  # the common case: four words, no big ints
        a, b, c, d = _HASH32(h)
        return a ^ b ^ c ^ d
    # Padding at the end of a little-endian number adds high zero bytes, so
    # int.from_bytes of the unpadded hash is already the padded value.
    v = int.from_bytes(h, "little")
    x = 0
    while v:
        x ^= v & MASK64
        v >>= 64
    return x


def _finish(x):
    """splitmix64 finalizer, then keep the high 62 bits non-zero."""
    x ^= x >> 30
    x = (x * _MIX_MUL1) & MASK64
    x ^= x >> 27
    x = (x * _MIX_MUL2) & MASK64
    x ^= x >> 31
    return x if x & _KEY_MASK else 4


def fingerprint(nsfp, hash, group):
    """Go's FingerprintWith: the index key of (namespace, hash, group)."""
    return _finish(_fold(hash) ^ nsfp ^ ((group * _GROUP_MUL) & MASK64))


def fingerprint_key(nsfp, key):
    """Fingerprint of a vLLM OffloadKey: the block hash followed by the KV
    cache group as 4 big-endian bytes. Equal to
    fingerprint(nsfp, key[:-4], int.from_bytes(key[-4:], "big"))."""
    if len(key) != 36:
        return fingerprint(nsfp, key[:-4], int.from_bytes(key[-4:], "big"))
    # NB: the 32-byte-hash case is unrolled (no slices, _finish inlined): it
    # runs per key on the scheduler's hot path. The golden tests pin it.
    a, b, c, d = _HASH32(key)
    x = a ^ b ^ c ^ d ^ nsfp ^ ((_GROUP_BE(key, 32)[0] * _GROUP_MUL) & MASK64)
    x ^= x >> 30
    x = (x * _MIX_MUL1) & MASK64
    x ^= x >> 27
    x = (x * _MIX_MUL2) & MASK64
    x ^= x >> 31
    return x if x & _KEY_MASK else 4


def parse(buf):
    """Validate an index image exactly as Go's parse does. Returns
    (generation, [(offset, nbuckets), ...]); raises ValueError."""
    size = len(buf)
    if size < TABLE_START:
        raise ValueError(f"residency index: {size} bytes, shorter than the {TABLE_START}-byte header")
    magic, version, nregions, generation = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise ValueError(f"residency index: magic {magic!r}, want {MAGIC!r}")
    if version != VERSION:
        raise ValueError(f"residency index: version {version}, want {VERSION}")
    if not 1 <= nregions <= MAX_REGIONS:
        raise ValueError(f"residency index: {nregions} regions, want 1..{MAX_REGIONS}")
    spans = [_parse_descriptor(buf, i) for i in range(nregions)]
    for i, (oi, ni) in enumerate(spans):
        for j in range(i + 1, len(spans)):
            oj, nj = spans[j]
            if oi < oj + nj * BUCKET_BYTES and oj < oi + ni * BUCKET_BYTES:
                raise ValueError(f"residency index: regions {i} and {j} overlap")
    return generation, spans


def _parse_descriptor(buf, i):
    offset, nbuckets, entries = _DESC.unpack_from(buf, HEADER_SIZE + DESC_SIZE * i)
    if offset % BUCKET_BYTES or offset < TABLE_START:
        raise ValueError(f"residency index: region {i} at offset {offset}")
    if nbuckets == 0 or nbuckets & (nbuckets - 1):
        raise ValueError(f"residency index: region {i} has {nbuckets} buckets, not a power of two")
    if entries != ENTRIES_PER_BUCKET:
        raise ValueError(f"residency index: region {i} has {entries} entries per bucket, want {ENTRIES_PER_BUCKET}")
    if offset + nbuckets * BUCKET_BYTES > len(buf):
        raise ValueError(
            f"residency index: region {i} ({nbuckets} buckets at {offset}) past the end of {len(buf)} bytes"
        )
    return offset, nbuckets


class Residency:
    """A read-only mapping of the index at path, validated on open.

    ``state(fp)`` is the key's state in the first region that holds it
    (STATE_NONE if none). One writer (the daemon) updates the file in place;
    this reader takes no lock and makes no syscall per lookup. After a
    daemon restart this mapping is a dead table: re-open the path and
    compare ``generation`` to notice.
    """

    def __init__(self, path):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            size = os.fstat(fd).st_size
            if size < TABLE_START:
                raise ValueError(f"residency index {path}: {size} bytes, shorter than the {TABLE_START}-byte header")
            self._mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)  # the mapping outlives the descriptor
        try:
            self.generation, spans = parse(self._mm)
        except ValueError as e:
            self._mm.close()
            raise ValueError(f"{path}: {e}") from None
        self.regions = len(spans)
        self.spans = spans
        unpack = _BUCKET.unpack_from
        # Per region: bucket mask, first byte, and the bound unpacker.
        self._tables = tuple((n - 1, off, unpack) for off, n in spans)

    def state(self, fp):
        """The key's state (0 none, 1 CPU, 2 secondary, 3 being written)."""
        fpm = fp & _KEY_MASK
        if not fpm:
            return STATE_NONE
        s1, s2, s3 = fpm | 1, fpm | 2, fpm | 3
        mm = self._mm
        hi = fp >> 32
        for mask, base, unpack in self._tables:
            b1 = fp & mask
            b2 = hi & mask
            if b2 == b1 and mask:
                b2 = b1 ^ 1
            # NB: the single writer keeps at most one entry per key, so
            # testing the states in turn answers what a scan in order would.
            w = unpack(mm, base + (b1 << 6))
            if s1 in w:
                return 1
            if s2 in w:
                return 2
            if s3 in w:
                return 3
            if b2 != b1:
                w = unpack(mm, base + (b2 << 6))
                if s1 in w:
                    return 1
                if s2 in w:
                    return 2
                if s3 in w:
                    return 3
        return STATE_NONE

    def held_cpu(self, nsfp, key):
        """Whether the first region holds the vLLM OffloadKey ``key`` in CPU
        memory (state 1): ``state(fingerprint_key(nsfp, key)) == 1`` for an
        index whose first region is the CPU tier's — the scheduler asks
        this per key of a store."""
        return self._cpu(nsfp, key)[0] == STATE_CPU

    def _cpu(self, nsfp, key):
        """The state of the vLLM OffloadKey ``key`` in the first region (0,
        1 readable, 3 being written) and its fingerprint, in one call with
        the fingerprint inlined: the scheduler asks this per key."""
        if len(key) == 36:
            a, b, c, d = _HASH32(key)
            x = a ^ b ^ c ^ d ^ nsfp ^ ((_GROUP_BE(key, 32)[0] * _GROUP_MUL) & MASK64)
            x ^= x >> 30
            x = (x * _MIX_MUL1) & MASK64
            x ^= x >> 27
            x = (x * _MIX_MUL2) & MASK64
            x ^= x >> 31
            fp = x if x & _KEY_MASK else 4
        else:
            fp = fingerprint_key(nsfp, key)
        mask, base, unpack = self._tables[0]
        k = fp & _KEY_MASK
        b1 = fp & mask
        w = unpack(self._mm, base + (b1 << 6))
        if k | STATE_CPU in w:
            return STATE_CPU, fp
        if k | STATE_WRITING in w:
            return STATE_WRITING, fp
        b2 = (fp >> 32) & mask
        if b2 == b1:
            if not mask:
                return STATE_NONE, fp
            b2 = b1 ^ 1
        w = unpack(self._mm, base + (b2 << 6))
        if k | STATE_CPU in w:
            return STATE_CPU, fp
        if k | STATE_WRITING in w:
            return STATE_WRITING, fp
        return STATE_NONE, fp

    def not_held_cpu(self, nsfp, keys):
        """The vLLM OffloadKeys among keys that the first region does not
        hold in CPU memory, in order: held_cpu over a list (a store's keys).
        A loop over held_cpu, not a second copy of it: the inlined loop
        saved about 5% of ~0.9 µs a key, on a store's probe (every store
        without credit; with credit, only one whose first block is held)."""
        held = self.held_cpu
        return [key for key in keys if not held(nsfp, key)]

    def held(self, nsfp, key):
        """0 when no region holds the vLLM OffloadKey ``key``, else its
        state: 1 in CPU memory, 3 being written into it (the first region),
        2 in a secondary tier (the regions after it). The scheduler's
        per-key test."""
        st, fp = self._cpu(nsfp, key)
        if st or len(self._tables) == 1:
            return st
        st = self.state(fp)
        return st if st == STATE_SECONDARY else STATE_NONE

    def words(self, region):
        """Every entry word of a region, one aligned 8-byte load each (for
        tests and debugging)."""
        off, n = self.spans[region]
        return struct.unpack_from(f"<{n * ENTRIES_PER_BUCKET}Q", self._mm, off)

    def close(self):
        """Unmap the index. Safe to call more than once."""
        self._mm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

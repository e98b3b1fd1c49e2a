"""What the scheduler and the workers must agree on without talking:
the layout namespace, the slot geometry, and which bytes of a slot each
engine block occupies. Pure functions over plain values (no vLLM state, no
sockets), so they are unit-tested directly."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, FrozenSet, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np


class KvtierConfigError(ValueError):
    """A configuration that would make kvtier serve wrong or unusable blocks
    (a slot too small for the engine's chunk, a missing address)."""


# -- namespace ---------------------------------------------------------------


def layout_namespace(facts: Mapping[str, object]) -> str:
    """The key namespace for engines with these layout facts: a digest of
    everything that makes two equal block hashes incompatible (model, dtype,
    KV layout, page bytes, block size, parallelism, salt, hash seed).
    Engines whose facts differ in any way never share a block."""
    canon = json.dumps(facts, sort_keys=True, separators=(",", ":"), default=str)
    return "vllm-" + hashlib.sha256(canon.encode()).hexdigest()[:32]


def none_hash_digest() -> Tuple[str, bool]:
    """A digest of vLLM's root block hash (NONE_HASH) in this process, and
    whether it is reproducible in another process. vLLM seeds it at random
    per process for non-cryptographic hash functions unless PYTHONHASHSEED
    is set; keys of such a process can never match another's, so the digest
    goes into the namespace (no silent mismatch) and the caller warns."""
    from vllm.v1.core import kv_cache_utils as kcu

    none_hash = getattr(kcu, "NONE_HASH", None)
    if none_hash is None:
        return "uninitialised", False
    digest = hashlib.sha256(bytes(none_hash)).hexdigest()[:16]
    seed = getattr(kcu, "_NONE_HASH_SEED", None)
    default = getattr(kcu, "DEFAULT_NONE_HASH_SEED", None)
    reproducible = os.environ.get("PYTHONHASHSEED") is not None or (
        seed is not None and seed == default)
    return digest, reproducible


# vLLM's prefix_caching_hash_algo values (vllm.utils.hashing.get_hash_fn_by_name).
HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


def possible_none_hash_digests() -> Optional[List[str]]:
    """The digests none_hash_digest() can return once vLLM seeded its root
    hash, known before it does so (vLLM seeds it after building the
    connector), by vLLM's own seed rule (resolve_none_hash_seed): one, for
    the engine's prefix_caching_hash_algo, where the vLLM config being built
    is in context; otherwise one per algorithm whose seed is not drawn at
    random (the cryptographic ones, and every one under PYTHONHASHSEED). A
    root seeded at random matches none of them, and no namespace fixed in
    advance either. None where vLLM lacks the seed rule."""
    try:
        from vllm.config import get_current_vllm_config_or_none
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import kv_cache_utils as kcu
    except ImportError:
        return None
    resolve = getattr(kcu, "resolve_none_hash_seed", None)
    if resolve is None:
        return None
    cfg = get_current_vllm_config_or_none()
    algo = getattr(getattr(cfg, "cache_config", None), "prefix_caching_hash_algo", None)
    random_seeded: FrozenSet[str] = getattr(kcu, "_NON_CRYPTO_HASH_FUNCTIONS", frozenset())
    seeded = os.environ.get("PYTHONHASHSEED") is not None
    out = []
    for name in ([algo] if algo else HASH_ALGOS):
        try:
            hash_fn = get_hash_fn_by_name(name)
        except (ValueError, ImportError):
            continue
        if hash_fn in random_seeded and not seeded:
            continue
        out.append(hashlib.sha256(bytes(hash_fn(resolve(hash_fn)))).hexdigest()[:16])
    return out


# -- slot geometry -------------------------------------------------------------


@dataclass(frozen=True)
class SlotGeometry:
    """How one kvtier slot holds one offloaded chunk of every worker.

    Worker ``w``'s shard starts at ``w * shard_bytes``; within it, the
    engine's KV tensors follow each other, tensor ``t`` taking
    ``page_bytes[t] * blocks_per_chunk`` bytes, sub-block ``j`` of a chunk at
    ``j * page_bytes[t]`` within that (vLLM's own CPU tier lays a chunk out
    the same way)."""

    world_size: int
    blocks_per_chunk: int
    shard_bytes: int  # one worker's bytes of one chunk

    @property
    def slot_bytes_needed(self) -> int:
        return self.world_size * self.shard_bytes

    def check(self, block_bytes: int) -> None:
        if block_bytes < self.slot_bytes_needed:
            raise KvtierConfigError(
                f"kvtierd's slots are {block_bytes} bytes but one offloaded chunk "
                f"needs {self.slot_bytes_needed} ({self.world_size} worker(s) x "
                f"{self.shard_bytes} bytes = {self.blocks_per_chunk} block(s) per "
                f"chunk): start kvtierd with --block-bytes {self.slot_bytes_needed} "
                f"or more")


def tensor_offsets(page_bytes: Sequence[int], blocks_per_chunk: int) -> List[int]:
    """Offset of each KV tensor's region within one worker's shard."""
    out, off = [], 0
    for p in page_bytes:
        out.append(off)
        off += p * blocks_per_chunk
    return out


# -- copy plans ----------------------------------------------------------------


@dataclass(frozen=True)
class GroupCopy:
    """One KV-cache group's part of a transfer: engine block ``blocks[i]``
    pairs with sub-block ``subs[i]`` of slot ``slots[i]``."""

    group: int
    blocks: np.ndarray
    slots: np.ndarray
    subs: np.ndarray


def copy_plan(block_ids: Sequence[int], group_sizes: Sequence[int],
              block_indices: Sequence[int], slots: Sequence[int],
              blocks_per_chunk: int) -> Iterator[GroupCopy]:
    """Pairs engine blocks with slot sub-blocks, group by group, with vLLM's
    GPULoadStoreSpec semantics: blocks are ordered by group, ``group_sizes[g]``
    of them per group; ``block_indices[g]`` is the logical index of the group's
    first block in its request, so a first chunk that the group enters part
    way is entered at sub-block ``block_indices[g] % blocks_per_chunk``. Slots
    are ordered by group too, one per chunk the group touches."""
    block_ids = np.asarray(block_ids, dtype=np.int64)
    slots = np.asarray(slots, dtype=np.int64)
    b_off = s_off = 0
    for g, (size, first) in enumerate(zip(group_sizes, block_indices)):
        if size == 0:
            continue
        skip = int(first) % blocks_per_chunk
        logical = np.arange(skip, skip + size, dtype=np.int64)
        n_chunks = -(-(skip + size) // blocks_per_chunk)
        if b_off + size > len(block_ids) or s_off + n_chunks > len(slots):
            raise ValueError(
                f"transfer spec mismatch: group {g} needs {size} blocks and "
                f"{n_chunks} slots past {b_off}/{s_off}, spec has "
                f"{len(block_ids)}/{len(slots)}")
        yield GroupCopy(
            group=g,
            blocks=block_ids[b_off:b_off + size],
            slots=slots[s_off:s_off + n_chunks][logical // blocks_per_chunk],
            subs=logical % blocks_per_chunk,
        )
        b_off += size
        s_off += n_chunks
    if b_off != len(block_ids) or s_off != len(slots):
        raise ValueError(
            f"transfer spec mismatch: used {b_off}/{len(block_ids)} blocks and "
            f"{s_off}/{len(slots)} slots")


@dataclass(frozen=True)
class PoolRef:
    """Which pool file a spec's slots index: its path and identity (device,
    inode, size). A restarted kvtierd has a new pool file at the same path;
    a worker must never copy into the old one for the new daemon's slots."""

    path: str
    dev: int
    ino: int
    size: int
    block_bytes: int

    @classmethod
    def of(cls, path: str, block_bytes: int, slots: int) -> "PoolRef":
        # NB: size is the file's (every block size's slots share it); a
        # session of another size than the pool's first has the slots of
        # block_bytes that fit it.
        st = os.stat(path)
        if st.st_size < block_bytes * slots:
            raise FileNotFoundError(f"{path} is smaller than {slots} slots of {block_bytes} bytes")
        return cls(path, st.st_dev, st.st_ino, st.st_size, block_bytes)


def optional_int(v: Optional[Any]) -> Optional[int]:
    return None if v is None else int(v)

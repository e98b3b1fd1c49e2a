"""The spec that travels from the scheduler to the workers (by pickle):
kvtier slot indexes, and the pool file they index."""

from __future__ import annotations

from typing import Sequence

from vllm.v1.kv_offload.base import BlockIDsLoadStoreSpec

from .layout import PoolRef


class KvtierLoadStoreSpec(BlockIDsLoadStoreSpec):
    """``block_ids`` are kvtier slot indexes, one per offloaded chunk, in the
    order of the keys they were prepared for; ``pool`` names the pool file
    (and its identity) those indexes belong to."""

    def __init__(self, slots: Sequence[int], pool: PoolRef):
        super().__init__(list(slots))
        self.pool = pool

    def __repr__(self) -> str:
        return f"KvtierLoadStoreSpec(slots={self.block_ids!r}, pool={self.pool.path})"

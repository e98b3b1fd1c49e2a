"""The worker side: copies engine blocks to and from kvtier's pool.

A worker needs no connection to kvtierd: each spec names the pool file its
slots index (path and inode), and the worker maps it read-write
(``MAP_SHARED``) the first time it sees it. Completion is reported the way
vLLM's own workers do (``get_finished``); vLLM's scheduler aggregates the
workers' reports and tells the manager, which tells kvtier once per job.

Two copy paths behind one interface:

- **CPU** (vLLM's CPU backend; KV caches in host memory): torch gathers and
  scatters over a strided view of the pool, synchronously in ``submit_*``
  (the caches and the pool are both host memory: there is nothing to
  overlap with on the CPU backend).
- **CUDA**: the pool is registered as pinned host memory
  (``cudaHostRegister``) and the copies run on a side stream as one batched
  copy per transfer (vLLM's ``swap_blocks_batch`` over pointer arrays); a
  CUDA event per job marks completion, queried without busy waiting.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Sequence, Tuple

import numpy as np
import torch

from vllm.v1.kv_offload.base import (
    GPULoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)

from .layout import KvtierConfigError, PoolRef, copy_plan, tensor_offsets
from .transfer import KvtierLoadStoreSpec

log = logging.getLogger("kvtier_vllm")


class PoolMapping:
    """One kvtier pool file mapped read-write, viewed per KV tensor as
    ``[slots, blocks_per_chunk, page_bytes]`` at this worker's shard."""

    def __init__(self, ref: PoolRef, shard_base: int, page_bytes: Sequence[int],
                 blocks_per_chunk: int):
        fd = os.open(ref.path, os.O_RDWR)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino, st.st_size) != (ref.dev, ref.ino, ref.size):
                raise FileNotFoundError(
                    f"{ref.path} is not the pool the scheduler planned with "
                    "(kvtierd restarted in between)")
            self._mm = mmap.mmap(fd, ref.size, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.ref = ref
        slots = ref.size // ref.block_bytes
        flat = torch.frombuffer(self._mm, dtype=torch.int8)[:slots * ref.block_bytes]
        self.pool = flat.view(slots, ref.block_bytes)
        self.views: List[torch.Tensor] = []
        for off, page in zip(tensor_offsets(page_bytes, blocks_per_chunk), page_bytes):
            lo = shard_base + off
            region = self.pool[:, lo:lo + page * blocks_per_chunk]
            self.views.append(region.unflatten(1, (blocks_per_chunk, page)))

    def close(self) -> None:
        self.views.clear()
        self.pool = None
        try:
            self._mm.close()
        except BufferError:
            pass  # a tensor still aliases it; the mapping goes with the last one


def pool_replaced(ref: PoolRef) -> bool:
    """Whether ref's pool file is no longer at its path (removed, or
    replaced by a restarted kvtierd's: another inode or size)."""
    try:
        st = os.stat(ref.path)
    except FileNotFoundError:
        return True
    return (st.st_dev, st.st_ino, st.st_size) != (ref.dev, ref.ino, ref.size)


@dataclass
class _Copy:
    tensor: int
    size: int  # bytes of the page actually copied (un-padded)


class KvtierWorker(OffloadingWorker):
    def __init__(self, spec, kv_caches):
        self._bpc = spec.blocks_per_chunk
        self._engine: List[torch.Tensor] = []
        self._pages: List[int] = []
        for t in kv_caches.tensors:
            self._pages.append(int(t.page_size_bytes))
            self._engine.append(t.tensor.view(torch.int8).view(-1, t.page_size_bytes))
        # per group: the (tensor, size) copies one block of that group takes
        self._group_copies: List[List[_Copy]] = [
            [_Copy(r.tensor_idx, int(r.page_size_bytes)) for r in refs]
            for refs in kv_caches.group_data_refs
        ]
        shard = sum(self._pages) * self._bpc
        if shard > spec.geometry.shard_bytes:
            raise KvtierConfigError(
                f"this worker's KV pages take {shard} bytes per chunk, more than the "
                f"{spec.geometry.shard_bytes} the scheduler planned slots for")
        self._shard_base = spec.rank * spec.geometry.shard_bytes
        self._cuda = bool(self._engine) and self._engine[0].is_cuda
        self._maps: Dict[PoolRef, PoolMapping] = {}
        self._finished: List[TransferResult] = []
        self.dropped_stores = 0  # stores planned on a pool kvtierd replaced (nothing copied)
        self._inflight: Deque[Tuple[int, Any, int]] = deque()  # CUDA: (job, event, bytes)
        self._events: Dict[int, Any] = {}  # job → its CUDA event
        self._stream = torch.cuda.Stream() if self._cuda else None
        log.info("kvtier worker: %d KV tensor(s), %s copy path, shard at %d",
                 len(self._engine), "CUDA" if self._cuda else "CPU", self._shard_base)

    # -- pool mappings --------------------------------------------------------

    def _mapping(self, ref: PoolRef) -> PoolMapping:
        m = self._maps.get(ref)
        if m is None:
            m = PoolMapping(ref, self._shard_base, self._pages, self._bpc)
            if self._cuda:
                _host_register(m)
            # A new pool means kvtierd restarted: the old one is never named again
            # once the jobs planned on it are done (they hold their own views).
            for old in list(self._maps):
                if old.path == ref.path and not self._inflight:
                    self._maps.pop(old).close()
            self._maps[ref] = m
        return m

    # -- OffloadingWorker ---------------------------------------------------

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec,
                     dst_spec: KvtierLoadStoreSpec) -> bool:
        return self._submit(job_id, src_spec, dst_spec, to_pool=True)

    def submit_load(self, job_id: int, src_spec: KvtierLoadStoreSpec,
                    dst_spec: GPULoadStoreSpec, expedited: bool = False) -> bool:
        return self._submit(job_id, dst_spec, src_spec, to_pool=False)

    def _submit(self, job_id: int, engine_spec: GPULoadStoreSpec,
                pool_spec: KvtierLoadStoreSpec, to_pool: bool) -> bool:
        try:
            pool = self._mapping(pool_spec.pool)
        except OSError as e:
            ref = pool_spec.pool
            if not pool_replaced(ref):
                # The pool the scheduler planned with is there and this worker
                # cannot map it (another /dev/shm, permissions): every copy
                # would fail. A clear error, never a silent one.
                raise KvtierConfigError(
                    f"kvtier: this worker cannot map kvtierd's pool {ref.path} ({e}); "
                    "the engine's workers must see the daemon's pool file") from e
            if not to_pool:
                # A load planned on a pool replaced before this worker ever
                # mapped it: its bytes are gone, and vLLM (0.32, 0.33) has no
                # way to fail a load. Never hand the engine unread KV.
                raise RuntimeError(
                    f"kvtier: load job {job_id} planned on a pool kvtierd replaced "
                    f"({ref.path}: kvtierd restarted before the load ran)") from e
            # kvtierd restarted after planning this store: its slots were the
            # dead daemon's. Nothing is copied; the scheduler's manager voids
            # the store's completion (planned in an older session), so no
            # daemon commits what was not written. Reported done, not failed:
            # vLLM's offloading worker asserts that every job succeeded
            # (0.32, 0.33: "we currently do not support job failures").
            log.warning("kvtier: store job %d dropped: %s", job_id, e)
            self.dropped_stores += 1
            self._finished.append(TransferResult(job_id, True, 0, 0.0))
            return True
        plan = list(copy_plan(engine_spec.block_ids, engine_spec.group_sizes,
                              engine_spec.block_indices, pool_spec.block_ids, self._bpc))
        if self._cuda:
            nbytes = self._copy_cuda(plan, pool, to_pool)
            event = torch.cuda.Event()
            event.record(self._stream)
            self._inflight.append((job_id, event, nbytes))
            self._events[job_id] = event
        else:
            nbytes = self._copy_cpu(plan, pool, to_pool)
            self._finished.append(TransferResult(job_id, True, nbytes, None))
        return True

    def _copy_cpu(self, plan, pool: PoolMapping, to_pool: bool) -> int:
        nbytes = 0
        for gc in plan:
            blocks = torch.from_numpy(gc.blocks)
            slots = torch.from_numpy(gc.slots)
            subs = torch.from_numpy(gc.subs)
            for c in self._group_copies[gc.group]:
                engine = self._engine[c.tensor][:, :c.size]
                view = pool.views[c.tensor][:, :, :c.size]
                if to_pool:
                    view[slots, subs] = engine[blocks]
                else:
                    engine[blocks] = view[slots, subs]
                nbytes += c.size * len(gc.blocks)
        return nbytes

    def _copy_cuda(self, plan, pool: PoolMapping, to_pool: bool) -> int:
        from vllm import _custom_ops as ops

        src_ptrs: List[np.ndarray] = []
        dst_ptrs: List[np.ndarray] = []
        sizes: List[np.ndarray] = []
        for gc in plan:
            for c in self._group_copies[gc.group]:
                engine = self._engine[c.tensor]
                view = pool.views[c.tensor]
                e = engine.data_ptr() + gc.blocks.astype(np.uint64) * np.uint64(engine.stride(0))
                p = (view.data_ptr() + gc.slots.astype(np.uint64) * np.uint64(view.stride(0))
                     + gc.subs.astype(np.uint64) * np.uint64(view.stride(1)))
                (src_ptrs if to_pool else dst_ptrs).append(e)
                (dst_ptrs if to_pool else src_ptrs).append(p)
                sizes.append(np.full(len(gc.blocks), c.size, dtype=np.uint64))
        if not sizes:
            return 0
        src = torch.from_numpy(np.concatenate(src_ptrs).view(np.int64))
        dst = torch.from_numpy(np.concatenate(dst_ptrs).view(np.int64))
        size = torch.from_numpy(np.concatenate(sizes).view(np.int64))
        # Stores read KV the model is still writing: order after the compute
        # stream. Loads write blocks the step may still zero: same ordering.
        self._stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._stream):
            ops.swap_blocks_batch(src, dst, size)
        return int(size.sum())

    def get_finished(self) -> List[TransferResult]:
        while self._inflight and self._inflight[0][1].query():
            job, _, nbytes = self._inflight.popleft()
            self._events.pop(job, None)
            self._finished.append(TransferResult(job, True, nbytes, None))
        out, self._finished = self._finished, []
        return out

    def wait(self, job_ids) -> None:
        for job in job_ids:
            event = self._events.get(job)
            if event is not None:
                event.synchronize()

    def shutdown(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()
        for m in self._maps.values():
            if self._cuda:
                _host_unregister(m)
            m.close()
        self._maps.clear()


def _host_register(m: PoolMapping) -> None:
    """Pins the mapped pool for async DMA (vLLM's cpu/host_register.py does
    the same for its own region)."""
    rc = torch.cuda.cudart().cudaHostRegister(m.pool.data_ptr(), m.ref.size, 0)
    if int(rc) != 0:
        raise RuntimeError(f"cudaHostRegister of kvtier's pool failed: {rc}")


def _host_unregister(m: PoolMapping) -> None:
    torch.cuda.cudart().cudaHostUnregister(m.pool.data_ptr())

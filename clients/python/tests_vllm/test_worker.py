"""The connector's worker against real pool files (no engine, no daemon):
what it does when the pool a job was planned on cannot be mapped. vLLM's
offloading worker asserts that every job succeeded (0.32 and 0.33: "we
currently do not support job failures"), so a worker never reports a
failure; it drops what was planned on a replaced pool, and fails loudly
where a copy would read or commit bytes nobody wrote."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from conftest import needs_vllm

pytestmark = needs_vllm

PAGE = 4096
SLOTS = 8


def worker():
    import torch

    from kvtier_bench.vllm_harness import offloading_config
    from kvtier_vllm.spec import KvtierOffloadingSpec
    from kvtier_vllm.worker import KvtierWorker

    spec = KvtierOffloadingSpec(offloading_config({"kvtier_address": "ipc:///unused"}, page_bytes=PAGE))
    engine = torch.arange(4 * PAGE, dtype=torch.int32).view(torch.int8).view(-1, PAGE)[:4].clone()
    caches = SimpleNamespace(tensors=[SimpleNamespace(tensor=engine, page_size_bytes=PAGE)],
                             group_data_refs=[[SimpleNamespace(tensor_idx=0, page_size_bytes=PAGE)]])
    return KvtierWorker(spec, caches), engine


def pool_file(path) -> "PoolRef":  # noqa: F821
    from kvtier_vllm.layout import PoolRef

    with open(path, "wb") as f:
        f.truncate(SLOTS * PAGE)
    return PoolRef.of(str(path), PAGE, SLOTS)


def specs(ref, slots=(0, 1)):
    from vllm.v1.kv_offload.base import GPULoadStoreSpec

    from kvtier_vllm.transfer import KvtierLoadStoreSpec

    return GPULoadStoreSpec([0, 1], [2], [0]), KvtierLoadStoreSpec(list(slots), ref)


def replace(path) -> None:
    """What a restarted kvtierd does to the pool path: a new file (inode)."""
    new = f"{path}.new"
    with open(new, "wb") as f:
        f.truncate(SLOTS * PAGE)
    os.rename(new, path)


def test_a_store_planned_on_a_replaced_pool_is_dropped_and_reported_done(tmp_path):
    w, _ = worker()
    path = tmp_path / "pool"
    ref = pool_file(path)
    replace(path)  # kvtierd restarted between the plan and the copy
    gpu, pool = specs(ref)
    assert w.submit_store(7, gpu, pool)
    [done] = w.get_finished()
    assert (done.job_id, done.success, done.transfer_size) == (7, True, 0), \
        "done (vLLM asserts success), nothing copied"
    assert w.dropped_stores == 1
    assert path.read_bytes() == bytes(SLOTS * PAGE), "nothing written into the new daemon's pool"


def test_a_store_into_the_live_pool_copies(tmp_path):
    """The control: the same job on a pool still in place is copied."""
    w, engine = worker()
    path = tmp_path / "pool"
    ref = pool_file(path)
    gpu, pool = specs(ref, slots=(3, 5))
    assert w.submit_store(8, gpu, pool)
    [done] = w.get_finished()
    assert done.success and done.transfer_size == 2 * PAGE
    data = path.read_bytes()
    assert data[3 * PAGE:4 * PAGE] == engine[0].numpy().tobytes()
    assert data[5 * PAGE:6 * PAGE] == engine[1].numpy().tobytes()
    assert w.dropped_stores == 0


def test_a_load_planned_on_a_replaced_pool_fails_loudly(tmp_path):
    w, engine = worker()
    before = engine.clone()
    path = tmp_path / "pool"
    ref = pool_file(path)
    replace(path)
    gpu, pool = specs(ref)
    with pytest.raises(RuntimeError, match="kvtierd restarted before the load ran"):
        w.submit_load(9, pool, gpu)
    assert bool((engine == before).all()), "no unread KV handed to the engine"


def test_a_pool_this_worker_cannot_map_is_a_clear_error(tmp_path):
    """The pool is in place but cannot be mapped here (a directory stands
    in for a file this process may not open read-write)."""
    from kvtier_vllm.layout import KvtierConfigError, PoolRef

    d = tmp_path / "not-a-file"
    d.mkdir()
    st = os.stat(d)
    ref = PoolRef(str(d), st.st_dev, st.st_ino, st.st_size, PAGE)
    w, _ = worker()
    gpu, pool = specs(ref)
    with pytest.raises(KvtierConfigError, match="cannot map kvtierd's pool"):
        w.submit_store(10, gpu, pool)

"""Fixtures of the SGLang backend's tests: a real kvtierd (built from this
repository) and SGLang's own host KV pools and storage classes on CPU
tensors (SGLang 0.5.23 installed without its CUDA kernels).

Run in the SGLang venv: ``$(bash scripts/sglang-env.sh)/bin/python -m pytest
clients/python/tests_sglang``. Without SGLang every test skips, saying so."""

from __future__ import annotations

import os
import time
from typing import List, Optional, Sequence

import pytest

from testsupport.engines import skip_without
from testsupport.kvtierd import Daemon, build_kvtierd, stop_all

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import torch
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo, MLABufferInfo
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    HAVE_SGLANG = True
except Exception:  # ImportError, or a broken install
    HAVE_SGLANG = False

NEEDS_SGLANG = skip_without(HAVE_SGLANG, "SGLang", "scripts/sglang-env.sh")


def pytest_collection_modifyitems(items):
    if not HAVE_SGLANG:
        for item in items:
            item.add_marker(NEEDS_SGLANG)


@pytest.fixture(scope="session")
def kvtierd_bin(tmp_path_factory):
    return build_kvtierd(str(tmp_path_factory.mktemp("bin") / "kvtierd"))


@pytest.fixture
def daemon_factory(kvtierd_bin, tmp_path):
    """kvtierd on a unix:// engine socket (a killed daemon's connection
    ends at once: the backend sees CLOSED, no timeout), slots of
    block_bytes; start=False: made, not started."""
    made: List[Daemon] = []

    def make(block_bytes: int, slots: int, config: Optional[str] = None,
             extra_args: Sequence[str] = (), start: bool = True) -> Daemon:
        d = Daemon(kvtierd_bin, str(tmp_path), block_bytes, block_bytes * slots, config, extra_args,
                   transport="unix", sock_name=f"engine-{time.monotonic_ns()}.sock", tag="sgltest")
        made.append(d)
        return d.start() if start else d

    yield make
    stop_all(made)


# -- SGLang's host pools on CPU tensors ---------------------------------------

LAYERS, HEADS, HEAD_DIM, PAGE = 2, 2, 16, 4


def _ptrs(ts):
    return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)


def mha_pool(layout: str = "layer_first", pages: int = 64, dtype=None, page_size: int = PAGE,
             layers: int = LAYERS, heads: int = HEADS, head_dim: int = HEAD_DIM):
    """SGLang's MHATokenToKVPoolHost over CPU 'device' buffers."""
    dtype = dtype or torch.bfloat16
    tokens = 16 * page_size
    k = tuple(torch.zeros(tokens, heads, head_dim, dtype=dtype) for _ in range(layers))
    v = tuple(torch.zeros(tokens, heads, head_dim, dtype=dtype) for _ in range(layers))
    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=_ptrs(k), v_data_ptrs=_ptrs(v),
                                           layout=KVBufferLayout.NHD),
                         page_size=page_size, head_num=heads, head_dim=head_dim, v_head_dim=head_dim,
                         dtype=dtype, device=torch.device("cpu"))
    return MHATokenToKVPoolHost(info, 1.0, 0, page_size, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=0, end_layer=layers,
                                host_token_capacity=pages * page_size)


def mla_pool(layout: str = "layer_first", pages: int = 64, dtype=None, page_size: int = PAGE,
             layers: int = LAYERS, lora: int = 32, rope: int = 8):
    """SGLang's MLATokenToKVPoolHost over CPU 'device' buffers."""
    dtype = dtype or torch.bfloat16
    tokens = 16 * page_size
    bufs = tuple(torch.zeros(tokens, 1, lora + rope, dtype=dtype) for _ in range(layers))
    info = MLABufferInfo(buffers=bufs, data_ptrs=_ptrs(bufs), layer_indices=tuple(range(layers)),
                         device_layer_num=layers, page_size=page_size, kv_lora_rank=lora,
                         qk_rope_head_dim=rope, kv_cache_dim=lora + rope, dtype=dtype,
                         device=torch.device("cpu"))
    return MLATokenToKVPoolHost(info, 1.0, 0, page_size, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=0, end_layer=layers,
                                target_layer_num=layers, host_token_capacity=pages * page_size)


def storage_config(extra: dict, model: str = "test/model", tp_rank: int = 0, tp_size: int = 1,
                   mla: bool = False, layout: str = "layer_first"):
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
                                attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla,
                                enable_storage_metrics=False,
                                is_page_first_layout=layout.startswith("page_first"),
                                model_name=model, extra_config=dict(extra))


def fill_page(pool, start: int, seed: int) -> None:
    """Writes deterministic bytes (a function of seed) into the host page at start."""
    page = pool.get_data_page(start, flat=False)
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (page.numel() * page.element_size(),), dtype=torch.uint8, generator=g)
    page.copy_(raw.view(page.dtype).view(page.shape))


def page_bytes_at(pool, start: int) -> bytes:
    return bytes(pool.get_data_page(start, flat=True).contiguous().view(torch.uint8).numpy())


def expected_bytes(pool, seed: int) -> bytes:
    page = pool.get_data_page(0, flat=False)
    g = torch.Generator().manual_seed(seed)
    return bytes(torch.randint(0, 256, (page.numel() * page.element_size(),), dtype=torch.uint8,
                               generator=g).numpy())


def indices(pool, pages: Sequence[int]):
    """host_indices for pages (page numbers of the pool), as SGLang passes them."""
    ps = pool.page_size
    return torch.cat([torch.arange(p * ps, (p + 1) * ps, dtype=torch.int64) for p in pages]
                     or [torch.empty(0, dtype=torch.int64)])

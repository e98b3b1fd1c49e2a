"""Builds vLLM's offloading configuration and managers without an engine:
kvtier's manager and vLLM's native CPU manager at the same capacity, for the
differential tests and the scheduler-side benchmark. Works on vLLM 0.32 and
0.33 (fields one version lacks are left out)."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Dict, List, Optional

from vllm.v1.kv_offload import config as oc


def _make(cls, **kw):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in kw.items() if k in names})


def offloading_config(extra: Dict[str, Any], *, page_bytes: int = 4096,
                      tokens_per_block: int = 32, blocks_per_chunk: int = 1,
                      groups: int = 1, world_size: int = 1, rank: int = 0,
                      model: str = "harness-model", dtype: str = "bfloat16"):
    """An OffloadingConfig as vLLM's connector would build it for a model
    whose worker keeps ``page_bytes`` of KV per block."""
    return _make(
        oc.OffloadingConfig,
        groups=tuple(_make(oc.OffloadingGroupConfig, tokens_per_block=tokens_per_block,
                           layer_names=(f"layer.{g}",), group_id=g) for g in range(groups)),
        worker_kv_bytes_per_block=page_bytes,
        enable_kv_cache_events=False,
        extra_config=dict(extra),
        engine_id="harness",
        model=_make(oc.OffloadingModelConfig, name=model, dtype=dtype),
        cache=_make(oc.OffloadingCacheConfig, tokens_per_hash=tokens_per_block,
                    blocks_per_chunk=blocks_per_chunk),
        parallel=_make(oc.OffloadingParallelConfig, rank=rank, world_size=world_size,
                       tp_size=world_size, pp_size=1, pcp_size=1, dcp_size=1,
                       data_parallel_index=0, data_parallel_size=1,
                       data_parallel_rank_local=None, is_parallelism_agnostic=False),
    )


def init_hashing() -> None:
    """Seeds vLLM's root block hash as an engine does (sha256)."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)


def native_manager(capacity: int, page_bytes: int = 4096, **kw):
    """vLLM's own CPUOffloadingManager holding ``capacity`` chunks."""
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    align = getattr(CPUOffloadingSpec, "BLOCK_SIZE_ALIGNMENT", 1)
    chunk = -(-page_bytes // align) * align
    spec = CPUOffloadingSpec(offloading_config({"cpu_bytes_to_use": capacity * chunk},
                                               page_bytes=page_bytes, **kw))
    return spec.get_manager()


def kvtier_manager(address: str, page_bytes: int = 4096, extra: Optional[dict] = None, **kw):
    """kvtier's manager, speaking to the kvtierd at ``address``."""
    from kvtier_vllm.spec import KvtierOffloadingSpec

    init_hashing()
    cfg = {"kvtier_address": address, **(extra or {})}
    return KvtierOffloadingSpec(offloading_config(cfg, page_bytes=page_bytes, **kw)).get_manager()


def chained_keys(block_ids: List[int], group: int = 0) -> List[bytes]:
    """Offload keys of a request made of these content blocks: a chained
    sha256 like vLLM's block hashes (parent hash, then the block's content)."""
    from vllm.v1.kv_offload.base import make_offload_key

    out, parent = [], b"root"
    for b in block_ids:
        parent = hashlib.sha256(parent + int(b).to_bytes(8, "little")).digest()
        out.append(make_offload_key(parent, group))
    return out


def save_random_llama(path: str, seed: int, hidden: int = 128, layers: int = 2,
                      heads: int = 4, kv_heads: int = 2, intermediate: int = 256,
                      vocab: int = 1024) -> str:
    """A Llama with random weights (seeded), saved locally as safetensors:
    real weights make every KV byte matter (vLLM's load_format=dummy yields
    a two-token loop that hides errors). Returns the directory."""
    import os

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if os.path.exists(os.path.join(path, "config.json")):
        return path
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, max_position_embeddings=8192)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    return path

"""`kvtier size` against vLLM's own sizing: for each shipped config
(testdata/models) and a few (tensor-parallel size, block size, KV-cache
dtype) settings, the slot the command reports (--json's block_bytes) is
what vLLM's KV-cache spec gives for that engine, laid out the way the
connector lays a slot out.

vLLM's side is built offline from the local config.json: its own
ModelConfig (the checkpoint directory holds only config.json; tokenizer
skipped) gives the attention layers (get_num_layers_by_block_type), the
K/V heads per worker (get_num_kv_heads, which replicates heads when the
tensor-parallel size exceeds them), the head size (get_head_size: the
latent for MLA), whether the model uses MLA (use_mla) and the cache dtype
(kv_cache_dtype_str_to_dtype); its attention layers' spec
(FullAttentionSpec, or MLAAttentionSpec with one KV head, as
MLAAttention.get_kv_cache_spec builds it) gives one worker's page per
layer (page_size_bytes); kvtier_vllm's SlotGeometry, one block of every
worker, gives the slot (slot_bytes_needed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from conftest import REPO, needs_vllm
from kvtier_vllm.layout import SlotGeometry

pytestmark = needs_vllm

MODELS = ("llama-3.1-8b", "llama-3.1-70b", "deepseek-v2-lite")
# (tp, tokens per block, --kv-cache-dtype); tp 16 is more workers than the
# Llamas' 8 K/V heads: vLLM replicates each on two workers.
SETTINGS = [(1, 16, "auto"), (1, 32, "auto"), (2, 16, "auto"), (2, 32, "auto"),
            (8, 16, "auto"), (8, 32, "auto"), (16, 16, "auto"),
            (1, 16, "fp8"), (8, 32, "fp8_e5m2")]


@pytest.fixture(scope="module")
def kvtier_bin(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("bin") / "kvtier")
    subprocess.run(["go", "build", "-o", out, "./cmd/kvtier"], cwd=REPO, check=True)
    return out


@pytest.fixture(scope="module")
def model_configs(tmp_path_factory):
    """vLLM's ModelConfig of each shipped config, built with no network."""
    from vllm.config import ModelConfig

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        out = {}
        for name in MODELS:
            ckpt = tmp_path_factory.mktemp(name)
            shutil.copy(os.path.join(REPO, "testdata", "models", name + ".json"), ckpt / "config.json")
            out[name] = ModelConfig(model=str(ckpt), tokenizer=str(ckpt), skip_tokenizer_init=True)
        return out


def vllm_slot_bytes(mc, tp: int, block_tokens: int, cache_dtype: str) -> int:
    """One kvtier slot by vLLM's own figures: its spec's page per attention
    layer on one worker, every worker's side by side (SlotGeometry)."""
    from vllm.config import ParallelConfig
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, get_kv_quant_mode

    par = ParallelConfig(tensor_parallel_size=tp)
    mc.verify_with_parallel_config(par)
    common = dict(block_size=block_tokens, head_size=mc.get_head_size(),
                  dtype=kv_cache_dtype_str_to_dtype(cache_dtype, mc),
                  kv_quant_mode=get_kv_quant_mode(cache_dtype))
    if mc.use_mla:
        spec = MLAAttentionSpec(num_kv_heads=1, max_tp_shards=1, cache_dtype_str=cache_dtype, **common)
    else:
        spec = FullAttentionSpec(num_kv_heads=mc.get_num_kv_heads(par), **common)
    layers = mc.get_num_layers_by_block_type(par, "attention")
    geometry = SlotGeometry(world_size=par.world_size, blocks_per_chunk=1,
                            shard_bytes=spec.page_size_bytes * layers)
    return geometry.slot_bytes_needed


def kvtier_size(binary: str, model: str, tp: int, block_tokens: int, cache_dtype: str) -> dict:
    out = subprocess.run(
        [binary, "size", "--model", os.path.join(REPO, "testdata", "models", model + ".json"),
         "--tp", str(tp), "--block-size", str(block_tokens), "--kv-cache-dtype", cache_dtype,
         "--pool-bytes", "64GiB", "--json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)


@pytest.mark.parametrize("model", MODELS)
def test_block_bytes_match_vllms_kv_cache_spec(kvtier_bin, model_configs, model):
    mc = model_configs[model]
    for tp, block_tokens, cache_dtype in SETTINGS:
        got = kvtier_size(kvtier_bin, model, tp, block_tokens, cache_dtype)
        want = vllm_slot_bytes(mc, tp, block_tokens, cache_dtype)
        where = f"{model} tp {tp}, {block_tokens} tokens, {cache_dtype}"
        assert got["block_bytes"] == want, f"{where}: kvtier size says {got['block_bytes']}, vLLM {want}"
        assert got["worker_bytes_per_block"] * tp == want, where
        assert got["attention"] == ("mla" if mc.use_mla else "gqa"), where
        assert got["pool_blocks"] == (64 << 30) // want, where
        assert got["pool_tokens"] == got["pool_blocks"] * block_tokens, where

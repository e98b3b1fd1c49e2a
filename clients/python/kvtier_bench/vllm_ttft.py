"""TTFT of a long shared prefix reloaded from kvtier vs recomputed, on a
real vLLM engine (vLLM's CPU backend) and a local random-weight model sized
so that prefilling the prefix on a CPU takes a second or so."""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from typing import Dict, List

BLOCK_TOKENS = 32


def _prompt(seed: int, n: int) -> List[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 4000) for _ in range(n)]


def bench_ttft(args) -> Dict[str, object]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    from vllm import LLM, SamplingParams

    from .daemon import kvtierd, kvtierd_binary
    from .vllm_harness import save_random_llama

    model = save_random_llama(os.path.join(tempfile.gettempdir(), "kvtier-bench-llama-512x8"),
                              seed=0, hidden=512, layers=8, heads=8, kv_heads=4,
                              intermediate=1536, vocab=4096)
    # one block of this model per worker: 8 layers x K,V x 4 heads x 64 x bf16 x 32 tokens
    block_bytes = 8 * 2 * 4 * 64 * 2 * BLOCK_TOKENS
    n = args.prefix_tokens
    slots = 4 * (args.repeats + 1) * (n // BLOCK_TOKENS + 4)
    with kvtierd(kvtierd_binary(args.repo), block_bytes, slots) as addr:
        llm = LLM(model=model, skip_tokenizer_init=True, block_size=BLOCK_TOKENS,
                  max_model_len=n + 512, dtype="bfloat16", enforce_eager=True, seed=0,
                  enable_prefix_caching=False, max_num_batched_tokens=n + 512,
                  kv_transfer_config={
                      "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                      "kv_connector_extra_config": {
                          "spec_name": "KvtierOffloadingSpec",
                          "spec_module_path": "kvtier_vllm", "kvtier_address": addr}})
        one = SamplingParams(max_tokens=1, temperature=0, detokenize=False)

        def ttft(tokens: List[int]):
            t = time.perf_counter()
            out = llm.generate([{"prompt_token_ids": tokens}], one, use_tqdm=False)[0]
            return time.perf_counter() - t, out.num_cached_tokens or 0

        ttft(_prompt(999, 256))  # warm-up
        recompute, reload, cached = [], [], []
        for i in range(args.repeats):
            prefix = _prompt(i, n)
            s, c = ttft(prefix + _prompt(1000 + i, 16))  # cold: recomputed (and stored)
            assert c == 0, "a fresh prefix cannot be cached"
            recompute.append(s)
            s, c = ttft(prefix + _prompt(2000 + i, 16))  # the same prefix, from kvtier
            reload.append(s)
            cached.append(c)
    rec, rel = statistics.median(recompute), statistics.median(reload)
    return {
        "prefix_tokens": n,
        "repeats": args.repeats,
        "recompute_ttft_s": round(rec, 4),
        "kvtier_ttft_s": round(rel, 4),
        "speedup": round(rec / rel, 2),
        "kvtier_cached_tokens": min(cached),
        "recompute_ttft_all_s": [round(x, 4) for x in recompute],
        "kvtier_ttft_all_s": [round(x, 4) for x in reload],
    }

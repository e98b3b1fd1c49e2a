"""kvtier's SGLang backend against SGLang's own file backend, on this machine.

    python -m kvtier_bench.sglang --json [--kvtierd PATH] [--rounds N]

Starts a kvtierd (the binary given, else ``kvtierd`` on PATH) on a unix://
socket, builds SGLang's MHATokenToKVPoolHost on CPU tensors (page_first,
bf16; --page-mib per page), and measures, in one run:

- ``batch_set_v1`` / ``batch_get_v1`` of 64-page batches through kvtier
  (the v1 path SGLang's controller takes with ``interface_v1``) and the
  same pages through ``HiCacheFile`` (``batch_set`` / ``batch_get`` +
  ``set_from_flat_data_page``: SGLang's generic path, the one it uses for
  the file backend), in GB/s, and kvtier's ratio to the file backend;
- ``batch_exists`` of 256 keys held by kvtier (one leasing round trip),
  p50 / p99 in µs, and of 256 keys it lacks (answered by the residency
  index: no round trip).

HiCacheFile writes to --file-dir (default a temporary directory under
/dev/shm when it exists, so both backends write memory, not a disk).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

from .daemon import kvtierd


def _pool(torch, page_tokens: int, layers: int, heads: int, head_dim: int, pages: int):
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    tokens = 4 * page_tokens
    k = tuple(torch.zeros(tokens, heads, head_dim, dtype=torch.bfloat16) for _ in range(layers))
    v = tuple(torch.zeros(tokens, heads, head_dim, dtype=torch.bfloat16) for _ in range(layers))
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)  # noqa: E731
    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v),
                                           layout=KVBufferLayout.NHD),
                         page_size=page_tokens, head_num=heads, head_dim=head_dim, v_head_dim=head_dim,
                         dtype=torch.bfloat16, device=torch.device("cpu"))
    return MHATokenToKVPoolHost(info, 1.0, 0, page_tokens, "page_first", pin_memory=False,
                                device="cpu", device_capacity_tokens=tokens, start_layer=0,
                                end_layer=layers, host_token_capacity=pages * page_tokens)


def _pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--kvtierd", default=shutil.which("kvtierd") or "kvtierd")
    ap.add_argument("--rounds", type=int, default=5, help="timed batches per figure")
    ap.add_argument("--batch", type=int, default=64, help="pages per batch_*_v1 call")
    ap.add_argument("--exists-keys", type=int, default=256)
    ap.add_argument("--exists-rounds", type=int, default=200)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--page-tokens", type=int, default=32)
    ap.add_argument("--file-dir", default="")
    args = ap.parse_args(argv)

    import torch
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig
    from sglang.srt.mem_cache.utils import get_hash_str

    from kvtier_sglang.backend import KvtierHiCacheStorage, page_bytes

    heads, head_dim = 8, 128
    pages = 2 * args.batch + 8
    pool = _pool(torch, args.page_tokens, args.layers, heads, head_dim, pages)
    pb = page_bytes(pool)
    rng = random.Random(1)
    keys_per_round = []
    for r in range(args.rounds + 1):
        prior, ks = None, []
        for _ in range(args.batch):
            prior = get_hash_str([rng.randrange(32000) for _ in range(args.page_tokens)], prior)
            ks.append(prior)
        keys_per_round.append(ks)
    g = torch.Generator().manual_seed(2)
    pool.kv_buffer.view(torch.int16).copy_(
        torch.randint(-2**15, 2**15 - 1, pool.kv_buffer.shape, dtype=torch.int16, generator=g))
    src = torch.arange(args.batch * args.page_tokens, dtype=torch.int64)
    dst = src + args.batch * args.page_tokens
    batch_gb = args.batch * pb / 1e9

    slots = (args.rounds + 1) * args.batch + args.exists_keys + 16
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    fdir = args.file_dir or tempfile.mkdtemp(prefix="kvtier-sglbench-file-", dir=shm)

    def cfg(extra):
        return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                    attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                                    is_page_first_layout=True, model_name="bench", extra_config=extra)

    out = {"page_bytes": pb, "batch_pages": args.batch, "rounds": args.rounds,
           "layout": "page_first", "dtype": "bfloat16", "file_dir": fdir}
    try:
        with kvtierd(args.kvtierd, pb, slots, transport="unix") as address:
            kv = KvtierHiCacheStorage(cfg({"interface_v1": 1, "kvtier_address": address}), {})
            kv.register_mem_pool_host(pool)
            f = HiCacheFile(cfg({"file_storage_path": fdir}))
            f.register_mem_pool_host(pool)

            def kv_set(ks):
                assert all(kv.batch_set_v1(ks, src))

            def kv_get(ks):
                assert kv.batch_exists(ks) == len(ks)
                assert all(kv.batch_get_v1(ks, dst))

            def file_set(ks):
                data = [pool.get_data_page(i * args.page_tokens) for i in range(len(ks))]
                assert f.batch_set(ks, data)

            def file_get(ks):
                assert f.batch_exists(ks) == len(ks)
                data = f.batch_get(ks, [pool.get_dummy_flat_data_page() for _ in ks])
                for i, d in enumerate(data):
                    pool.set_from_flat_data_page(int(dst[i * args.page_tokens]), d)

            def timed(fn):
                fn(keys_per_round[-1])  # warm-up (first touch of pages and files)
                t = []
                for ks in keys_per_round[:args.rounds]:
                    t0 = time.perf_counter()
                    fn(ks)
                    t.append(time.perf_counter() - t0)
                return batch_gb / _pct(t, 50)

            out["kvtier_set_gbps"] = timed(kv_set)
            out["kvtier_get_gbps"] = timed(kv_get)
            out["file_set_gbps"] = timed(file_set)
            out["file_get_gbps"] = timed(file_get)
            out["set_ratio"] = out["kvtier_set_gbps"] / out["file_set_gbps"]
            out["get_ratio"] = out["kvtier_get_gbps"] / out["file_get_gbps"]
            # Got bytes are the stored bytes (the last get's pages).
            raw = pool.kv_buffer.view(torch.int16)  # NB: bit patterns (random bf16 holds NaNs)
            n = args.batch * args.page_tokens
            assert torch.equal(raw[:, :n], raw[:, n:2 * n]), "a got page differs from its stored bytes"
            raw[:, n:2 * n] = 0
            kv_get(keys_per_round[0])
            assert torch.equal(raw[:, :n], raw[:, n:2 * n]), "kvtier's got page differs from its stored bytes"

            # batch_exists over 256 held keys (tiny pages: only the keys matter).
            small = _pool(torch, 1, 1, 1, 8, 8)
            ex = KvtierHiCacheStorage(cfg({"interface_v1": 1, "kvtier_address": address,
                                           "kvtier_namespace_salt": "exists"}), {})
            ex.register_mem_pool_host(small)
            prior, held = None, []
            for i in range(args.exists_keys):
                prior = get_hash_str([i], prior)
                held.append(prior)
            for at in range(0, len(held), 64):
                ks = held[at:at + 64]
                assert all(ex.batch_set_v1(ks, torch.zeros(len(ks), dtype=torch.int64)))
            hit_us, miss_us = [], []
            missing = [get_hash_str([7, i]) for i in range(args.exists_keys)]
            for _ in range(args.exists_rounds):
                t0 = time.perf_counter()
                n = ex.batch_exists(held)
                hit_us.append((time.perf_counter() - t0) * 1e6)
                assert n == len(held)
                ex.clear()  # the controller's get would release the lease; clear() drops it
                t0 = time.perf_counter()
                assert ex.batch_exists(missing) == 0
                miss_us.append((time.perf_counter() - t0) * 1e6)
            out["exists_keys"] = args.exists_keys
            out["exists_hit_p50_us"] = _pct(hit_us, 50)
            out["exists_hit_p99_us"] = _pct(hit_us, 99)
            out["exists_miss_p50_us"] = _pct(miss_us, 50)
            out["exists_miss_p99_us"] = _pct(miss_us, 99)
            file_us = []
            fx = HiCacheFile(cfg({"file_storage_path": fdir}))
            for _ in range(min(args.exists_rounds, 50)):
                t0 = time.perf_counter()
                fx.batch_exists(keys_per_round[0] * (args.exists_keys // args.batch))
                file_us.append((time.perf_counter() - t0) * 1e6)
            out["file_exists_p50_us"] = _pct(file_us, 50)
            out["file_exists_p99_us"] = _pct(file_us, 99)
            ex.close()
            kv.close()
    finally:
        if not args.file_dir:
            shutil.rmtree(fdir, ignore_errors=True)
    if args.json:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}))
    else:
        for k, v in out.items():
            print(f"{k:22} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

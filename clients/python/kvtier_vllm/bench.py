"""Benchmarks of kvtier as vLLM's offloading tier, each against its
baseline measured in the same run.

``python -m kvtier_vllm.bench manager --trace TRACE --json``
    Replays a prefix trace through the manager API the way vLLM's scheduler
    calls it (per-key prefix scan, prepare/complete load and store, touch,
    request finished, ``on_schedule_end`` once per step) against vLLM's
    native CPUOffloadingManager and kvtier's manager (its own kvtierd) at
    the same capacity in blocks; reports hit rates and per-step latency.

``python -m kvtier_vllm.bench ttft --json``
    Time to first token of a shared prefix reloaded from kvtier vs
    recomputed, on a local random-weight model (vLLM's CPU backend).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Dict, Iterator, List

# -- a kvtierd of the bench's own ---------------------------------------------


def kvtierd_binary(repo: str) -> str:
    found = shutil.which("kvtierd")
    if found:
        return found
    out = os.path.join(tempfile.mkdtemp(prefix="kvtier-bench-"), "kvtierd")
    subprocess.run(["go", "build", "-o", out, "./cmd/kvtierd"], cwd=repo, check=True)
    return out


@contextmanager
def kvtierd(binary: str, block_bytes: int, slots: int, *extra: str, transport: str = "ipc") -> Iterator[str]:
    """Starts a kvtierd on an ipc (ZeroMQ) or unix (stream) engine socket;
    yields its engine address; stops it."""
    d = tempfile.mkdtemp(prefix="kvtier-bench-")
    sock = os.path.join(d, "engine.sock")
    pool = f"/dev/shm/kvtier-bench-{os.getpid()}.pool"
    proc = subprocess.Popen(
        [binary, "--engine-listen", f"{transport}://{sock}", "--pool-path", pool,
         "--pool-bytes", str(block_bytes * slots), "--block-bytes", str(block_bytes),
         "--metrics-listen", "127.0.0.1:0", "--log-format", "json", *extra],
        stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if json.loads(line).get("message") == "kvtierd listening":
                break
        else:
            raise RuntimeError("kvtierd exited before listening")
        import threading

        threading.Thread(target=proc.stderr.read, daemon=True).start()
        yield f"{transport}://{sock}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(d, ignore_errors=True)


# -- the scheduler model --------------------------------------------------------


def read_trace(path: str, limit: int) -> List[List[int]]:
    out = []
    with open(path) as f:
        for line in f:
            out.append(json.loads(line)["hash_ids"])
            if limit and len(out) >= limit:
                break
    return out


class Replay:
    """One manager driven through a trace as vLLM's scheduler drives it:
    each step admits up to ``per_step`` requests; a request scans its keys
    (stopping at the first MISS), loads its HIT prefix, stores the rest;
    the workers' completions and the request's end come the next step.
    A request whose scan was deferred (RETRY / HIT_PENDING) is scanned
    again the next step. Wall time of every step's manager calls is kept."""

    def __init__(self, manager, trace: List[List[int]], per_step: int):
        from .harness import chained_keys

        self.m, self.per_step = manager, per_step
        self.todo = [(f"r{i}", chained_keys(ids)) for i, ids in enumerate(trace)]
        self.chained = chained_keys
        self.step_ns: List[int] = []
        self.looked = self.hit = self.deferred = self.store_full = 0

    def run(self) -> None:
        from vllm.v1.kv_offload.base import LookupResult, ReqContext

        m = self.m
        pending = list(reversed(self.todo))
        waiting: List[tuple] = []  # deferred scans
        completions: List[tuple] = []
        while pending or waiting or completions:
            t0 = time.perf_counter_ns()
            for kind, ctx, keys in completions:
                if kind == "load":
                    m.complete_load(keys, ctx)
                elif kind == "store":
                    m.complete_store(keys, ctx, True)
                else:
                    m.on_request_finished(ctx)
            completions = []
            batch, waiting = waiting, []
            while pending and len(batch) < self.per_step:
                rid, keys = pending.pop()
                ctx = ReqContext(req_id=rid)
                for i, k in enumerate(keys):
                    ctx.set_offload_key_position(k, (i + 1) * 512)
                m.on_new_request(ctx)
                batch.append((ctx, keys))
            for ctx, keys in batch:
                hits, deferred = 0, False
                for k in keys:
                    r = m.lookup(k, ctx)
                    if r is LookupResult.HIT:
                        hits += 1
                    elif r is LookupResult.MISS:
                        break
                    else:
                        deferred = True
                if deferred:
                    self.deferred += 1
                    waiting.append((ctx, keys))
                    continue
                self.looked += len(keys)
                self.hit += hits
                if hits:
                    m.prepare_load(keys[:hits], ctx)
                    m.touch(keys[:hits], ctx)
                    completions.append(("load", ctx, keys[:hits]))
                if hits < len(keys):
                    out = m.prepare_store(keys[hits:], ctx)
                    if out is None:
                        self.store_full += 1
                    elif out.keys_to_store:
                        completions.append(("store", ctx, out.keys_to_store))
                completions.append(("finish", ctx, None))
            m.on_schedule_end(None)
            self.step_ns.append(time.perf_counter_ns() - t0)

    def summary(self) -> Dict[str, float]:
        us = sorted(ns / 1000 for ns in self.step_ns)
        return {
            "hit_rate": self.hit / self.looked if self.looked else 0.0,
            "steps": len(us),
            "step_p50_us": statistics.median(us),
            "step_p99_us": us[min(len(us) - 1, int(len(us) * 0.99))],
            "deferred_scans": self.deferred,
            "store_full": self.store_full,
        }


def bench_manager(args) -> Dict[str, object]:
    from .harness import kvtier_manager, native_manager

    trace = read_trace(args.trace, args.limit)
    page = 4096  # bytes per block: the manager path never touches them
    native = Replay(native_manager(args.cpu_blocks, page_bytes=page), trace, args.per_step)
    native.run()
    binary = kvtierd_binary(args.repo)
    with kvtierd(binary, page, args.cpu_blocks, transport=args.transport) as addr:
        mgr = kvtier_manager(addr, page_bytes=page)
        kv = Replay(mgr, trace, args.per_step)
        kv.run()
        round_trips = mgr.round_trips
        mgr.shutdown()
    n, k = native.summary(), kv.summary()
    return {
        "requests": len(trace),
        "cpu_blocks": args.cpu_blocks,
        "per_step": args.per_step,
        "native_hit_rate": round(n["hit_rate"], 4),
        "kvtier_hit_rate": round(k["hit_rate"], 4),
        "native_step_p50_us": round(n["step_p50_us"], 1),
        "native_step_p99_us": round(n["step_p99_us"], 1),
        "kvtier_step_p50_us": round(k["step_p50_us"], 1),
        "kvtier_step_p99_us": round(k["step_p99_us"], 1),
        "step_ratio": round(k["step_p50_us"] / n["step_p50_us"], 2),
        "kvtier_round_trips_per_request": round(round_trips / len(trace), 2),
        "kvtier_deferred_scans": k["deferred_scans"],
        "native_store_full": n["store_full"],
        "kvtier_store_full": k["store_full"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvtier_vllm.bench")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manager", help="scheduler side: kvtier vs vLLM's native manager")
    m.add_argument("--trace", default="../shared/traces/conversation_trace.jsonl")
    m.add_argument("--limit", type=int, default=0, help="first N requests (0: all)")
    m.add_argument("--cpu-blocks", type=int, default=20000)
    m.add_argument("--per-step", type=int, default=16, help="requests admitted per step")
    m.add_argument("--repo", default=".", help="where to build kvtierd if not on PATH")
    m.add_argument("--transport", choices=("ipc", "unix"), default="ipc", help="kvtierd's engine socket")
    m.add_argument("--json", action="store_true")
    t = sub.add_parser("ttft", help="engine side: TTFT reloaded from kvtier vs recomputed")
    t.add_argument("--prefix-tokens", type=int, default=2048)
    t.add_argument("--repeats", type=int, default=3)
    t.add_argument("--repo", default=".")
    t.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "manager":
        out = bench_manager(args)
    else:
        from .bench_ttft import bench_ttft

        out = bench_ttft(args)
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:34} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

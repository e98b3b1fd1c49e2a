"""What N engines on one kvtierd cost (issue 43, item 3):
``python -m kvtier_bench.vllm engines --engines 1 2 4 8 --json``.

For each N, one kvtierd and N engine processes, each replaying its share of
the conversation trace (routed by session, as a prefix-affinity router
sends a conversation's turns to one engine) through vLLM's real offloading
manager code and ``kvtier_vllm``, in vLLM's call order (``Replay``), as fast
as it can step (no model time), interleaved step by step with vLLM's own
native ``CPUOffloadingManager`` of its share of the capacity in the same
process, so each engine's step is compared with its own native step on the
same machine at the same moment. Reported per N:

- engine steps per second, all engines together (kvtier's replays);
- each engine's kvtier step p50 / p99 over its native one (the median, and
  the worst, over engines);
- kvtierd's CPU seconds (``/proc``) per 1,000 engine calls, the calls as
  kvtierd counted them (each session's ``calls`` in the stats reply);
- the daemon's peak unserved calls: the most calls in flight at kvtierd
  over every engine session, sampled every 100 ms (each sample is a stats
  call kvtierd serves: its CPU counts in kvtierd's, not in the calls);
- kvtierd's work per call (its CPU tier's lookups, stores and evictions,
  keys in all) and its threads' context switches per call (``/proc``): if
  the work per call is flat in N and the CPU per call is not, the extra is
  the machine's (caches, scheduling), not the daemon's algorithms.

With ``--rounds R`` every N runs R times, interleaved (1, 8, 1, 8, ...), and
``summary`` gives each N's medians and range: one run's CPU per call moves
by a third from run to run on a shared 2-core box.

N above this machine's cores oversubscribes it (the engines and kvtierd
share them); ``oversubscribed`` says so."""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Dict, List

from kvtier_client import Client

from .daemon import cpu_seconds, kvtierd_binary, kvtierd_process

PAGE = 4096  # bytes per block: the manager path never touches them


def engine_part(args) -> Dict[str, object]:
    """One engine process: its share of the trace through native and kvtier,
    interleaved; what it measured, and its calls as kvtierd counted them."""
    from .vllm import Replay, read_trace, route
    from .vllm_harness import kvtier_manager, native_manager

    part = route(read_trace(args.trace, args.limit), args.of, "by_session")[args.part]
    order = dict(per_step=args.per_step, preempt_every=args.preempt_every, abort_every=args.abort_every,
                 model_ms=0.0)
    native = Replay(native_manager(max(1, args.cpu_blocks // args.of), page_bytes=PAGE), part, **order)
    mgr = kvtier_manager(args.address, page_bytes=PAGE)
    kv = Replay(mgr, part, **order)
    gc.collect()
    gc.freeze()
    t0 = time.monotonic()
    both = [native.steps_one_by_one(), kv.steps_one_by_one()]
    while both:
        for it in list(both):
            if next(it, None) is None:
                both.remove(it)
    wall = time.monotonic() - t0
    client = mgr._link.client
    me = client.hello.session if client is not None else 0
    engines = client.stats().get("engines", []) if client is not None else []
    calls = next((e["calls"] for e in engines if e["id"] == me), 0)
    mgr.shutdown()
    n, k = native.summary(), kv.summary()
    return {"part": args.part, "requests": len(part), "wall_s": wall, "calls": calls,
            "steps": k["steps"], "native_hit_rate": n["hit_rate"], "kvtier_hit_rate": k["hit_rate"],
            "native_step_p50_us": n["step_p50_us"], "native_step_p99_us": n["step_p99_us"],
            "kvtier_step_p50_us": k["step_p50_us"], "kvtier_step_p99_us": k["step_p99_us"]}


class _InFlight:
    """Samples the calls in flight at kvtierd over every engine session
    (its own left out) until stopped; keeps the peak."""

    def __init__(self, address: str):
        self.client = Client(address, name="bench-sampler")
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me = self.client.hello.session
        while not self._stop.wait(0.1):  # NB: each sample is a stats call kvtierd serves
            engines = self.client.stats().get("engines", [])
            self.peak = max(self.peak, sum(e.get("in_flight", 0) for e in engines if e["id"] != me))
            self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.client.close()


def context_switches(pid: int) -> int:
    """Voluntary and involuntary context switches of every thread of a
    process so far (Linux /proc)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except FileNotFoundError:  # the thread ended
            pass
    return total


def key_work(stats: Dict[str, object]) -> int:
    """The CPU tier's key operations so far: lookups, stores, evictions."""
    return sum(int(stats.get(k, 0)) for k in ("lookups", "stores", "evictions"))


def run_n(binary: str, n: int, args) -> Dict[str, object]:
    """N engine processes on one kvtierd."""
    with kvtierd_process(binary, PAGE, args.cpu_blocks, transport=args.transport) as (addr, proc):
        probe = Client(addr, name="bench-work")  # NB: the sampler's client is its thread's alone
        work0, switches0 = key_work(probe.stats()), context_switches(proc.pid)
        sampler = _InFlight(addr)
        cpu0 = cpu_seconds(proc.pid)
        t0 = time.monotonic()
        children = [subprocess.Popen(
            [sys.executable, "-m", "kvtier_bench.vllm", "engine-part", "--address", addr,
             "--part", str(i), "--of", str(n), "--trace", args.trace, "--limit", str(args.limit),
             "--cpu-blocks", str(args.cpu_blocks), "--per-step", str(args.per_step),
             "--preempt-every", str(args.preempt_every), "--abort-every", str(args.abort_every)],
            stdout=subprocess.PIPE, text=True) for i in range(n)]
        parts = []
        for c in children:
            out, _ = c.communicate()
            if c.returncode != 0:
                raise RuntimeError(f"engine part exited {c.returncode}")
            parts.append(json.loads(out.strip().splitlines()[-1]))
        wall = time.monotonic() - t0
        cpu = cpu_seconds(proc.pid) - cpu0
        switches = context_switches(proc.pid) - switches0
        sampler.stop()
        work = key_work(probe.stats()) - work0
        probe.close()
    calls = sum(p["calls"] for p in parts)
    ratios = [p["kvtier_step_p50_us"] / p["native_step_p50_us"] for p in parts]
    ratios99 = [p["kvtier_step_p99_us"] / p["native_step_p99_us"] for p in parts]
    return {
        "engines": n,
        "oversubscribed": n + 1 > (os.cpu_count() or 1),
        "requests": sum(p["requests"] for p in parts),
        "wall_s": round(wall, 2),
        "steps_per_s": round(sum(p["steps"] for p in parts) / max(p["wall_s"] for p in parts), 1),
        "step_ratio_median": round(statistics.median(ratios), 2),
        "step_ratio_max": round(max(ratios), 2),
        "step_ratio_p99_median": round(statistics.median(ratios99), 2),
        "kvtier_hit_rate_mean": round(statistics.mean(p["kvtier_hit_rate"] for p in parts), 4),
        "native_hit_rate_mean": round(statistics.mean(p["native_hit_rate"] for p in parts), 4),
        "kvtierd_cpu_s": round(cpu, 2),
        "engine_calls": calls,
        "kvtierd_cpu_ms_per_1000_calls": round(1e6 * cpu / max(1, calls), 1),
        "kvtierd_keys_per_call": round(work / max(1, calls), 2),
        "kvtierd_switches_per_call": round(switches / max(1, calls), 2),
        "peak_calls_in_flight": sampler.peak,
        "in_flight_samples": sampler.samples,
        "parts": parts,
    }


SUMMED = ("kvtierd_cpu_ms_per_1000_calls", "kvtierd_keys_per_call", "kvtierd_switches_per_call",
          "steps_per_s", "step_ratio_median", "kvtier_hit_rate_mean", "native_hit_rate_mean")


def summarize(rows, engines) -> List[Dict[str, object]]:
    """Each N's median of every figure in SUMMED over its rounds, with the
    range of its CPU per call, and that median over the first N's."""
    out = []
    for n in engines:
        mine = [r for r in rows if r["engines"] == n]
        s: Dict[str, object] = {"engines": n, "rounds": len(mine)}
        for k in SUMMED:
            s[k] = round(statistics.median(r[k] for r in mine), 4)
        cpu = [r["kvtierd_cpu_ms_per_1000_calls"] for r in mine]
        s["kvtierd_cpu_ms_per_1000_calls_range"] = [min(cpu), max(cpu)]
        out.append(s)
    base = out[0]["kvtierd_cpu_ms_per_1000_calls"] or 1
    for s in out:
        s["cpu_per_call_vs_first"] = round(s["kvtierd_cpu_ms_per_1000_calls"] / base, 2)
    return out


def bench_engines(args) -> Dict[str, object]:
    binary = kvtierd_binary(args.repo)
    rows = []
    for round_ in range(max(1, args.rounds)):
        mine = [dict(run_n(binary, n, args), round=round_) for n in args.engines]
        base = mine[0]["kvtierd_cpu_ms_per_1000_calls"] or 1
        for r in mine:
            r["cpu_per_call_vs_first"] = round(r["kvtierd_cpu_ms_per_1000_calls"] / base, 2)
        rows += mine
    return {"transport": args.transport, "cpu_blocks": args.cpu_blocks, "cores": os.cpu_count(), "rows": rows,
            "summary": summarize(rows, args.engines)}

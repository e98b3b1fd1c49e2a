"""kvtierd's CPU per engine call when calls come one at a time:
``python -m kvtier_bench.callfloor --kvtierd OLD --kvtierd NEW --transport unix --json``.

The engines bench (``kvtier_bench.vllm engines``) measures kvtierd's CPU
per call under vLLM's real call pattern, where a step's calls travel
together and the daemon wakes once for many. This measures the other end:
a client that waits for each answer before it sends the next call, so every
call pays the whole path — the socket's read and write, the wake-ups of the
goroutines and actors it crosses — with as little tier work as a call can
have:

- ``ping``: answered by the engine endpoint, no actor behind it;
- ``has_pending_work``: the endpoint and the bridge;
- ``lookup_1``, ``lookup_16``: a lookup of 1 and of 16 keys the node lacks
  (the endpoint, the bridge and the CPU tier).

Each figure is kvtierd's CPU per call, in µs, over ``--calls``
calls after 500 unmeasured ones: the time its threads ran (each thread's
``/proc/PID/task/TID/schedstat``, in ns; ``/proc/PID/stat``'s 10 ms ticks
where the kernel keeps no schedstat). Every kvtierd named runs ``--rounds``
times, interleaved, and each figure is the median over rounds; ``ratio``
divides each binary's figures by the first's, measured in the same run."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Callable, Dict, List

from kvtier_client import Client
from kvtier_client.client import Request

from .daemon import cpu_seconds, kvtierd_process

WARM_UP = 500


def cpu_ns(pid: int) -> float:
    """The CPU time every thread of pid has run so far, in ns."""
    if not os.path.exists(f"/proc/{pid}/schedstat"):  # a kernel without schedstat: ticks
        return cpu_seconds(pid) * 1e9
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:  # the thread ended
            pass
    return float(total)


def _cases(c: Client) -> Dict[str, Callable[[], object]]:
    req = Request(id="callfloor")
    keys = [("callfloor", bytes([i]) * 32, 0) for i in range(16)]
    return {
        "ping": c.ping,
        "has_pending_work": c.has_pending_work,
        "lookup_1": lambda: c.lookup(req, keys[:1]),
        "lookup_16": lambda: c.lookup(req, keys, prefix=False),
    }


def measure(binary: str, transport: str, calls: int) -> Dict[str, float]:
    """µs of kvtierd CPU per call, for each case, on a fresh kvtierd."""
    out: Dict[str, float] = {}
    with kvtierd_process(binary, 4096, 20000, transport=transport) as (addr, proc):
        c = Client(addr, name="callfloor")
        try:
            for name, call in _cases(c).items():
                for _ in range(WARM_UP):
                    call()
                cpu0 = cpu_ns(proc.pid)
                for _ in range(calls):
                    call()
                out[name] = (cpu_ns(proc.pid) - cpu0) / calls / 1e3
        finally:
            c.close()
    return out


def bench(binaries: List[str], transport: str, calls: int, rounds: int) -> Dict[str, object]:
    runs: Dict[str, List[Dict[str, float]]] = {b: [] for b in binaries}
    for _ in range(rounds):
        for b in binaries:
            runs[b].append(measure(b, transport, calls))
    medians = {b: {k: round(statistics.median(r[k] for r in rs), 2) for k in rs[0]} for b, rs in runs.items()}
    first = medians[binaries[0]]
    return {
        "transport": transport,
        "calls": calls,
        "rounds": rounds,
        "us_per_call": medians,
        # NB: None where the baseline measured no CPU (ticks, and too few calls to reach one)
        "ratio": {b: {k: round(v / first[k], 2) if first[k] else None for k, v in m.items()} for b, m in medians.items()},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvtier_bench.callfloor")
    ap.add_argument("--kvtierd", action="append", required=True,
                    help="a kvtierd binary; name it again for each build to compare (the first is the baseline)")
    ap.add_argument("--transport", choices=("ipc", "unix"), default="unix")
    ap.add_argument("--calls", type=int, default=20000, help="measured calls per case")
    ap.add_argument("--rounds", type=int, default=3, help="runs of every binary, interleaved")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = bench(args.kvtierd, args.transport, args.calls, args.rounds)
    if args.json:
        print(json.dumps(out))
    else:
        for b, m in out["us_per_call"].items():
            print(b, " ".join(f"{k} {v} µs ({out['ratio'][b][k]}×)" for k, v in m.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

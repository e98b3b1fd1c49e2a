"""The engine round trip from Python, next to its floors (issue: engine RTT).

    python -m kvtier_client.bench --kvtierd PATH [--json]

starts a kvtierd on an ipc socket (a fresh pool in a temporary directory),
stores 2,000 blocks through the client, then measures Lookups of 16, 64,
256 and 2,000 of them (all HIT) through the client, and in the same run
the floors under them: a 256-byte echo through a pyzmq DEALER and ROUTER
over ipc (both in this process, the ROUTER on a thread), and through a
Unix socket pair. Prints one line per figure, or one JSON object with
``lookup_N_p50_us`` / ``lookup_N_p99_us``, ``floor_pyzmq_ipc_rtt_us`` and
``floor_unix_rtt_us`` (p50s, with ``_p99_us`` twins).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List

import zmq

from kvtier_client import HIT, Client, Request

BLOCK = 4096
SIZES = (16, 64, 256, 2000)
PAYLOAD = 256


def percentile_us(samples: List[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(p * len(s)))] * 1e6


def timed(n: int, call: Callable[[], None]) -> List[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        out.append(time.perf_counter() - t)
    return out


def start_daemon(kvtierd: str, tmp: str, transport: str = "ipc") -> tuple:
    addr = f"{transport}://{tmp}/engine.sock"
    proc = subprocess.Popen(
        [kvtierd, "--engine-listen", addr, "--pool-path", f"{tmp}/pool", "--pool-bytes", str(4096 * BLOCK),
         "--block-bytes", str(BLOCK), "--metrics-listen", "127.0.0.1:0", "--log-format", "json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # the daemon says when it listens
        if "kvtierd listening" in line:
            break
    else:
        raise RuntimeError("kvtierd exited before listening")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, addr


def lookups(c: Client, rounds: int) -> Dict[str, float]:
    keys = [("ns", i.to_bytes(8, "big"), 0) for i in range(max(SIZES))]
    for lo in range(0, len(keys), 256):
        req = Request(f"fill-{lo}")
        plan = c.prepare_store(req, keys[lo:lo + 256])
        c.job_done(plan.job, 0, True)
        c.request_finished(req)
    out = {}
    for n in SIZES:
        ks = keys[:n]
        req = Request(f"probe-{n}")
        assert c.lookup(req, ks)[-1] == HIT, "the stored keys hit"
        samples = timed(rounds, lambda: c.lookup(req, ks))
        c.request_finished(req)
        out[f"lookup_{n}_p50_us"] = percentile_us(samples, 0.50)
        out[f"lookup_{n}_p99_us"] = percentile_us(samples, 0.99)
    return out


def pyzmq_floor(tmp: str, n: int) -> tuple:
    ctx = zmq.Context.instance()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    for s in (router, dealer):
        s.setsockopt(zmq.LINGER, 0)
    router.bind(f"ipc://{tmp}/floor.sock")
    dealer.connect(f"ipc://{tmp}/floor.sock")

    def echo():
        for _ in range(n):
            router.send_multipart(router.recv_multipart())

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    msg = bytes(PAYLOAD)

    def once():
        dealer.send(msg)
        dealer.recv()

    samples = timed(n, once)
    t.join()
    router.close()
    dealer.close()
    return percentile_us(samples, 0.5), percentile_us(samples, 0.99)


def unix_floor(n: int) -> tuple:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def echo():
        for _ in range(n):
            data = b""
            while len(data) < PAYLOAD:
                data += b.recv(PAYLOAD - len(data))
            b.sendall(data)

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    msg = bytes(PAYLOAD)

    def once():
        a.sendall(msg)
        got = 0
        while got < PAYLOAD:
            got += len(a.recv(PAYLOAD - got))

    samples = timed(n, once)
    t.join()
    a.close()
    b.close()
    return percentile_us(samples, 0.5), percentile_us(samples, 0.99)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvtier_client.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvtierd", required=True, help="the kvtierd binary (go build -o kvtierd ./cmd/kvtierd)")
    ap.add_argument("--rounds", type=int, default=500, help="Lookups measured per size")
    ap.add_argument("--transport", choices=("ipc", "unix"), default="ipc",
                    help="the engine endpoint's transport: ZeroMQ over ipc, or length-prefixed frames on a Unix socket")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvtier-pybench-") as tmp:
        proc, addr = start_daemon(args.kvtierd, tmp, args.transport)
        try:
            with Client(addr, name="kvtier_client.bench", heartbeat=False) as c:
                res = lookups(c, args.rounds)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        res["floor_pyzmq_ipc_rtt_us"], res["floor_pyzmq_ipc_rtt_p99_us"] = pyzmq_floor(tmp, 4 * args.rounds)
    res["floor_unix_rtt_us"], res["floor_unix_rtt_p99_us"] = unix_floor(4 * args.rounds)
    res["lookup_16_over_pyzmq_floor"] = res["lookup_16_p50_us"] / res["floor_pyzmq_ipc_rtt_us"]
    res["transport"] = args.transport
    if args.json:
        print(json.dumps(res))
        return 0
    for n in SIZES:
        print(f"lookup of {n} keys through the Python client ({args.transport}): p50 {res[f'lookup_{n}_p50_us']:.1f} µs, "
              f"p99 {res[f'lookup_{n}_p99_us']:.1f} µs")
    print(f"floors, a {PAYLOAD}-byte echo: pyzmq DEALER/ROUTER over ipc p50 {res['floor_pyzmq_ipc_rtt_us']:.1f} µs "
          f"(p99 {res['floor_pyzmq_ipc_rtt_p99_us']:.1f}), Unix socket p50 {res['floor_unix_rtt_us']:.1f} µs "
          f"(p99 {res['floor_unix_rtt_p99_us']:.1f}); 16-key lookup = {res['lookup_16_over_pyzmq_floor']:.2f}× the pyzmq floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The engine round trip from Python, next to its floors (issue: engine RTT).

    python -m kvtier_client.bench --kvtierd PATH [--transport unix|ipc] [--json]

starts a kvtierd (a fresh pool in a temporary directory), stores 2,000
blocks through the client, then measures Lookups of 16, 64, 256 and 2,000
of them (all HIT) through the client and, interleaved with them round by
round (the box's drift then weighs on both alike), the floors under them:
a 256-byte echo through a pyzmq DEALER over ipc and through a Unix stream
socket, each served by an echo process of its own (two processes, as the
client and the daemon are; no GIL shared between the ends). Prints one
line per figure, or one JSON object with ``lookup_N_p50_us`` /
``lookup_N_p99_us``, ``floor_pyzmq_ipc_rtt_us`` and ``floor_unix_rtt_us``
(p50s, with ``_p99_us`` twins), and ``lookup_16_over_floor``: the median of
the rounds' lookup-16 p50 over the same round's floor p50 on the transport
used, with ``lookup_16_over_floor_spread`` (half the interquartile range).
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

# The echo servers, each run as `python -c ECHO_* PATH` in its own process.
ECHO_UNIX = """
import os, socket, sys
path = sys.argv[1]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path + ".tmp"); os.rename(path + ".tmp", path); srv.listen(1)
c, _ = srv.accept()
while True:
    b = c.recv(1 << 16)
    if not b:
        break
    c.sendall(b)
"""
ECHO_ZMQ = """
import sys, zmq
r = zmq.Context.instance().socket(zmq.ROUTER)
r.setsockopt(zmq.LINGER, 0)
r.bind("ipc://" + sys.argv[1])
print("ready", flush=True)
while True:
    m = r.recv_multipart()
    if m[1] == b"bye":
        break
    r.send_multipart(m)
"""


def percentile_us(samples: List[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(p * len(s)))] * 1e6


def quartiles(xs: List[float]) -> tuple:
    s = sorted(xs)
    at = lambda q: s[round((len(s) - 1) * q)]  # noqa: E731
    return at(0.25), at(0.5), at(0.75)


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


class UnixEcho:
    """A Unix stream echo in its own process; once() is one round trip."""

    def __init__(self, tmp: str):
        path = f"{tmp}/echo-unix.sock"
        self.proc = subprocess.Popen([sys.executable, "-c", ECHO_UNIX, path])
        deadline = time.monotonic() + 30
        while not os.path.exists(path):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("unix echo did not start")
            time.sleep(0.01)
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.msg = bytes(PAYLOAD)

    def once(self) -> None:
        self.s.sendall(self.msg)
        got = 0
        while got < PAYLOAD:
            got += len(self.s.recv(PAYLOAD - got))

    def close(self) -> None:
        self.s.close()
        self.proc.wait(timeout=30)


class ZmqEcho:
    """A pyzmq ROUTER echo over ipc in its own process; a DEALER here."""

    def __init__(self, tmp: str):
        path = f"{tmp}/echo-zmq.sock"
        self.proc = subprocess.Popen([sys.executable, "-c", ECHO_ZMQ, path], stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("zmq echo did not start")
        self.d = zmq.Context.instance().socket(zmq.DEALER)
        self.d.setsockopt(zmq.LINGER, 0)
        self.d.connect(f"ipc://{path}")
        self.msg = bytes(PAYLOAD)

    def once(self) -> None:
        self.d.send(self.msg)
        self.d.recv()

    def close(self) -> None:
        self.d.send(b"bye")
        self.proc.wait(timeout=30)
        self.d.close()


def fill(c: Client) -> list:
    keys = [("ns", i.to_bytes(8, "big"), 0) for i in range(max(SIZES))]
    for lo in range(0, len(keys), 256):
        req = Request(f"fill-{lo}")
        plan = c.prepare_store(req, keys[lo:lo + 256])
        c.job_done(plan.job, 0, True)
        c.request_finished(req)
    return keys


def measure(c: Client, floors: Dict[str, Callable[[], None]], transport: str, rounds: int, per_round: int) -> dict:
    keys = fill(c)
    reqs = {n: Request(f"probe-{n}") for n in SIZES}
    for n in SIZES:
        assert c.lookup(reqs[n], keys[:n])[-1] == HIT, "the stored keys hit"
    samples: Dict[str, List[float]] = {name: [] for name in [f"lookup_{n}" for n in SIZES] + list(floors)}
    ratios = []
    floor_name = "floor_unix_rtt" if transport == "unix" else "floor_pyzmq_ipc_rtt"
    for r in range(rounds):
        got = {}
        # NB: the floors and the lookups alternate which goes first.
        order = [*floors.items()]
        lookups = [(f"lookup_{n}", (lambda ks, q: lambda: c.lookup(q, ks))(keys[:n], reqs[n])) for n in SIZES]
        for name, call in (order + lookups if r % 2 == 0 else lookups + order):
            got[name] = timed(per_round, call)
            samples[name] += got[name]
        ratios.append(percentile_us(got["lookup_16"], 0.5) / percentile_us(got[floor_name], 0.5))
    for n in SIZES:
        c.request_finished(reqs[n])
    out = {}
    for name, xs in samples.items():
        out[f"{name}_us" if name.startswith("floor") else f"{name}_p50_us"] = percentile_us(xs, 0.50)
        out[f"{name}_p99_us"] = percentile_us(xs, 0.99)
    lo, mid, hi = quartiles(ratios)
    out["lookup_16_over_floor"], out["lookup_16_over_floor_spread"] = mid, (hi - lo) / 2
    out["floor"], out["rounds"] = floor_name, rounds
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvtier_client.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvtierd", required=True, help="the kvtierd binary (go build -o kvtierd ./cmd/kvtierd)")
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds of floors and lookups")
    ap.add_argument("--per-round", type=int, default=200, help="calls per figure per round")
    ap.add_argument("--transport", choices=("ipc", "unix"), default="unix",
                    help="the engine endpoint's transport: length-prefixed frames on a Unix socket, or ZeroMQ over ipc")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvtier-pybench-") as tmp:
        proc, addr = start_daemon(args.kvtierd, tmp, args.transport)
        unix, zmq_echo = UnixEcho(tmp), ZmqEcho(tmp)
        try:
            with Client(addr, name="kvtier_client.bench", heartbeat=False) as c:
                res = measure(c, {"floor_unix_rtt": unix.once, "floor_pyzmq_ipc_rtt": zmq_echo.once},
                              args.transport, args.rounds, args.per_round)
        finally:
            unix.close()
            zmq_echo.close()
            proc.terminate()
            proc.wait(timeout=30)
    res["transport"] = args.transport
    if args.json:
        print(json.dumps(res))
        return 0
    for n in SIZES:
        print(f"lookup of {n} keys through the Python client ({args.transport}): p50 {res[f'lookup_{n}_p50_us']:.1f} µs, "
              f"p99 {res[f'lookup_{n}_p99_us']:.1f} µs")
    print(f"floors, a {PAYLOAD}-byte echo from another process: pyzmq DEALER/ROUTER over ipc p50 "
          f"{res['floor_pyzmq_ipc_rtt_us']:.1f} µs (p99 {res['floor_pyzmq_ipc_rtt_p99_us']:.1f}), Unix socket p50 "
          f"{res['floor_unix_rtt_us']:.1f} µs (p99 {res['floor_unix_rtt_p99_us']:.1f})")
    print(f"16-key lookup = {res['lookup_16_over_floor']:.2f}× ± {res['lookup_16_over_floor_spread']:.2f} "
          f"the {res['floor']} floor (median of {args.rounds} interleaved rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

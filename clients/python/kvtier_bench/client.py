"""The engine round trip from Python, next to its floors (issue: engine RTT).

    python -m kvtier_bench.client --kvtierd PATH [--transport unix|ipc] [--json]

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

Over unix the headline figures are a daemon polling its connection between
calls (``--engine-poll``, ``--daemon-poll-us``) and a client polling for its
reply (``poll_us``); the same run also measures the client polling alone
against a daemon on its defaults (``lookup_N_client_poll_*``) and neither
polling (``lookup_N_no_poll_*``, the baseline), and reports
``poll_speedup_16``: the baseline's 16-key p50 over the headline's.
"""

from __future__ import annotations

import argparse
import contextlib
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
from kvtier_client.client import DEFAULT_POLL_US

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


def start_daemon(kvtierd: str, tmp: str, transport: str = "ipc", name: str = "engine", poll_us: int = 0) -> tuple:
    addr = f"{transport}://{tmp}/{name}.sock"
    proc = subprocess.Popen(
        [kvtierd, "--engine-listen", addr, "--pool-path", f"{tmp}/{name}.pool", "--pool-bytes", str(4096 * BLOCK),
         "--block-bytes", str(BLOCK), "--metrics-listen", "127.0.0.1:0", "--log-format", "json",
         "--engine-poll", f"{poll_us}us"],
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


def measure(clients: Dict[str, Client], floors: Dict[str, Callable[[], None]], transport: str, rounds: int,
            per_round: int) -> dict:
    """Lookups through each client (by figure suffix: "" is the headline
    configuration) and the floors, interleaved round by round."""
    keys = []
    filled = set()
    for c in clients.values():
        if c.hello.pool_path not in filled:  # one fill per daemon
            keys = fill(c)
            filled.add(c.hello.pool_path)
    reqs = {(sfx, n): Request(f"probe{sfx}-{n}") for sfx in clients for n in SIZES}
    for (sfx, n), q in reqs.items():
        assert clients[sfx].lookup(q, keys[:n])[-1] == HIT, "the stored keys hit"
    lookups = [(f"lookup_{n}{sfx}", (lambda c, ks, q: lambda: c.lookup(q, ks))(c, keys[:n], reqs[(sfx, n)]))
               for sfx, c in clients.items() for n in SIZES]
    samples: Dict[str, List[float]] = {name: [] for name in [n for n, _ in lookups] + list(floors)}
    ratios = []
    floor_name = "floor_unix_rtt" if transport == "unix" else "floor_pyzmq_ipc_rtt"
    for r in range(rounds):
        got = {}
        # NB: the floors and the lookups alternate which goes first.
        order = [*floors.items()]
        for name, call in (order + lookups if r % 2 == 0 else lookups + order):
            got[name] = timed(per_round, call)
            samples[name] += got[name]
        ratios.append(percentile_us(got["lookup_16"], 0.5) / percentile_us(got[floor_name], 0.5))
    for (sfx, _), q in reqs.items():
        clients[sfx].request_finished(q)
    out = {}
    for name, xs in samples.items():
        out[f"{name}_us" if name.startswith("floor") else f"{name}_p50_us"] = percentile_us(xs, 0.50)
        out[f"{name}_p99_us"] = percentile_us(xs, 0.99)
    lo, mid, hi = quartiles(ratios)
    out["lookup_16_over_floor"], out["lookup_16_over_floor_spread"] = mid, (hi - lo) / 2
    if "_no_poll" in clients:
        out["poll_speedup_16"] = out["lookup_16_no_poll_p50_us"] / out["lookup_16_p50_us"]
    out["floor"], out["rounds"] = floor_name, rounds
    return out


def configurations(args) -> List[tuple]:
    """(figure suffix, daemon --engine-poll µs, client poll_us) measured:
    the headline first; over unix also the client polling alone (a daemon
    on its defaults) and neither polling, the baseline."""
    if args.transport != "unix":
        return [("", 0, 0)]
    return [("", args.daemon_poll_us, args.client_poll_us), ("_client_poll", 0, args.client_poll_us),
            ("_no_poll", 0, 0)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvtier_bench.client", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvtierd", required=True, help="the kvtierd binary (go build -o kvtierd ./cmd/kvtierd)")
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds of floors and lookups")
    ap.add_argument("--per-round", type=int, default=200, help="calls per figure per round")
    ap.add_argument("--transport", choices=("ipc", "unix"), default="unix",
                    help="the engine endpoint's transport: length-prefixed frames on a Unix socket, or ZeroMQ over ipc")
    ap.add_argument("--daemon-poll-us", type=int, default=100,
                    help="unix: the headline daemon's --engine-poll (µs; 0: off)")
    ap.add_argument("--client-poll-us", type=int, default=DEFAULT_POLL_US,
                    help="unix: the clients' poll_us where they poll")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvtier-pybench-") as tmp, contextlib.ExitStack() as stack:
        daemons: Dict[int, str] = {}  # address by --engine-poll µs: one daemon each
        clients: Dict[str, Client] = {}  # by figure suffix
        for sfx, daemon_poll, client_poll in configurations(args):
            if daemon_poll not in daemons:
                proc, daemons[daemon_poll] = start_daemon(args.kvtierd, tmp, args.transport, f"engine-{daemon_poll}",
                                                          daemon_poll)
                stack.callback(lambda p=proc: (p.terminate(), p.wait(timeout=30)))
            clients[sfx] = Client(daemons[daemon_poll], name="kvtier_bench.client", heartbeat=False,
                                  poll_us=client_poll)
            stack.callback(clients[sfx].close)
        unix, zmq_echo = UnixEcho(tmp), ZmqEcho(tmp)
        stack.callback(unix.close)
        stack.callback(zmq_echo.close)
        res = measure(clients,
                      {"floor_unix_rtt": unix.once, "floor_pyzmq_ipc_rtt": zmq_echo.once},
                      args.transport, args.rounds, args.per_round)
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
    if "poll_speedup_16" in res:
        print(f"16-key lookup, daemon --engine-poll {args.daemon_poll_us}us and client poll_us {args.client_poll_us}: "
              f"{res['poll_speedup_16']:.2f}× faster at p50 than neither polling "
              f"({res['lookup_16_no_poll_p50_us']:.1f} µs; the client polling alone: "
              f"{res['lookup_16_client_poll_p50_us']:.1f} µs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

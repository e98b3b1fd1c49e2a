"""A real kvtierd for the suites: built once from this repository, started
per test on its own engine socket and pool file, read through its
/metrics, stopped (SIGTERM, exit 0 asserted) or killed (SIGKILL, as a
crash) at the end."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from typing import Deque, Dict, List, Optional, Sequence

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))


# kvtierd's log line when it waits for the first engine's block size.
SIZING_MESSAGE = "kvtierd sizing its slots from the first engine (--block-bytes fixes them)"


def build_kvtierd(out: str) -> str:
    """go build ./cmd/kvtierd into out; returns out."""
    subprocess.run(["go", "build", "-o", out, "./cmd/kvtierd"], cwd=REPO, check=True)
    return out


class Daemon:
    """A kvtierd process: engine socket, pool file, metrics port."""

    def __init__(self, binary: str, workdir: str, block_bytes: int, pool_bytes: int,
                 config: Optional[str] = None, extra_args: Sequence[str] = (),
                 transport: str = "ipc", pool: Optional[str] = None,
                 sock_name: str = "engine.sock", tag: str = "test",
                 argv: Optional[Sequence[str]] = None, env: Optional[Dict[str, str]] = None):
        """argv, when given, replaces the engine, pool and size flags (a
        command line as a user writes it: the README's), env the process's
        environment; the metrics port and JSON logs are always added."""
        self.binary, self.workdir = binary, workdir
        self.argv, self.env = argv, env
        self.block_bytes, self.pool_bytes, self.config = block_bytes, pool_bytes, config
        self.extra_args = list(extra_args)
        self.sock = os.path.join(workdir, sock_name)
        self.address = f"{transport}://" + self.sock  # ipc (ZeroMQ) or unix (stream)
        self.pool = pool or f"/dev/shm/kvtier-{tag}-{os.getpid()}-{time.monotonic_ns()}.pool"
        self.metrics_port = 0
        self.proc: Optional[subprocess.Popen] = None
        self._log: Deque[str] = collections.deque(maxlen=200)  # its last log lines

    def start(self) -> "Daemon":
        if self.argv is not None:
            args = [self.binary, *self.argv, "--metrics-listen", "127.0.0.1:0", "--log-format", "json"]
        else:
            # NB: block_bytes 0 gives none: the first engine sizes the slots
            args = [self.binary, "--engine-listen", self.address, "--pool-path", self.pool,
                    "--pool-bytes", str(self.pool_bytes),
                    *(["--block-bytes", str(self.block_bytes)] if self.block_bytes else []),
                    "--engine-grace", "3s", "--metrics-listen", "127.0.0.1:0",
                    "--log-format", "json"]
        if self.config:
            args += ["--config", self.config]
        args += self.extra_args
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=self.env)
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 60
        for line in self.proc.stderr:  # readiness: the daemon's own log lines
            rec = json.loads(line)
            # NB: with no block size, kvtierd serves its engine address (every
            # call answered SIZING) until the first engine declares one.
            if rec.get("message") in ("kvtierd listening", SIZING_MESSAGE):
                self.metrics_port = int(rec["metrics_addr"].rsplit(":", 1)[1])
                break
            assert time.monotonic() < deadline, "kvtierd did not start"
        else:
            raise AssertionError("kvtierd exited before listening")
        threading.Thread(target=self._keep_log, args=(self.proc.stderr,), daemon=True).start()
        return self

    def _keep_log(self, stream) -> None:
        for line in stream:
            self._log.append(line)

    def log_tail(self, n: int = 40) -> str:
        """The daemon's last log lines (a failing test's evidence)."""
        return "".join(list(self._log)[-n:])

    def metrics(self) -> Dict[str, float]:
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                      timeout=5).read().decode()
        out = {}
        for line in body.splitlines():
            if line.startswith("kvtier_") and " " in line:
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_metric(self, name: str, at_least: float, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.metrics().get(name, 0.0) < at_least:
            assert time.monotonic() < deadline, f"{name} never reached {at_least}"
            time.sleep(0.02)  # NB: polling a process's metrics; no message to wait on

    def wait_quiet(self, timeout: float = 30.0, what: str = "", credit: bool = False) -> Dict[str, float]:
        """Polls /metrics until nothing is held: no job in flight (an
        engine reports its jobs done asynchronously), no slot pinned,
        write-pending or leased — with credit, no slot credited either (a
        live engine keeps its credit; a dead one's is freed after the
        quarantine, --engine-grace). Returns those metrics; fails after
        timeout with what is still held."""
        deadline = time.monotonic() + timeout
        names = ["kvtier_jobs_in_flight", "kvtier_pool_slots_pinned",
                 "kvtier_pool_slots_write_pending", "kvtier_pool_slots_leased"]
        if credit:
            names.append("kvtier_pool_slots_credit")
        while True:
            m = self.metrics()
            held = {k: m.get(k, 0.0) for k in names}
            if not any(held.values()):
                return m
            assert time.monotonic() < deadline, f"still held {what}: {held}"
            time.sleep(0.05)  # NB: polling a process's metrics; no message to wait on

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(timeout=30) == 0

    def kill(self) -> None:
        """SIGKILL: the pool file and the socket stay behind, as after a
        crash (a daemon restarted on the same paths replaces both)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)


def stop_all(made: List[Daemon]) -> None:
    """A factory fixture's end: every daemon still running stopped, every
    pool file left behind (a killed daemon's) removed."""
    for d in made:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
    for d in made:
        if os.path.exists(d.pool):
            os.unlink(d.pool)


def stop_process(pid: int) -> None:
    """SIGSTOP pid and return once every thread of it is stopped (state T),
    within 10 s: the signal is delivered asynchronously, and a daemon that
    polls its sockets can answer a frame sent meanwhile."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while True:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(st in ("T", "t") for st in states):
            return
        assert time.monotonic() < deadline, f"threads of {pid} not stopped: {states}"
        time.sleep(0.001)  # NB: polling /proc; no message says a process stopped

"""Fixtures of the vLLM connector's tests: a real kvtierd (built from this
repository), real vLLM engines (vLLM's CPU backend) in their own process
groups, and small random-weight Llama models saved as safetensors.

Run in the vLLM venv: ``$(bash scripts/vllm-env.sh)/bin/python -m pytest
clients/python/tests_vllm``. Without vLLM the engine tests skip, saying so."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import List, Optional, Sequence

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

try:
    import vllm  # noqa: F401

    HAVE_VLLM = True
except Exception:  # ImportError, or a broken install
    HAVE_VLLM = False

needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed in this "
                                "interpreter (scripts/vllm-env.sh builds the venv)")


@pytest.fixture(scope="session")
def kvtierd_bin(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("bin") / "kvtierd")
    subprocess.run(["go", "build", "-o", out, "./cmd/kvtierd"], cwd=REPO, check=True)
    return out


class Daemon:
    """A kvtierd process: engine socket, pool file, metrics port."""

    def __init__(self, binary: str, workdir: str, block_bytes: int, pool_bytes: int,
                 config: Optional[str] = None, extra_args: Sequence[str] = (),
                 transport: str = "ipc", pool: Optional[str] = None):
        self.binary, self.workdir = binary, workdir
        self.block_bytes, self.pool_bytes, self.config = block_bytes, pool_bytes, config
        self.extra_args = list(extra_args)
        self.sock = os.path.join(workdir, "engine.sock")
        self.address = f"{transport}://" + self.sock  # ipc (ZeroMQ) or unix (stream)
        self.pool = pool or f"/dev/shm/kvtier-vllmtest-{os.getpid()}-{time.monotonic_ns()}.pool"
        self.metrics_port = 0
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "Daemon":
        args = [self.binary, "--engine-listen", self.address, "--pool-path", self.pool,
                "--pool-bytes", str(self.pool_bytes), "--block-bytes", str(self.block_bytes),
                "--engine-grace", "3s", "--metrics-listen", "127.0.0.1:0",
                "--log-format", "json"]
        if self.config:
            args += ["--config", self.config]
        args += self.extra_args
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        for line in self.proc.stderr:  # readiness: the daemon's own log lines
            rec = json.loads(line)
            if rec.get("message") == "kvtierd listening":
                self.metrics_port = int(rec["metrics_addr"].rsplit(":", 1)[1])
                break
            assert time.monotonic() < deadline, "kvtierd did not start"
        else:
            raise AssertionError("kvtierd exited before listening")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        return self

    def metrics(self) -> dict:
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                      timeout=5).read().decode()
        out = {}
        for line in body.splitlines():
            if line.startswith("kvtier_") and " " in line:
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_quiet(self, timeout: float = 30.0, what: str = "", credit: bool = False) -> dict:
        """Polls /metrics until nothing is held: no job in flight (an
        engine reports its jobs done asynchronously, after generate()
        returned), no slot pinned, write-pending or leased — with credit,
        no slot credited either (a live engine keeps its credit; a dead
        one's is freed after the quarantine, --engine-grace). Returns those
        metrics; fails after timeout with what is still held."""
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
        crash (a daemon restarted on the same paths replaces both; the
        fixture removes what is left at the end)."""
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def daemon_factory(kvtierd_bin, tmp_path):
    made: List[Daemon] = []

    def make(block_bytes: int = 64 << 10, pool_bytes: int = 64 << 20,
             config: Optional[str] = None, extra_args: Sequence[str] = (),
             transport: str = "ipc", pool: Optional[str] = None) -> Daemon:
        d = Daemon(kvtierd_bin, str(tmp_path), block_bytes, pool_bytes, config, extra_args, transport, pool)
        made.append(d)
        return d.start()

    yield make
    for d in made:
        d.stop()
    for d in made:  # a killed daemon's pool file (64 MiB of /dev/shm)
        if os.path.exists(d.pool):
            os.unlink(d.pool)


@pytest.fixture(params=["ipc", "unix"])
def daemon(daemon_factory, request):
    """A kvtierd on each engine transport: ZeroMQ over ipc, and the
    length-prefixed unix stream the README recommends."""
    return daemon_factory(transport=request.param)


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """Two models of one architecture (same KV geometry) and other weights."""
    from kvtier_vllm.harness import save_random_llama

    base = tmp_path_factory.mktemp("models")
    return {"a": save_random_llama(str(base / "llama-a"), seed=0),
            "b": save_random_llama(str(base / "llama-b"), seed=1)}


class Engine:
    """A vLLM engine process (engine_child.py) in its own process group."""

    def __init__(self, model: str, kvtier: Optional[str], *extra: str):
        rfd, wfd = os.pipe()
        args = [sys.executable, os.path.join(HERE, "engine_child.py"), model,
                "--result-fd", str(wfd)]
        if kvtier:
            args += ["--kvtier", kvtier]
        args += list(extra)
        self.logfile = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=self.logfile,
                                     stderr=subprocess.STDOUT, text=True, pass_fds=(wfd,),
                                     start_new_session=True)
        os.close(wfd)
        self.results = os.fdopen(rfd, "r")
        assert self._result(timeout=300).get("ready"), "engine did not start"

    def log_tail(self, n: int = 40) -> str:
        self.logfile.flush()
        self.logfile.seek(0)
        return "".join(self.logfile.readlines()[-n:])

    def _result(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.results], [], [], timeout)
        if not ready:
            raise AssertionError(f"engine gave no answer in {timeout}s:\n" + self.log_tail())
        line = self.results.readline()
        if not line:
            raise AssertionError("engine exited:\n" + self.log_tail())
        return json.loads(line)

    def generate(self, prompts, max_tokens: int = 8, logprobs: int = 5,
                 timeout: float = 300) -> dict:
        self.proc.stdin.write(json.dumps({"op": "gen", "prompts": prompts,
                                          "max_tokens": max_tokens,
                                          "logprobs": logprobs}) + "\n")
        self.proc.stdin.flush()
        out = self._result(timeout)
        assert "error" not in out, out.get("error", "") + "\n" + self.log_tail()
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=20)
            except Exception:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the engine core and workers too
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.results.close()
        self.logfile.close()


@pytest.fixture
def engine_factory():
    made: List[Engine] = []

    def make(model: str, kvtier: Optional[str], *extra: str) -> Engine:
        e = Engine(model, kvtier, *extra)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()

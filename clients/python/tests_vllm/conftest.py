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
from typing import List, Optional, Sequence

import pytest

from testsupport.engines import skip_without
from testsupport.kvtierd import Daemon, build_kvtierd, stop_all

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

try:
    import vllm  # noqa: F401

    HAVE_VLLM = True
except Exception:  # ImportError, or a broken install
    HAVE_VLLM = False

needs_vllm = skip_without(HAVE_VLLM, "vLLM", "scripts/vllm-env.sh")


@pytest.fixture(scope="session")
def kvtierd_bin(tmp_path_factory):
    return build_kvtierd(str(tmp_path_factory.mktemp("bin") / "kvtierd"))


@pytest.fixture(scope="session")
def kvtier_cli(tmp_path_factory):
    """The operator's CLI (cmd/kvtier), built from this repository."""
    out = str(tmp_path_factory.mktemp("bin") / "kvtier")
    subprocess.run(["go", "build", "-o", out, "./cmd/kvtier"], cwd=REPO, check=True)
    return out


@pytest.fixture
def daemon_factory(kvtierd_bin, tmp_path):
    made: List[Daemon] = []

    def make(block_bytes: int = 64 << 10, pool_bytes: int = 64 << 20,
             config: Optional[str] = None, extra_args: Sequence[str] = (),
             transport: str = "ipc", pool: Optional[str] = None, start: bool = True,
             sock_name: str = "engine.sock") -> Daemon:
        d = Daemon(kvtierd_bin, str(tmp_path), block_bytes, pool_bytes, config, extra_args, transport, pool,
                   sock_name=sock_name, tag="vllmtest")
        made.append(d)
        return d.start() if start else d

    yield make
    stop_all(made)


@pytest.fixture(params=["ipc", "unix"])
def daemon(daemon_factory, request):
    """A kvtierd on each engine transport: ZeroMQ over ipc, and the
    length-prefixed unix stream the README recommends."""
    return daemon_factory(transport=request.param)


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """Two models of one architecture (same KV geometry) and other weights."""
    from kvtier_bench.vllm_harness import save_random_llama

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

    def log_lines(self, needles: str) -> str:
        """Every line of the engine's log that holds one of needles
        (separated by "|"): a failing test's evidence, without the noise."""
        self.logfile.flush()
        self.logfile.seek(0)
        return "".join(line for line in self.logfile if any(n in line for n in needles.split("|")))

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

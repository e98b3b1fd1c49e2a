"""The README's three commands for vLLM users, as written there, under a
real OpenAI-compatible vLLM server (vLLM's CPU build) and a real kvtierd: an
HTTP client's later request reports its 1,024-token prefix cached after
vLLM's GPU prefix cache evicted it, kvtierd counted the loads, and the
server shuts down cleanly, leaving nothing held in kvtierd.

Two ways: `vllm serve` against the suite's kvtierd on each engine transport
(the address through $KVTIER_ADDRESS: the README's command names none), and
the whole sequence from the wheel (KVTIER_WHEEL_VENV: a venv made by
scripts/wheel-venv.sh, whose kvtierd, kvtier, kvtier_vllm come from the
wheel), run with no Go on PATH — kvtierd with the README's flags, on its
default socket (again $KVTIER_ADDRESS, so the run cannot collide with a
kvtierd of the machine's)."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


import pytest

from conftest import REPO, needs_vllm

pytestmark = needs_vllm

BLOCK = 32            # the README's --block-size
PREFIX = 1024         # 32 blocks, shared by the first and the last request
GPU_BLOCKS = 96       # vLLM's GPU cache: 3,072 tokens, so three fillers evict the prefix
WHEEL_VENV = os.environ.get("KVTIER_WHEEL_VENV", "")


def readme_block() -> str:
    """The shell block of the README's "For vLLM users: three commands"."""
    text = open(os.path.join(REPO, "README.md")).read()
    m = re.search(r"^## For vLLM users: three commands\n\n```sh\n(.*?)^```$", text, re.M | re.S)
    assert m, "the README no longer opens with the three commands for vLLM users"
    return m.group(1)


def readme_command(start: str) -> list:
    """The README's command that begins with start, its continuation lines
    joined, split as a shell would (a trailing `&` dropped)."""
    block = readme_block()
    m = re.search(rf"^{re.escape(start)}.*?$" if start != "vllm serve MODEL" else r"^vllm serve MODEL .*?}}'$",
                  block, re.M | re.S)
    assert m, f"the README's three commands lost `{start} ...`"
    args = shlex.split(m.group(0))
    return args[:-1] if args[-1] == "&" else args


def serve_args(model: str, port: int, vllm: str = "") -> list:
    """The README's command with its placeholder filled in (the model),
    plus what this test needs of the server (a port, token-id prompts
    without a tokenizer, a small GPU cache so the prefix is evicted, the
    cached-token count in the reply)."""
    args = readme_command("vllm serve MODEL")
    assert args[:3] == ["vllm", "serve", "MODEL"]
    cfg = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert "kvtier_address" not in cfg["kv_connector_extra_config"], "the README's engine finds kvtierd itself"
    vllm = vllm or os.path.join(os.path.dirname(sys.executable), "vllm")
    return [vllm, "serve", model] + args[3:] + [
        "--port", str(port), "--host", "127.0.0.1", "--skip-tokenizer-init",
        "--enable-prompt-tokens-details", "--max-model-len", "2048",
        "--num-gpu-blocks-override", str(GPU_BLOCKS), "--enforce-eager",
        "--max-num-seqs", "4", "--dtype", "bfloat16"]


def tokens(seed: int, n: int):
    rng = random.Random(seed)
    return [rng.randrange(1, 1000) for _ in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`vllm serve` in its own process group, its log in a temporary file."""

    def __init__(self, args: list, **env_extra: str):
        self.port = int(args[args.index("--port") + 1])
        self.log = tempfile.TemporaryFile(mode="w+")
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
                   VLLM_CPU_NUM_OF_RESERVED_CPU="1", **env_extra)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)

    def log_tail(self, n: int = 40) -> str:
        self.log.flush()
        self.log.seek(0)
        return "".join(self.log.readlines()[-n:])

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, "vllm serve exited:\n" + self.log_tail()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5):
                    return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            assert time.monotonic() < deadline, "vllm serve not ready:\n" + self.log_tail()
            time.sleep(0.5)  # NB: polling a server's health endpoint; nothing to wait on

    def complete(self, model: str, prompt) -> dict:
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 4,
                           "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, as an operator or an orchestrator stops a server."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.log.close()


def cached(reply: dict) -> int:
    return (reply["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_the_readmes_vllm_serve_reports_the_prefix_kvtier_served(daemon, models):
    serve_and_check(daemon, models["a"], Server(serve_args(models["a"], free_port()),
                                                KVTIER_ADDRESS=daemon.address))


def wait_session(daemon, timeout: float = 60) -> None:
    """Until kvtierd holds an engine session (its /metrics)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if daemon.metrics().get("kvtier_engine_sessions", 0.0) >= 1:
                return
        except OSError:
            pass  # still sizing its pool: nothing served on its metrics address yet
        assert time.monotonic() < deadline, "vLLM never held a kvtier session\nkvtierd:\n" + daemon.log_tail()
        time.sleep(0.05)  # NB: polling a process's metrics; no message to wait on


def serve_and_check(daemon, model: str, server: Server, status=None) -> None:
    """The prefix served from kvtier after vLLM's GPU cache evicted it;
    a clean stop; nothing left held in kvtierd. status, when given, is
    `kvtier status --json` of the node, read while vLLM is connected."""
    try:
        server.wait_ready()
        # NB: vLLM serves before its kvtier session is up: a kvtierd given no
        # block size answers the first hello SIZING and the connector comes
        # back a second later (README). A prompt sent before then is not
        # stored; a user sees the session in `kvtier status`, this waits on
        # the same count.
        wait_session(daemon)
        prefix = tokens(1, PREFIX)
        first = server.complete(model, prefix + tokens(11, 32))
        assert cached(first) == 0
        for i in range(3):  # 47 blocks each through a 96-block GPU cache: the prefix goes
            server.complete(model, tokens(50 + i, 1500))
        hits = daemon.metrics().get("kvtier_lookup_hits_total", 0.0)

        later = server.complete(model, prefix + tokens(12, 32))
        assert cached(later) >= PREFIX, later["usage"]
        loaded = daemon.metrics().get("kvtier_lookup_hits_total", 0.0) - hits
        # vLLM's GPU cache had evicted the prefix: kvtierd served all of it
        assert loaded >= PREFIX // BLOCK, f"kvtierd served {loaded} blocks"
        if status is not None:
            st = status()
            assert st["engines"] >= 1 and st["hits"] >= loaded and st["pool"]["ready"] > 0, st

        rc = server.stop()
        assert rc == 0, f"vllm serve exited {rc}:\n" + server.log_tail()
    finally:
        server.kill()
    # vLLM's API server kills its engine core at shutdown (no goodbye to
    # kvtierd): the session is released after its quarantine (--engine-grace
    # 3s in the fixture), and nothing stays held.
    daemon.wait_quiet(timeout=30, what="after vllm serve stopped", credit=True)


@pytest.mark.skipif(not WHEEL_VENV, reason="KVTIER_WHEEL_VENV unset (scripts/test.sh sets it: scripts/wheel-venv.sh)")
def test_the_readmes_three_commands_from_the_wheel_with_no_go(models, tmp_path):
    """Issue 40: the README's three commands as a user runs them after
    `pip install` of the wheel — kvtierd and vllm serve from the venv, no Go
    on PATH, kvtierd with the README's flags (its pool shrunk to fit a CI
    box) on its default socket, and vLLM given no address."""
    from testsupport.kvtierd import Daemon

    pip = readme_command("pip install")
    wheel = os.path.basename(pip[-1])
    assert pip[:2] == ["pip", "install"] and re.fullmatch(r"kvtier-[0-9.]+-py3-none-linux_\w+\.whl", wheel), pip
    version = wheel.split("-")[1]
    bindir = os.path.join(WHEEL_VENV, "bin")
    env = dict(os.environ, PATH=bindir + ":/usr/bin:/bin",
               KVTIER_ADDRESS="unix://" + str(tmp_path / "engine.sock"))
    assert subprocess.run(["sh", "-c", "command -v go"], env=env).returncode != 0, "Go is on PATH"
    for tool in ("kvtierd", "kvtier"):
        out = subprocess.run([os.path.join(bindir, tool), "--version"], env=env, capture_output=True,
                             text=True, check=True).stdout
        assert out.startswith(f"{tool} v{version} "), out

    kvtierd = readme_command("kvtierd")
    assert kvtierd[0] == "kvtierd" and "--engine-listen" not in kvtierd, kvtierd
    argv = kvtierd[1:]
    argv[argv.index("--pool-bytes") + 1] = "1GiB"  # the README's 64GiB does not fit a CI box
    argv += ["--pool-path", str(tmp_path / "kvtier.pool"), "--engine-grace", "3s"]
    d = Daemon(os.path.join(bindir, "kvtierd"), str(tmp_path), 0, 0, argv=argv, env=env).start()
    try:
        model = models["a"]
        server = Server(serve_args(model, free_port(), vllm=os.path.join(bindir, "vllm")),
                        PATH=env["PATH"], KVTIER_ADDRESS=env["KVTIER_ADDRESS"])
        status = {}

        def read_status() -> dict:
            status.update(json.loads(subprocess.run([os.path.join(bindir, "kvtier"), "status", "--json"], env=env,
                                                    capture_output=True, text=True, check=True).stdout))
            return status

        serve_and_check(d, model, server, status=read_status)
        # With no --block-bytes, the slots took the engine's bytes per block:
        # what `kvtier size` computes from the model's config.json, to a page.
        size = json.loads(subprocess.run(
            [os.path.join(bindir, "kvtier"), "size", "--model", os.path.join(model, "config.json"),
             "--block-size", str(BLOCK), "--json"], env=env, capture_output=True, text=True, check=True).stdout)
        if "--block-bytes" not in argv:
            assert status["pool"]["block_bytes"] == -(-size["block_bytes"] // 4096) * 4096, (status, size)
    finally:
        d.stop()

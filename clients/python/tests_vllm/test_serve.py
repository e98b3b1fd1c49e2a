"""The README's `vllm serve` command, as written there, under a real
OpenAI-compatible vLLM server (vLLM's CPU build) and a real kvtierd: an
HTTP client's later request reports its 1,024-token prefix cached after
vLLM's GPU prefix cache evicted it, kvtierd counted the loads, and the
server shuts down cleanly, leaving nothing held in kvtierd."""

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


from conftest import REPO, needs_vllm

pytestmark = needs_vllm

BLOCK = 32            # the README's --block-size
PREFIX = 1024         # 32 blocks, shared by the first and the last request
GPU_BLOCKS = 96       # vLLM's GPU cache: 3,072 tokens, so three fillers evict the prefix
README_ADDRESS = "unix:///tmp/kvtier.sock"


def readme_serve_command() -> list:
    """The `vllm serve` command of the README's "Run vLLM with kvtier", its
    continuation lines joined, split as a shell would."""
    text = open(os.path.join(REPO, "README.md")).read()
    m = re.search(r"^vllm serve MODEL .*?}}'$", text, re.M | re.S)
    assert m, "the README no longer shows `vllm serve MODEL ... }}'`"
    return shlex.split(m.group(0))


def serve_args(model: str, address: str, port: int) -> list:
    """The README's command with its two placeholders filled in (the model,
    and kvtierd's address), plus what this test needs of the server (a
    port, token-id prompts without a tokenizer, a small GPU cache so the
    prefix is evicted, the cached-token count in the reply)."""
    args = readme_serve_command()
    assert args[:3] == ["vllm", "serve", "MODEL"]
    cfg_at = args.index("--kv-transfer-config") + 1
    cfg = json.loads(args[cfg_at])
    extra = cfg["kv_connector_extra_config"]
    assert extra["kvtier_address"] == README_ADDRESS  # what the test replaces
    extra["kvtier_address"] = address
    args[cfg_at] = json.dumps(cfg)
    vllm = os.path.join(os.path.dirname(sys.executable), "vllm")
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

    def __init__(self, args: list):
        self.port = int(args[args.index("--port") + 1])
        self.log = tempfile.TemporaryFile(mode="w+")
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
                   VLLM_CPU_NUM_OF_RESERVED_CPU="1")
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
    model = models["a"]
    server = Server(serve_args(model, daemon.address, free_port()))
    try:
        server.wait_ready()
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

        rc = server.stop()
        assert rc == 0, f"vllm serve exited {rc}:\n" + server.log_tail()
    finally:
        server.kill()
    # vLLM's API server kills its engine core at shutdown (no goodbye to
    # kvtierd): the session is released after its quarantine (--engine-grace
    # 3s in the fixture), and nothing stays held.
    daemon.wait_quiet(timeout=30, what="after vllm serve stopped", credit=True)

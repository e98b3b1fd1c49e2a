"""The GPU check's Python side (``scripts/gpu-check.sh`` drives it).

On one CUDA GPU, with vLLM 0.33 and a random-weight model of
Llama-3-8B's shape, it measures the time to first token (TTFT) of a
32,000-token prefix plus a short new suffix, three ways:

- ``recompute``: no offloading, vLLM's prefix cache off: the prefix is
  prefilled again;
- ``native``: vLLM's own CPU offloading (``OffloadingConnector`` with its
  ``CPUOffloadingSpec``) serves the prefix stored by an earlier request;
- ``kvtier``: the same connector with ``KvtierOffloadingSpec`` and a
  kvtierd serves it;

and checks that the greedy outputs of one prompt are identical across the
three. Each configuration runs in an engine process of its own (GPU memory
is only reliably returned when vLLM's processes exit), against the same
model files.

Everything that needs torch, transformers or vLLM is imported inside the
function that needs it: the plan, the arithmetic, the verdict and the Go
toolchain fetch run on a bare ``python3`` (the script's ``--dry-run`` and
the CPU-side tests, which have neither). The script runs this file by its
path: it must run on a bare ``python3`` that has none of the packages
installed.

Subcommands (``python gpu_check.py CMD --help``): ``plan``, ``go-toolchain``,
``build-model``, ``bench``, ``engine`` (one configuration; the bench's child),
``select-tests``, ``verdict``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
import zipfile
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))

# Llama-3-8B's shape (meta-llama/Meta-Llama-3-8B config.json), except the
# context: 33k positions so that a 32,000-token prefix, its suffix and the
# greedy tokens fit (rope_theta as published, no scaling).
LLAMA3_8B = {
    "hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "intermediate": 14336,
    "vocab": 128256, "rope_theta": 500000.0, "max_positions": 33792,
}
DTYPE_BYTES = 2  # bfloat16 weights and KV cache
CONFIGS = ("recompute", "native", "kvtier")
RELOADS = ("native", "kvtier")  # configurations that reload the prefix

# Pool slots beyond the long prompts': the short flush prompts (one block
# each) and kvtierd's store credit (the connector's default 64).
SLOT_MARGIN = 256
# vLLM 0.33's CPU tier rounds each chunk up to the page size.
NATIVE_ALIGN = 4096

VLLM_VERSION = "0.33.0"
# vllm==0.33.0 from PyPI pins torch==2.14.0, built for CUDA 13.0, whose
# runtime needs an NVIDIA driver of the 580 series or newer.
MIN_DRIVER_MAJOR = 580

# The Go toolchain go.mod asks for, as the Go module proxy serves it (the
# module golang.org/toolchain, the artifact GOTOOLCHAIN downloads). The
# device machines reach the proxy but not sum.golang.org, so the hash Go's
# checksum database would vouch for is pinned here: the go.sum h1: of the
# proxy's zip (the go command's own computation agrees), whose files were
# compared with the Go 1.26.8 this was written against: identical, but for
# go.env (that install's said GOTOOLCHAIN=local; the script sets it) and
# the zip's nested _go.mod files (renamed so as not to be modules).
GO_VERSION = "1.26.8"
GO_TOOLCHAIN_SUMS = {
    "go1.26.8.linux-amd64": "h1:ZOmGe1OnfREDMIdb1Qi4G9JSuDPBLGExZMQ4nis1RXM=",
}


# -- arithmetic -------------------------------------------------------------------


def head_dim(shape: Dict) -> int:
    return shape["hidden"] // shape["heads"]


def kv_bytes_per_token(shape: Dict, dtype_bytes: int = DTYPE_BYTES) -> int:
    """K and V of every layer for one token."""
    return shape["layers"] * 2 * shape["kv_heads"] * head_dim(shape) * dtype_bytes


def block_bytes(shape: Dict, block_tokens: int, dtype_bytes: int = DTYPE_BYTES) -> int:
    """One vLLM block of every layer: what one worker offloads per block
    (vLLM's worker_kv_bytes_per_block), hence kvtierd's --block-bytes with
    one worker and one block per chunk."""
    return block_tokens * kv_bytes_per_token(shape, dtype_bytes)


def param_count(shape: Dict) -> int:
    h, i, v, n = shape["hidden"], shape["intermediate"], shape["vocab"], shape["layers"]
    kv = shape["kv_heads"] * head_dim(shape)
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * i + 2 * h  # q,o; k,v; mlp; 2 norms
    return 2 * v * h + n * per_layer + h  # embeddings, untied lm_head, final norm


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def prompt_tokens(a) -> int:
    return a.prefix_tokens + a.suffix_tokens


def cached_tokens_expected(a) -> int:
    """What a reload serves of a measured prompt: the prefix, whole (a
    multiple of the block, check_knobs makes sure). The stored prompt had
    another suffix, so nothing past the prefix; and vLLM computes at least
    the last token, which is the suffix's."""
    return a.prefix_tokens


def pool_slots(a) -> int:
    """Slots (and native CPU chunks) so that nothing is ever evicted: every
    long prompt the run stores (warm-up and repeats, one block per slot)
    plus the margin."""
    per_prompt = math.ceil(prompt_tokens(a) / a.block_tokens)
    return (a.repeats + 1) * per_prompt + SLOT_MARGIN


def model_shape(a) -> Dict:
    """Llama-3-8B's shape, its context widened if the prompt asks for more."""
    shape = dict(LLAMA3_8B)
    shape["max_positions"] = max(shape["max_positions"], round_up(max_model_len(a), 1024))
    return shape


def max_model_len(a) -> int:
    return round_up(prompt_tokens(a) + a.greedy_tokens + 64, a.block_tokens)


def kv_transfer_config(config: str, *, kvtier_address: Optional[str] = None,
                       cpu_bytes: int = 0) -> Optional[Dict]:
    """vLLM's kv_transfer_config of one configuration (None: no connector)."""
    if config == "recompute":
        return None
    if config == "native":
        extra = {"spec_name": "CPUOffloadingSpec", "cpu_bytes_to_use": int(cpu_bytes)}
    elif config == "kvtier":
        if not kvtier_address:
            raise ValueError("the kvtier configuration needs kvtierd's address")
        extra = {"spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier_vllm",
                 "kvtier_address": kvtier_address}
    else:
        raise ValueError(f"unknown configuration {config!r} (one of {', '.join(CONFIGS)})")
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": extra}


def sizes(a) -> Dict:
    shape = model_shape(a)
    bb = block_bytes(shape, a.block_tokens)
    slots = pool_slots(a)
    pool = slots * bb
    return {
        "model_params": param_count(shape),
        "model_bytes": param_count(shape) * DTYPE_BYTES,
        "kv_bytes_per_token": kv_bytes_per_token(shape),
        "block_bytes": bb,
        "prompt_tokens": prompt_tokens(a),
        "prefix_bytes": a.prefix_tokens * kv_bytes_per_token(shape),
        "cached_tokens_expected": cached_tokens_expected(a),
        "pool_slots": slots,
        "pool_bytes": pool,
        "native_cpu_bytes": slots * round_up(bb, NATIVE_ALIGN),
        # kvtierd's pool and vLLM's CPU region are both /dev/shm files; the
        # engines run one after the other, so the larger one, plus room.
        "shm_bytes_needed": max(pool, slots * round_up(bb, NATIVE_ALIGN)) + (1 << 30),
        "max_model_len": max_model_len(a),
        "max_num_batched_tokens": a.prefix_tokens,
    }


def prompt(seed: int, n: int, high: int = 100000) -> List[int]:
    """Random token ids in [1, high): by default below Llama 3's special
    tokens (from 128000)."""
    rng = random.Random(seed)
    return [rng.randrange(1, high) for _ in range(n)]


def model_vocab(model: str) -> int:
    with open(os.path.join(model, "config.json")) as f:
        return int(json.load(f)["vocab_size"])


# -- arguments ----------------------------------------------------------------


def bench_knobs() -> argparse.ArgumentParser:
    """The measurement's knobs, shared by plan, bench and engine (the script
    passes the ones it does not know itself through to plan and bench)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--prefix-tokens", type=int, default=32000)
    p.add_argument("--suffix-tokens", type=int, default=16,
                   help="new tokens after the prefix (each measured prompt its own)")
    p.add_argument("--greedy-tokens", type=int, default=32,
                   help="tokens generated greedily for the identical-outputs check")
    p.add_argument("--block-tokens", type=int, default=32, help="vLLM's block_size")
    p.add_argument("--repeats", type=int, default=3, help="measured prompts per configuration (median)")
    p.add_argument("--seed", type=int, default=0, help="the model's weights")
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help="comma-separated subset of " + ",".join(CONFIGS))
    p.add_argument("--transport", choices=("unix", "ipc"), default="unix",
                   help="kvtierd's engine socket (the README recommends unix)")
    p.add_argument("--settle-s", type=float, default=1.0,
                   help="pause after a prefix is stored, before it is reloaded")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--engine-timeout-s", type=float, default=300.0,
                   help="an 8B engine starts in about a minute and measures in less")
    p.add_argument("--no-batch-invariant", dest="batch_invariant", action="store_false",
                   help="leave VLLM_BATCH_INVARIANT unset in the engines")
    return p


def check_knobs(a) -> None:
    bad = [c for c in a.configs.split(",") if c not in CONFIGS]
    if bad:
        raise SystemExit(f"--configs: unknown {bad} (one of {', '.join(CONFIGS)})")
    for name in ("prefix_tokens", "suffix_tokens", "greedy_tokens", "block_tokens", "repeats"):
        if getattr(a, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
    if a.prefix_tokens % a.block_tokens:
        # The recompute engine prefills the prompt as [prefix][suffix]
        # (max_num_batched_tokens = prefix): the reload engines compute the
        # suffix on a block-aligned prefix, and the arithmetic only matches
        # bit for bit if the recompute's chunk boundary is the same.
        raise SystemExit("--prefix-tokens must be a multiple of --block-tokens")


def configs(a) -> List[str]:
    return [c for c in CONFIGS if c in a.configs.split(",")]


# -- the plan (--dry-run) ------------------------------------------------------


def plan(a) -> Dict:
    s = sizes(a)
    cache = a.cache
    engine = {
        "block_size": a.block_tokens, "max_model_len": s["max_model_len"],
        "max_num_batched_tokens": s["max_num_batched_tokens"], "dtype": "bfloat16",
        "enforce_eager": True, "enable_prefix_caching": False, "seed": 0,
        "skip_tokenizer_init": True, "gpu_memory_utilization": a.gpu_memory_utilization,
    }
    return {
        "vllm": VLLM_VERSION,
        "venv": os.environ.get("KVTIER_VLLM_VENV") or os.path.expanduser(f"~/.cache/kvtier/vllm-{VLLM_VERSION}"),
        "needs": {"nvidia_driver_major": MIN_DRIVER_MAJOR, "go": GO_VERSION,
                  "shm_bytes": s["shm_bytes_needed"]},
        "model": {"shape": model_shape(a), "seed": a.seed, "dir": model_dir(cache, a)},
        "sizes": s,
        "kvtierd": ["kvtierd", "--engine-listen", f"{a.transport}://<tmp>/engine.sock",
                    "--pool-path", "/dev/shm/kvtier-bench-<pid>.pool",
                    "--pool-bytes", str(s["pool_bytes"]), "--block-bytes", str(s["block_bytes"])],
        "engine": engine,
        "batch_invariant": a.batch_invariant,
        "configs": {c: kv_transfer_config(c, kvtier_address=f"{a.transport}://<tmp>/engine.sock",
                                          cpu_bytes=s["native_cpu_bytes"]) for c in configs(a)},
        "per_config": [
            "warm-up: a long prompt (and, reloading, its reload)",
            f"{a.repeats} x: a fresh {a.prefix_tokens}-token prefix + {a.suffix_tokens} new tokens"
            " (reloading: stored cold first, then settle, a one-block flush request, then measured)",
            f"greedy: the last prefix + new suffix, {a.greedy_tokens} tokens, ignore_eos",
        ],
    }


def model_dir(cache: str, a) -> str:
    return os.path.join(cache, "gpu-check", f"llama3-8b-shape-seed{a.seed}-pos{model_shape(a)['max_positions']}")


# -- the Go toolchain from the module proxy ----------------------------------------


def zip_h1(path: str) -> str:
    """Go's dirhash Hash1 of a module zip (golang.org/x/mod/sumdb/dirhash
    HashZip): the go.sum ``h1:`` of a module."""
    summary = hashlib.sha256()
    with zipfile.ZipFile(path) as z:
        names = sorted(n for n in z.namelist() if not n.endswith("/"))
        for n in names:
            if "\n" in n:
                raise ValueError(f"{path}: a file name with a newline")
            summary.update(f"{hashlib.sha256(z.read(n)).hexdigest()}  {n}\n".encode())
    return "h1:" + base64.b64encode(summary.digest()).decode()


def go_arch() -> str:
    m = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(m, m)


def go_proxy() -> str:
    """The first proxy URL of GOPROXY (default proxy.golang.org)."""
    for entry in os.environ.get("GOPROXY", "https://proxy.golang.org").replace("|", ",").split(","):
        if entry.startswith(("http://", "https://")):
            return entry.rstrip("/")
    return "https://proxy.golang.org"


def fetch_go_toolchain(version: str, dest: str, proxy: Optional[str] = None,
                       expected: Optional[str] = None) -> str:
    """Downloads Go ``version`` as the module golang.org/toolchain from the
    module proxy (as GOTOOLCHAIN would), checks its hash, unpacks it into
    ``dest/go<version>``; returns that GOROOT."""
    name = f"go{version}.linux-{go_arch()}"
    want = expected or os.environ.get("KVTIER_GO_TOOLCHAIN_SUM") or GO_TOOLCHAIN_SUMS.get(name)
    if not want:
        raise SystemExit(f"no pinned hash for the toolchain {name}: set KVTIER_GO_TOOLCHAIN_SUM "
                         f"to its go.sum h1: (or install Go >= {version} on PATH)")
    root = os.path.join(dest, f"go{version}")
    if os.path.exists(os.path.join(root, ".kvtier-verified")):
        return root
    os.makedirs(dest, exist_ok=True)
    url = f"{proxy or go_proxy()}/golang.org/toolchain/@v/v0.0.1-{name}.zip"
    fd, tmp = tempfile.mkstemp(prefix="go-toolchain-", suffix=".zip", dir=dest)
    os.close(fd)
    try:
        with urllib.request.urlopen(url, timeout=120) as r, open(tmp, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
        got = zip_h1(tmp)
        if got != want:
            raise SystemExit(f"{url}: hash {got}, expected {want}: refusing it")
        unpack_toolchain(tmp, f"golang.org/toolchain@v0.0.1-{name}/", root)
    finally:
        os.unlink(tmp)
    return root


def unpack_toolchain(zip_path: str, prefix: str, root: str) -> None:
    """Unpacks the module zip's files under ``prefix`` into ``root``. Module
    zips carry no file modes: the executables (bin/, pkg/tool/) are made so
    here, as the go command does for a downloaded toolchain."""
    work = root + ".partial"
    shutil.rmtree(work, ignore_errors=True)
    with zipfile.ZipFile(zip_path) as z:
        for info in z.infolist():
            if info.is_dir() or not info.filename.startswith(prefix):
                continue
            rel = info.filename[len(prefix):]
            if rel.startswith("/") or ".." in rel.split("/"):
                raise SystemExit(f"{zip_path}: unsafe path {info.filename!r}")
            out = os.path.join(work, rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            if rel.startswith("bin/") or rel.startswith("pkg/tool/"):
                os.chmod(out, 0o755)
    with open(os.path.join(work, ".kvtier-verified"), "w") as f:
        f.write(prefix + "\n")
    shutil.rmtree(root, ignore_errors=True)
    os.rename(work, root)


# -- the model -------------------------------------------------------------------


def build_model(path: str, shape: Dict, seed: int) -> str:
    """A Llama of ``shape`` with seeded random weights, saved as bf16
    safetensors (as harness.save_random_llama, which builds on the CPU in
    float32: for 8B parameters that is 32 GB and minutes; here the weights
    are made in bf16 on the GPU when there is one). Random but real
    weights make every KV byte matter. Built once: a marker names the
    shape and seed, and the directory appears whole (renamed into place)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    marker = {"shape": shape, "seed": seed}
    done = os.path.join(path, ".kvtier-model.json")
    if os.path.exists(done):
        with open(done) as f:
            if json.load(f) == marker:
                return path
    cfg = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                      intermediate_size=shape["intermediate"], num_hidden_layers=shape["layers"],
                      num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                      max_position_embeddings=shape["max_positions"], rope_theta=shape["rope_theta"],
                      rms_norm_eps=1e-5, tie_word_embeddings=False,
                      bos_token_id=128000, eos_token_id=128001)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    model = model.to(torch.bfloat16)
    work = path + ".partial"
    shutil.rmtree(work, ignore_errors=True)
    model.save_pretrained(work)
    with open(os.path.join(work, ".kvtier-model.json"), "w") as f:
        json.dump(marker, f)
    shutil.rmtree(path, ignore_errors=True)
    os.rename(work, path)
    return path


# -- one engine (the bench's child process) --------------------------------------


def run_engine(a) -> Dict:
    """One configuration in this process: warm-up, ``repeats`` measured
    prompts, the greedy prompt. Returns what it measured."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if a.batch_invariant:
        # vLLM's batch-invariant mode (on Hopper: cuBLAS without split-K,
        # FlashAttention without KV splits): a token's arithmetic does not
        # depend on how many tokens share its step, so a suffix computed on
        # a reloaded prefix is bit-identical to the same suffix recomputed.
        os.environ.setdefault("VLLM_BATCH_INVARIANT", "1")
    from vllm import LLM, SamplingParams

    s = sizes(a)
    reload = a.config in RELOADS
    kv = kv_transfer_config(a.config, kvtier_address=a.kvtier_address, cpu_bytes=s["native_cpu_bytes"])
    t0 = time.perf_counter()
    # max_num_batched_tokens = the prefix: a cold prompt is prefilled as
    # [prefix][suffix], so the recompute computes its suffix exactly as a
    # reload does (a 16-token step on a 32,000-token context) and the
    # prefix's KV is computed in the same 32,000-token step in every engine.
    llm = LLM(model=a.model, skip_tokenizer_init=True, block_size=a.block_tokens,
              max_model_len=s["max_model_len"], max_num_batched_tokens=s["max_num_batched_tokens"],
              dtype="bfloat16", enforce_eager=True, seed=0, enable_prefix_caching=False,
              max_num_seqs=4, gpu_memory_utilization=a.gpu_memory_utilization,
              kv_transfer_config=kv)
    start_s = time.perf_counter() - t0
    one = SamplingParams(max_tokens=1, temperature=0, detokenize=False)
    high = min(100000, model_vocab(a.model))

    def tokens(seed: int, n: int) -> List[int]:  # within this model's vocabulary
        return prompt(seed, n, high)

    def gen(tokens: List[int], sp=one):
        t = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": tokens}], sp, use_tqdm=False)[0]
        return time.perf_counter() - t, out

    def settle(i: int) -> None:
        # The stores of the prompt just computed run on a side stream after
        # its generate() returned; their completions reach the connector's
        # scheduler side only in a later step. A pause and a one-block
        # request put them behind us, so that the measured request finds
        # its prefix stored rather than waiting on it.
        time.sleep(a.settle_s)
        gen(tokens(50_000 + i, a.block_tokens))

    n, m = a.prefix_tokens, a.suffix_tokens
    # Warm-up: the first long prefill (and, reloading, the first store with
    # kvtier's pool registration, and the first load) is not measured.
    warm = tokens(10_000, n)
    gen(warm + tokens(11_000, m))
    if reload:
        settle(-1)
    gen(warm + tokens(12_000, m))

    ttft, cached, cold = [], [], []
    for i in range(a.repeats):
        prefix = tokens(i, n)
        if reload:
            sec, out = gen(prefix + tokens(1000 + i, m))  # cold: recomputed, stored
            cold.append(sec)
            settle(i)
        sec, out = gen(prefix + tokens(2000 + i, m))
        ttft.append(sec)
        cached.append(out.num_cached_tokens or 0)

    greedy = SamplingParams(max_tokens=a.greedy_tokens, temperature=0, ignore_eos=True,
                            logprobs=2, detokenize=False)
    _, out = gen(prefix + tokens(3000, m), greedy)
    c = out.outputs[0]
    logprobs = [sorted(([tid, lp.logprob] for tid, lp in step.items()), key=lambda x: -x[1])
                for step in (c.logprobs or [])]
    return {
        "config": a.config,
        "engine_start_s": round(start_s, 2),
        "ttft_s": [round(x, 4) for x in ttft],
        "ttft_median_s": round(statistics.median(ttft), 4),
        "cold_ttft_s": [round(x, 4) for x in cold],
        "cached_tokens": cached,
        "greedy_tokens": list(c.token_ids),
        "greedy_logprobs": logprobs,
        "greedy_cached_tokens": out.num_cached_tokens or 0,
        "batch_invariant": os.environ.get("VLLM_BATCH_INVARIANT") == "1",
    }


# -- the bench: one engine process per configuration --------------------------------


def _load_daemon_module():
    """kvtier_bench/daemon.py by its path: it needs only the standard
    library, and this orchestrating process may run where the packages are
    not installed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kvtier_gpu_check_daemon", os.path.join(HERE, "daemon.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _gpu_memory_used_mib() -> Optional[int]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return int(out.split()[0])
    except Exception:
        return None


def wait_gpu_idle(limit_mib: int = 4096, timeout: float = 60.0) -> None:
    """An engine's processes can hold GPU memory a moment after they were
    killed; the next engine sizes its KV cache from what is free."""
    deadline = time.monotonic() + timeout
    while True:
        used = _gpu_memory_used_mib()
        if used is None or used < limit_mib or time.monotonic() > deadline:
            return
        time.sleep(1)  # NB: polling the driver: nothing to wait on


def _knob_args(a) -> List[str]:
    out = []
    for name in ("prefix_tokens", "suffix_tokens", "greedy_tokens", "block_tokens", "repeats",
                 "seed", "configs", "transport", "settle_s", "gpu_memory_utilization",
                 "engine_timeout_s"):
        out += ["--" + name.replace("_", "-"), str(getattr(a, name))]
    if not a.batch_invariant:
        out.append("--no-batch-invariant")
    return out


def _engine_child(a, config: str, address: Optional[str], timeout: float) -> Dict:
    result = os.path.join(a.work, f"{config}.json")
    log = os.path.join(a.work, f"{config}.log")
    cmd = [sys.executable, os.path.abspath(__file__), "engine", "--config", config,
           "--model", a.model, "--out", result, *_knob_args(a)]
    if address:
        cmd += ["--kvtier-address", address]
    if os.path.exists(result):
        os.unlink(result)
    t0 = time.perf_counter()
    with open(log, "w") as logf:
        # Its own session: the engine core and workers vLLM spawns are
        # killed with it, whatever state it ends in.
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    wall = round(time.perf_counter() - t0, 1)
    if rc == 0 and os.path.exists(result):
        with open(result) as f:
            out = json.load(f)
        out["wall_s"] = wall
        return out
    with open(log, errors="replace") as f:
        tail = f.readlines()[-40:]
    why = f"engine timed out after {timeout:.0f} s" if rc == "timeout" else f"engine exited {rc}"
    return {"config": config, "error": why, "wall_s": wall, "log": log,
            "log_tail": "".join(tail)[-6000:]}


def _mirror(a, config: str) -> None:
    """Each configuration's result and log tail, copied where they come
    back even if the command is cut short (the device's $OUT)."""
    if not a.mirror:
        return
    os.makedirs(a.mirror, exist_ok=True)
    for name in (f"{config}.json", f"{config}.log"):
        src = os.path.join(a.work, name)
        if os.path.exists(src):
            with open(src, "rb") as f:
                f.seek(max(0, os.path.getsize(src) - 200_000))
                data = f.read()
            with open(os.path.join(a.mirror, name), "wb") as f:
                f.write(data)


def run_bench(a) -> Dict:
    s = sizes(a)
    os.makedirs(a.work, exist_ok=True)
    deadline = time.monotonic() + a.time_left_s if a.time_left_s else None
    results: Dict[str, Dict] = {}
    for config in configs(a):
        timeout = a.engine_timeout_s
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
            if timeout < 60:  # not even an engine's start: say so rather than be cut off
                results[config] = {"config": config, "error": "not run: out of time (--budget-s)"}
                continue
        wait_gpu_idle()
        if config == "kvtier":
            daemon = _load_daemon_module()
            try:
                with daemon.kvtierd(a.kvtierd, s["block_bytes"], s["pool_slots"],
                                    transport=a.transport) as address:
                    results[config] = _engine_child(a, config, address, timeout)
            except Exception as e:  # kvtierd did not start (or stop)
                results.setdefault(config, {"config": config, "error": f"kvtierd: {type(e).__name__}: {e}"})
        else:
            results[config] = _engine_child(a, config, None, timeout)
        _mirror(a, config)
        r = results[config]
        print(f"[gpu-check] {config}: " + (r["error"] if "error" in r else
              f"ttft {r['ttft_s']} s, cached {r['cached_tokens']}, engine start {r['engine_start_s']} s"),
              file=sys.stderr, flush=True)
    return {"sizes": s, "prefix_tokens": a.prefix_tokens, "suffix_tokens": a.suffix_tokens,
            "repeats": a.repeats, "block_tokens": a.block_tokens, "results": results}


# -- the connector's CUDA tests ------------------------------------------------------

# What runs when no test of tests_vllm is CUDA-specific: the engine tests
# whose comparison is bit for bit (kvtier on vs a reference engine) and the
# negative control, on the unix transport only (each test starts engines:
# half a minute apiece on the device). On a CUDA build of vLLM their KV
# caches are on the GPU, so they go through the worker's CUDA copy path
# (cudaHostRegister'd pool, swap_blocks_batch on a side stream).
FALLBACK_TESTS = ["clients/python/tests_vllm/test_engine.py", "-k",
                  "(matches_off or corrupted_block or chunks_of_two) and unix"]


# A test file that gates on CUDA: a skip on torch.cuda.is_available(), a
# needs_cuda / needs_gpu marker, or a pytest.mark.cuda.
CUDA_GATE = re.compile(r"cuda\.is_available|needs_(cuda|gpu)\b|mark\.cuda\b")


def select_cuda_tests(test_dir: str, repo: str) -> List[str]:
    """pytest arguments for the connector's CUDA tests: the test files of
    ``test_dir`` gated on CUDA (those that skip without it), else
    FALLBACK_TESTS. (A file that merely mentions CUDA in prose is not
    selected: a whole engine suite on the device would not fit its time.)"""
    found = []
    for name in sorted(os.listdir(test_dir)):
        if not (name.startswith("test_") and name.endswith(".py")):
            continue
        with open(os.path.join(test_dir, name), errors="replace") as f:
            if CUDA_GATE.search(f.read()):
                found.append(os.path.relpath(os.path.join(test_dir, name), repo))
    return found or list(FALLBACK_TESTS)


def parse_junit(path: str) -> Dict:
    """Counts of a pytest --junitxml report, and the failed tests' names."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed = []
    for s in suites:
        for k in counts:
            counts[k] += int(s.get(k, 0))
        for case in s.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(f"{case.get('classname', '')}::{case.get('name', '')}")
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["failed_tests"] = failed[:20]
    return counts


# -- the verdict -----------------------------------------------------------------------


def first_divergence(a: Sequence, b: Sequence) -> Optional[int]:
    """Index of the first difference (the shorter length if one is a
    prefix of the other), None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    if not num or not den:
        return None
    return round(num / den, 2)


def verdict(bench: Optional[Dict], tests: Optional[Dict], *, bench_wanted: bool = True,
            tests_wanted: bool = True, phases: Optional[Dict] = None,
            failed_phase: Optional[str] = None, error: Optional[str] = None,
            setup_only: bool = False) -> Tuple[Dict, int]:
    """The summary line and the exit status: 0 only if every configuration
    asked for ran, the reloads served the whole prefix (and the recompute
    none of it), the greedy outputs are identical across configurations,
    and the CUDA tests passed. What was not run on request does not count
    (setup_only: nothing was measured, and the line says so)."""
    problems: List[str] = []
    out: Dict = {}
    if setup_only:
        bench_wanted = tests_wanted = False
        out["setup_only"] = True
    if failed_phase:
        problems.append(f"{failed_phase}: {error or 'failed'}")
        out["failed_phase"] = failed_phase
    if bench_wanted and not failed_phase:
        problems += _bench_verdict(bench, out)
    if not tests_wanted:
        out["cuda_tests"] = "not run (on request)"
    elif not failed_phase:
        out["cuda_tests"] = tests
        if not tests:
            problems.append("cuda tests: no report")
        elif tests.get("not_run"):
            problems.append(f"cuda tests: not run: {tests['not_run']}")
        else:
            if tests.get("rc") != 0:
                problems.append(f"cuda tests: pytest exited {tests.get('rc')}")
            if tests.get("passed", 0) < 1:
                problems.append("cuda tests: none passed (all skipped, or none collected)")
    if phases:
        out["phase_s"] = phases
    out["problems"] = problems
    out["gpu_check"] = "FAILED" if problems else ("setup ok" if setup_only else "ok")
    return out, (1 if problems else 0)


def _bench_verdict(bench: Optional[Dict], out: Dict) -> List[str]:
    if not bench or not bench.get("results"):
        out["outputs_identical"] = False
        return ["bench: no result"]
    problems = []
    res = bench["results"]
    ok = {c: r for c, r in res.items() if "error" not in r}
    for c, r in res.items():
        if "error" in r:
            problems.append(f"{c}: {r['error']}")
    med = {c: (ok[c]["ttft_median_s"] if c in ok else None) for c in CONFIGS}
    out.update({
        "prefix_tokens": bench.get("prefix_tokens"),
        "recompute_ttft_s": med["recompute"],
        "native_ttft_s": med["native"],
        "kvtier_ttft_s": med["kvtier"],
        # > 1: that much faster than recomputing the prefix
        "native_speedup": _ratio(med["recompute"], med["native"]),
        "kvtier_speedup": _ratio(med["recompute"], med["kvtier"]),
        # < 1: kvtier faster than vLLM's own CPU offloading
        "kvtier_vs_native_ttft": _ratio(med["kvtier"], med["native"]),
        "ttft_all_s": {c: r["ttft_s"] for c, r in ok.items()},
        "cold_ttft_s": {c: r["cold_ttft_s"] for c, r in ok.items() if r.get("cold_ttft_s")},
        "engine_start_s": {c: r.get("engine_start_s") for c, r in ok.items()},
        "batch_invariant": all(r.get("batch_invariant") for r in ok.values()) if ok else None,
    })
    expected = bench.get("sizes", {}).get("cached_tokens_expected")
    out["cached_tokens"] = {}
    for c, r in ok.items():
        got = r["cached_tokens"] + [r["greedy_cached_tokens"]]
        out["cached_tokens"][c] = got
        want = 0 if c == "recompute" else expected
        if any(x != want for x in got):
            problems.append(f"{c}: cached tokens {got}, expected {want} each: "
                            + ("it was not a recompute" if c == "recompute"
                               else "the prefix was not reloaded whole"))
    toks = {c: r["greedy_tokens"] for c, r in ok.items()}
    if len(ok) < 2:
        out["outputs_identical"] = False
        problems.append("fewer than two configurations ran: no outputs to compare")
        return problems
    same = len({json.dumps(t) for t in toks.values()}) == 1
    # identical across all the configurations asked for, not just those that ran
    out["outputs_identical"] = same and len(ok) == len(res)
    out["greedy_tokens"] = len(next(iter(toks.values())))
    out["logprobs_identical"] = len({json.dumps(r.get("greedy_logprobs")) for r in ok.values()}) == 1
    if not same:
        base = "recompute" if "recompute" in toks else next(iter(toks))
        out["divergence"] = {c: first_divergence(toks[base], t) for c, t in toks.items() if c != base}
        problems.append(f"greedy outputs differ from {base}'s (first differing token: {out['divergence']})")
    return problems


def tests_report(junit: Optional[str], rc: Optional[int], selection: Sequence[str]) -> Optional[Dict]:
    if rc is None:
        return None
    rep: Dict = {"rc": rc, "selection": list(selection)}
    if junit and os.path.exists(junit):
        try:
            rep.update(parse_junit(junit))
        except ET.ParseError as e:
            rep["junit_error"] = str(e)
    return rep


# -- main ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    knobs = bench_knobs()
    default_cache = os.environ.get("KVTIER_GPU_CACHE") or os.path.expanduser("~/.cache/kvtier")

    p = sub.add_parser("plan", parents=[knobs], help="what the run would do (JSON), or one --field")
    p.add_argument("--cache", default=default_cache)
    p.add_argument("--field", help="print only this entry of sizes / the model dir (model_dir)")

    g = sub.add_parser("go-toolchain", help="fetch Go from the module proxy; prints its GOROOT")
    g.add_argument("--version", default=GO_VERSION)
    g.add_argument("--dest", required=True)

    m = sub.add_parser("build-model", parents=[knobs], help="the random-weight model (once)")
    m.add_argument("--cache", default=default_cache)

    b = sub.add_parser("bench", parents=[knobs], help="every configuration, one engine process each")
    b.add_argument("--model", required=True)
    b.add_argument("--kvtierd", required=True, help="the kvtierd binary")
    b.add_argument("--work", required=True, help="logs and per-configuration results")
    b.add_argument("--out", required=True)
    b.add_argument("--mirror", default=os.path.join(os.environ["OUT"], "gpu-check-logs") if os.environ.get("OUT") else None,
                   help="copy each configuration's result and log tail here as it ends (default $OUT/gpu-check-logs)")
    b.add_argument("--time-left-s", type=float, default=0.0,
                   help="run no engine that would end past this many seconds from now (0: no limit)")

    e = sub.add_parser("engine", parents=[knobs], help="one configuration (the bench's child)")
    e.add_argument("--config", choices=CONFIGS, required=True)
    e.add_argument("--model", required=True)
    e.add_argument("--kvtier-address")
    e.add_argument("--out", required=True)

    t = sub.add_parser("select-tests", help="pytest arguments of the connector's CUDA tests, one a line")
    t.add_argument("--repo", default=os.path.abspath(os.path.join(HERE, "..", "..", "..")))

    v = sub.add_parser("verdict", help="the summary line; exits 1 unless all is well")
    v.add_argument("--bench", help="the bench's JSON (absent: the bench did not run)")
    v.add_argument("--no-bench", dest="bench_wanted", action="store_false")
    v.add_argument("--junit")
    v.add_argument("--tests-rc", type=int)
    v.add_argument("--tests-selection", default="", help="the selection, one argument a line")
    v.add_argument("--no-tests", dest="tests_wanted", action="store_false")
    v.add_argument("--tests-not-run", help="why the CUDA tests did not run (counts as a failure)")
    v.add_argument("--phases", default="{}", help="JSON: seconds per phase")
    v.add_argument("--setup-only", action="store_true", help="only the setup ran")
    v.add_argument("--failed-phase")
    v.add_argument("--error")
    v.add_argument("--out-dir", default=os.environ.get("OUT") or None,
                   help="also write gpu-check.json here (default $OUT)")
    return ap


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.cmd in ("plan", "build-model", "bench", "engine"):
        check_knobs(a)
    if a.cmd == "plan":
        p = plan(a)
        if a.field == "model_dir":
            print(p["model"]["dir"])
        elif a.field:
            print(p["sizes"][a.field] if a.field in p["sizes"] else p["needs"][a.field])
        else:
            print(json.dumps(p, indent=1))
        return 0
    if a.cmd == "go-toolchain":
        print(fetch_go_toolchain(a.version, a.dest))
        return 0
    if a.cmd == "build-model":
        print(build_model(model_dir(a.cache, a), model_shape(a), a.seed))
        return 0
    if a.cmd == "bench":
        out = run_bench(a)
        with open(a.out, "w") as f:
            json.dump(out, f)
        return 0
    if a.cmd == "engine":
        out = run_engine(a)
        with open(a.out, "w") as f:
            json.dump(out, f)
        sys.stdout.flush()
        sys.stderr.flush()
        # vLLM's own shutdown can take long or hang; the bench kills this
        # process's session (the engine core and workers) once it exits.
        os._exit(0)
    if a.cmd == "select-tests":
        print("\n".join(select_cuda_tests(os.path.join(a.repo, "clients", "python", "tests_vllm"), a.repo)))
        return 0
    if a.cmd == "verdict":
        bench = None
        if a.bench and os.path.exists(a.bench):
            with open(a.bench) as f:
                bench = json.load(f)
        selection = [s for s in a.tests_selection.split("\n") if s]
        tests = tests_report(a.junit, a.tests_rc, selection) if a.tests_wanted else None
        if a.tests_wanted and a.tests_not_run:
            tests = {"rc": None, "not_run": a.tests_not_run, "selection": selection}
        out, rc = verdict(bench, tests, bench_wanted=a.bench_wanted, tests_wanted=a.tests_wanted,
                          phases=json.loads(a.phases or "{}"), failed_phase=a.failed_phase,
                          error=a.error, setup_only=a.setup_only)
        line = json.dumps(out, sort_keys=True)
        print(line)
        if a.out_dir:
            os.makedirs(a.out_dir, exist_ok=True)
            with open(os.path.join(a.out_dir, "gpu-check.json"), "w") as f:
                f.write(line + "\n")
        return rc
    return 2


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Builds (once) and prints the path of the Python virtual environment that
# the SGLang HiCache backend's tests and benchmark run in (kvtier_sglang,
# docs/SGLANG.md): SGLang 0.5.23's own storage and host-pool classes on a
# CPU-only machine, plus kvtier's Python packages.
#
# SGLang's full install pulls CUDA-only kernels (flashinfer, sglang-kernel,
# deep-gemm, flash-mla, ...) and pins torch==2.14.1. The modules kvtier's
# backend meets -- sglang.srt.mem_cache.hicache_storage (HiCacheStorage,
# HiCacheFile, HiCacheStorageFailureInjector), .storage.backend_factory and
# .pool_host.{mha,mla} (MHATokenToKVPoolHost, MLATokenToKVPoolHost) -- run
# on CPU tensors without any of them. So the wheel is installed with
# --no-deps, beside torch (the version the vLLM venv uses, 2.13.0) and the
# minimal set of pure-Python (or prebuilt, CPU-only) packages those modules
# import, found by importing them until nothing was missing:
#
#   numpy orjson psutil pybase64 requests triton(torch's)  sglang.srt.utils.common
#   pillow starlette                                       sglang.srt.utils.common
#   msgspec                                                sglang.srt.platforms, device_pool_info
#   transformers (SGLang's pin)                            sglang/__init__ (hf_transformers_patches)
#   ipython pydantic aiohttp                               sglang/__init__ (sglang.utils, lang api)
#   apache-tvm-ffi (SGLang's pin)                          memory_pool -> dp_attention -> all_reduce
#   compressed-tensors (SGLang's pin) gguf                 memory_pool -> quantization registry
#   torchvision dill sentencepiece                         memory_pool -> sglang.srt.configs
#                                                          (multimodal configs, logit processors)
# torch's own CUDA libraries come with the index's torch wheel
# (~3 GB downloaded once); nothing here needs a GPU.
#
# Usage: VENV=$(bash scripts/sglang-env.sh)   # prints the venv path
# Env:   KVTIER_SGLANG_VENV  where to build it (default ~/.cache/kvtier/sglang-<version>)
set -euo pipefail

RECIPE=1 # bump when what the venv must hold changes
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0
VENV="${KVTIER_SGLANG_VENV:-$HOME/.cache/kvtier/sglang-$SGLANG_VERSION}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() { printf '[sglang-env] %s\n' "$*" >&2; }

# What the tests import from SGLang: the venv is good when this runs.
probe() {
	"$1" -c '
import sglang.srt.mem_cache.hicache_storage
import sglang.srt.mem_cache.storage.backend_factory
import sglang.srt.mem_cache.pool_host.mha, sglang.srt.mem_cache.pool_host.mla
import kvtier_sglang.backend
' >&2
}

if [ -f "$VENV/.kvtier-recipe" ] && [ "$(cat "$VENV/.kvtier-recipe")" = "$RECIPE" ]; then
	# Reinstall kvtier's own packages every time: they are the code under test.
	"$VENV/bin/python" -m pip install --quiet --no-deps --force-reinstall "$ROOT/clients/python" >&2
	echo "$VENV"
	exit 0
fi

log "building $VENV (sglang $SGLANG_VERSION without its CUDA kernels, torch $TORCH_VERSION)"
rm -rf "$VENV"
python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --upgrade pip packaging >&2

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==$TORCH_VERSION" >"$CONSTRAINTS" # nothing below may move torch
"$PY" -m pip install --quiet -c "$CONSTRAINTS" "torch==$TORCH_VERSION" \
	numpy orjson psutil pybase64 requests pillow starlette msgspec \
	"transformers==5.19.0" ipython pydantic aiohttp "apache-tvm-ffi==0.1.11" \
	"compressed-tensors==0.18.0" gguf torchvision dill sentencepiece \
	pytest pyzmq msgpack >&2
"$PY" -m pip install --quiet --no-deps "sglang==$SGLANG_VERSION" >&2
"$PY" -m pip install --quiet --no-deps --force-reinstall "$ROOT/clients/python" >&2
probe "$PY"
"$PY" -c 'import sglang, torch; print("sglang", sglang.__version__, "torch", torch.__version__)' >&2
echo "$RECIPE" >"$VENV/.kvtier-recipe"
echo "$VENV"

"""Benchmarks and test harness of kvtier's Python clients, apart from the
runtime packages (kvtier_client, kvtier_vllm, kvtier_sglang) that engines
import:

- ``python -m kvtier_bench.client``: the engine-protocol client against a kvtierd;
- ``python -m kvtier_bench.vllm manager|ttft|share``: the vLLM connector
  (vllm_harness builds the managers both sides use, vllm_ttft the engine run);
- ``python -m kvtier_bench.sglang``: the SGLang HiCache backend against HiCacheFile;
- ``gpu_check.py``: the device check ``scripts/gpu-check.sh`` runs;
- ``daemon``: the kvtierd each bench starts of its own (standard library only).

Nothing in the runtime packages imports this package.
"""

"""One real vLLM engine (vLLM's CPU backend), driven over stdin/stdout by the
tests: a line of JSON in, a line of JSON out on the file descriptor
``--result-fd`` (vLLM's processes log to stdout and stderr, which would
interleave with results).

    {"op": "gen", "prompts": [[token ids], ...], "max_tokens": 8, "logprobs": 5}
    -> {"outputs": [{"tokens": [...], "logprobs": [[[id, logprob], ...], ...],
                     "cached": n}, ...], "seconds": s}
    {"op": "quit"}

Usage: python engine_child.py MODEL_DIR [--kvtier ADDR] [--dtype D]
       [--block-size N] [--gpu-prefix-cache] [--gpu-blocks N] [--max-model-len N]
       [--extra JSON] [--kv-events JSON]
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

if os.environ.get("KVTIER_TEST_DEBUG"):  # the connector's debug log, for a failing test's evidence
    import logging

    _h = logging.StreamHandler()
    _h.setFormatter(logging.Formatter("%(asctime)s %(process)d %(name)s %(message)s"))
    for _name in ("kvtier_vllm", "kvtier_client"):
        logging.getLogger(_name).addHandler(_h)
        logging.getLogger(_name).setLevel(logging.DEBUG)


def engine(args):
    from vllm import LLM

    kv = None
    if args.kvtier:
        extra = {"spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier_vllm",
                 "kvtier_address": args.kvtier}
        extra.update(json.loads(args.extra or "{}"))
        kv = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": extra}
    events = None
    if args.kv_events:
        from vllm.config import KVEventsConfig

        events = KVEventsConfig(**json.loads(args.kv_events))
    return LLM(model=args.model, skip_tokenizer_init=True, block_size=args.block_size,
               max_model_len=args.max_model_len, dtype=args.dtype, enforce_eager=True, seed=0,
               enable_prefix_caching=args.gpu_prefix_cache, kv_transfer_config=kv,
               kv_events_config=events, max_num_seqs=8,
               num_gpu_blocks_override=args.gpu_blocks or None)


def generate(llm, cmd):
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=cmd.get("max_tokens", 8), temperature=0,
                        logprobs=cmd.get("logprobs", 5), detokenize=False)
    t = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in cmd["prompts"]], sp,
                        use_tqdm=False)
    seconds = time.perf_counter() - t
    res = []
    for o in outs:
        c = o.outputs[0]
        lps = [sorted([tid, lp.logprob] for tid, lp in step.items()) for step in (c.logprobs or [])]
        res.append({"tokens": list(c.token_ids), "logprobs": lps,
                    "cached": o.num_cached_tokens or 0})
    return {"outputs": res, "seconds": seconds}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--kvtier")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--gpu-prefix-cache", action="store_true")
    ap.add_argument("--gpu-blocks", type=int, default=0, help="vLLM's KV cache in blocks (0: as sized)")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--extra")
    ap.add_argument("--kv-events", help="vLLM's KVEventsConfig as JSON")
    ap.add_argument("--result-fd", type=int, required=True)
    args = ap.parse_args()
    results = os.fdopen(args.result_fd, "w", buffering=1)
    llm = engine(args)
    results.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        try:
            out = generate(llm, cmd)
        except Exception as e:  # reported, and the test decides
            out = {"error": f"{type(e).__name__}: {e}"}
        results.write(json.dumps(out) + "\n")
    # the test kills the process group: vLLM's own shutdown can take seconds here


if __name__ == "__main__":
    main()

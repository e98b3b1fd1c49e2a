"""Benchmarks of kvtier as vLLM's offloading tier, each against its
baseline measured in the same run.

``python -m kvtier_bench.vllm manager --trace TRACE --json``
    Replays a prefix trace through the manager API the way vLLM's scheduler
    calls it (per-key prefix scan, prepare/complete load and store, touch,
    request finished, ``on_schedule_end`` once per step) against vLLM's
    native CPUOffloadingManager and kvtier's manager (its own kvtierd) at
    the same capacity in blocks; reports hit rates, per-step latency, and
    the share of held blocks no prefix lookup can reach (sampled).

``python -m kvtier_bench.vllm share --json``
    What one node cache shared by N engines is worth: the trace's requests
    spread over N schedulers (round-robin, and by session), replayed
    through N native managers of C/N blocks each and through N kvtier
    managers sharing one kvtierd of C blocks, in the same run; hit rates and
    recomputed tokens for N = 2, 4, 8, and with one engine restarted
    halfway. A third cache, one native manager of C blocks shared by the N
    replays, tells what sharing one LRU does on the trace apart from
    anything kvtier does (``shared_native_ratio``, ``kvtier_vs_shared_native``).

``python -m kvtier_bench.vllm ttft --json``
    Time to first token of a shared prefix reloaded from kvtier vs
    recomputed, on a local random-weight model (vLLM's CPU backend).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from typing import Dict, List, Optional, Tuple

from .daemon import kvtierd, kvtierd_binary

# -- the scheduler model --------------------------------------------------------


def read_trace(path: str, limit: int) -> List[List[int]]:
    out = []
    with open(path) as f:
        for line in f:
            out.append(json.loads(line)["hash_ids"])
            if limit and len(out) >= limit:
                break
    return out


class Replay:
    """One manager driven through a trace in the order vLLM's
    ``OffloadingConnectorScheduler`` calls it (vLLM 0.32/0.33
    ``offloading/scheduler.py``; docs/VLLM.md, "vLLM's call order"). Each
    step:

    1. ``schedule()``: every waiting request scans its keys (``lookup`` per
       key; a RETRY or HIT_PENDING defers the request a step but the scan
       goes on, a MISS ends it), then ``prepare_load`` for a scheduled
       request's hits;
    2. ``build_connector_meta``: ``on_schedule_end``, then ``prepare_store``
       for the blocks the requests scheduled a step earlier computed, then
       ``on_request_finished`` for the requests that finished a step
       earlier — while their store jobs are still in flight;
    3. ``update_connector_output``: this step's load completions and the
       previous step's store completions (so a request's ``complete_store``
       comes *after* its ``on_request_finished``).

    Every ``preempt_every``-th scheduled request is preempted once (named in
    ``on_schedule_end``) and scans again two steps later; every
    ``abort_every``-th new request is aborted before it is scheduled
    (``on_new_request`` then ``on_request_finished`` at once). Wall time of
    every step's manager calls is kept."""

    def __init__(self, manager, trace: List[List[int]], per_step: int,
                 preempt_every: int = 0, abort_every: int = 0, keep_going=None,
                 model_ms: float = 0.0, reset_every: int = 0, each_step=None):
        from .vllm_harness import chained_keys

        self.m, self.per_step = manager, per_step
        # Every request's keys, built before the run (vLLM builds a
        # request's block hashes as it arrives, outside the manager).
        self.keys = [chained_keys(ids) for ids in trace]
        self.preempt_every, self.abort_every = preempt_every, abort_every
        self.keep_going = keep_going  # called every step with the step number; False stops
        # The model's forward pass between build_connector_meta and
        # update_connector_output: wall time the engine spends outside the
        # manager (not counted in a step's time), as a GPU step would.
        self.model_s = model_ms / 1000.0
        # reset_cache between steps every reset_every steps (0: never), as
        # vLLM's scheduler does it: finished requests not yet signalled are
        # signalled, jobs in flight are dropped (their completions never
        # come). each_step(step) is called between steps (checks).
        self.reset_every, self.each_step = reset_every, each_step
        self.resets = 0
        self.step_ns: List[int] = []
        self.looked = self.hit = self.deferred = self.store_full = 0
        self.requests = self.aborted = self.preempted = self.steps = self.scheduled = 0
        self._was_preempted: set = set()

    def _requests(self):
        from vllm.v1.kv_offload.base import ReqContext

        n = 0
        while True:
            for keys in self.keys:
                rid = f"r{n}"
                n += 1
                ctx = ReqContext(req_id=rid)
                for i, k in enumerate(keys):
                    ctx.set_offload_key_position(k, (i + 1) * 512)
                yield ctx, keys
            if self.keep_going is None:
                return

    def run(self) -> None:
        for _ in self.steps_one_by_one():
            pass

    def steps_one_by_one(self):
        """The replay, yielding after each step (two replays interleaved
        step by step see the same machine noise)."""
        from vllm.v1.kv_offload import base

        LookupResult = base.LookupResult
        end_context = getattr(base, "ScheduleEndContext", None)  # NB: not in every vLLM

        m = self.m
        source = self._requests()
        waiting: List[tuple] = []          # (ctx, keys): admitted, not scheduled yet
        store_next: List[tuple] = []       # (ctx, keys): computed this step, stored at the next meta
        finish_next: List[object] = []     # ctx: finished at the next step
        finish_now: List[object] = []      # ctx: finished, signalled at this step's meta
        stores_done_next: List[tuple] = [] # (ctx, keys): store jobs completing at the next update
        rescan: Dict[int, List[tuple]] = {}  # step → preempted requests scanning again
        exhausted = False
        step = 0
        while True:
            if self.keep_going is not None and not self.keep_going(step):
                exhausted = True
            busy = waiting or store_next or finish_next or finish_now or stores_done_next or rescan
            if exhausted and not busy:
                break
            # The step's new requests, built outside the timed window (the
            # engine builds them, not the manager).
            incoming = []
            while not exhausted and len(incoming) < self.per_step:  # deferred requests do not take a new one's place
                nxt = next(source, None)
                if nxt is None:
                    exhausted = True
                    break
                incoming.append(nxt)
            t0 = time.perf_counter_ns()
            # -- schedule(): lookups, loads
            admitted, waiting = waiting + rescan.pop(step, []), []
            new_ids = []
            for ctx, keys in incoming:
                self.requests += 1
                m.on_new_request(ctx)
                if self.abort_every and self.requests % self.abort_every == 0:
                    m.on_request_finished(ctx)  # aborted before it was scheduled
                    self.aborted += 1
                    continue
                admitted.append((ctx, keys))
            loads = []
            scheduled = []
            for ctx, keys in admitted:
                hits, deferred = 0, False
                for k in keys:
                    r = m.lookup(k, ctx)
                    if r is LookupResult.HIT:
                        hits += 1
                    elif r is LookupResult.MISS:
                        break
                    else:  # RETRY, HIT_PENDING: deferred, the scan goes on
                        deferred = True
                if deferred:
                    self.deferred += 1
                    waiting.append((ctx, keys))
                    continue
                self.looked += len(keys)
                self.hit += hits
                if hits:
                    m.prepare_load(keys[:hits], ctx)
                    loads.append((ctx, keys[:hits]))
                scheduled.append((ctx, keys, hits))
                new_ids.append(ctx.req_id)
            # -- build_connector_meta(): on_schedule_end, stores, finished requests
            preempted = []
            for ctx, keys, hits in scheduled:
                self.scheduled += 1
                if (self.preempt_every and ctx.req_id not in self._was_preempted
                        and self.scheduled % self.preempt_every == 0):
                    self._was_preempted.add(ctx.req_id)
                    preempted.append(ctx.req_id)
                    rescan.setdefault(step + 2, []).append((ctx, keys))
                    self.preempted += 1
            m.on_schedule_end(end_context(new_req_ids=new_ids, preempted_req_ids=preempted)
                              if end_context else None)
            for ctx, keys in store_next:
                out = m.prepare_store(keys, ctx)
                if out is None:
                    self.store_full += 1
                elif out.keys_to_store:
                    stores_done_next.append((ctx, out.keys_to_store))
            store_next = []
            for ctx in finish_now:
                m.on_request_finished(ctx)
            finish_now, finish_next = finish_next, []
            for ctx, keys, hits in scheduled:
                if hits < len(keys):
                    store_next.append((ctx, keys[hits:]))
                if ctx.req_id not in preempted:
                    finish_next.append(ctx)
                    self._was_preempted.discard(ctx.req_id)
            # -- the model runs (not the manager's time)
            t1 = time.perf_counter_ns()
            if self.model_s:
                time.sleep(self.model_s)
            t2 = time.perf_counter_ns()
            # -- update_connector_output(): loads of this step, stores of the last
            for ctx, keys in loads:
                m.complete_load(keys, ctx)
            done, stores_done_next = stores_done_next, []
            for ctx, keys in done:
                m.complete_store(keys, ctx)
            self.step_ns.append(time.perf_counter_ns() - t0 - (t2 - t1))
            step += 1
            if self.reset_every and step % self.reset_every == 0:
                for ctx in finish_now:
                    m.on_request_finished(ctx)
                finish_now = []
                stores_done_next = []  # vLLM drops the jobs in flight
                m.reset_cache()
                self.resets += 1
            if self.each_step is not None:
                self.each_step(step)
            self.steps = step
            yield step

    def summary(self) -> Dict[str, float]:
        us = sorted(ns / 1000 for ns in self.step_ns)
        return {
            "hit_rate": self.hit / self.looked if self.looked else 0.0,
            "steps": len(us),
            "step_p50_us": statistics.median(us),
            "step_p99_us": us[min(len(us) - 1, int(len(us) * 0.99))],
            "deferred_scans": self.deferred,
            "store_full": self.store_full,
        }


class Reach:
    """Capacity a prefix lookup can reach (issue 29; Go: tools/sim/reach.go).
    A lookup stops at its first MISS, so a held block whose parent is not
    held can never be hit. Every ``every`` steps of a replay (its
    ``each_step``), ``held()`` gives the blocks its cache holds; the sample
    counts those with an ancestor not held. A block's parent is the previous
    key of the replay's own chained keys (the first of a prompt is a root).
    ``fraction`` is the share of held blocks that were unreachable, over all
    samples (as ``kvtier sim``'s ``unreachable_capacity_fraction``)."""

    def __init__(self, replay: "Replay", held, every: int = 50):
        self.replay, self.held, self.every = replay, held, every
        self.parent: Dict[bytes, bytes] = {}
        self.known: List[bytes] = []  # every key of the requests admitted so far, once
        self._noted = 0
        self.samples = self.held_sum = self.dead = 0

    def _note(self) -> None:
        # NB: the replay admits its trace in order (no keep_going here).
        upto = min(self.replay.requests, len(self.replay.keys))
        parent, known = self.parent, self.known
        for keys in self.replay.keys[self._noted:upto]:
            for i, k in enumerate(keys):
                if k not in parent:
                    parent[k] = keys[i - 1] if i else None
                    known.append(k)
        self._noted = upto

    def each_step(self, step: int) -> None:
        if self.every and step % self.every == 0:
            self._note()
            self.sample(self.held(self.known))

    def sample(self, held) -> None:
        held = set(held)
        parent = self.parent
        ok: Dict[bytes, bool] = {}
        dead = 0
        for k in held:
            # Up the chain to a root, a block not held, or one already settled.
            path, v = [], True
            while True:
                if k in ok:
                    v = ok[k]
                    break
                path.append(k)
                p = parent.get(k)
                if p is None:
                    v = True
                    break
                if p not in held:
                    v = False
                    break
                k = p
            for x in path:  # every block on the way shares the answer
                ok[x] = v
        for k in held:
            if not ok[k]:
                dead += 1
        self.samples += 1
        self.held_sum += len(held)
        self.dead += dead

    @property
    def fraction(self) -> float:
        return self.dead / self.held_sum if self.held_sum else 0.0


def native_held(m):
    """The blocks vLLM's CPUOffloadingManager holds, readable (a store in
    flight is not yet): its cache policy's chunks."""
    chunks = getattr(m._policy, "chunks", None)
    if chunks is not None:  # LRU
        return lambda known: [k for k, c in chunks.items() if c.is_ready]
    get = m._policy.get  # any policy: ask it about every key seen

    def held(known):
        out = []
        for k in known:
            c = get(k)
            if c is not None and c.is_ready:
                out.append(k)
        return out
    return held


def kvtier_held(mgr, stray: List[int]):
    """The blocks kvtierd holds in CPU memory, readable (the bench runs no
    secondary tier): the keys seen so far whose fingerprint is among the
    entries of its residency index's CPU region, read once per sample (one
    snapshot; the index keeps fingerprints, not keys). ``stray`` gets, per
    sample, how many entries match no key seen (0 unless kvtierd holds
    blocks this replay never stored)."""
    from kvtier_client.residency import STATE_CPU, fingerprint_key

    word: Dict[bytes, int] = {}  # key -> its index entry when held in CPU memory
    mask = ~3 & ((1 << 64) - 1)

    def held(known):
        index = mgr._link.index
        if index is None:
            raise RuntimeError("kvtierd serves no residency index: the reach sample needs one")
        mgr._keys.namespace()
        nsfp = mgr._keys.fp
        for k in known[len(word):]:  # NB: known only grows, in order
            word[k] = (fingerprint_key(nsfp, k) & mask) | STATE_CPU
        entries = {w for w in index.words(0) if w & 3 == STATE_CPU}
        out = [k for k in known if word[k] in entries]
        stray.append(len(entries) - len(out))
        return out
    return held


def cold_trace(trace: List[List[int]]) -> List[List[int]]:
    """The same requests with no block shared: every lookup is a MISS."""
    out, n = [], 1 << 40
    for ids in trace:
        out.append(list(range(n, n + len(ids))))
        n += len(ids)
    return out


def bench_manager(args) -> Dict[str, object]:
    from .vllm_harness import kvtier_manager, native_manager

    trace = read_trace(args.trace, args.limit)
    if args.cold:
        trace = cold_trace(trace)
    page = 4096  # bytes per block: the manager path never touches them
    order = dict(per_step=args.per_step, preempt_every=args.preempt_every, abort_every=args.abort_every,
                 model_ms=args.model_ms)
    native = Replay(native_manager(args.cpu_blocks, page_bytes=page), trace, **order)
    # Capacity a prefix lookup can reach, sampled between steps (outside
    # their timed windows).
    native_reach = Reach(native, native_held(native.m), args.reach_every)
    native.each_step = native_reach.each_step
    binary = kvtierd_binary(args.repo)
    with kvtierd(binary, page, args.cpu_blocks, transport=args.transport) as addr:
        mgr = kvtier_manager(addr, page_bytes=page)
        blocking_at_start = mgr.blocking_calls  # the session's first credit grant
        kv = Replay(mgr, trace, **order)
        stray: List[int] = []
        kv_reach = Reach(kv, kvtier_held(mgr, stray), args.reach_every)
        kv.each_step = kv_reach.each_step
        if args.gc_freeze:
            # As vLLM's EngineCore does once started (freeze_gc_heap): what
            # exists before serving is out of the collector's way. Here that
            # is mostly the trace, which a real engine never holds.
            gc.collect()
            gc.freeze()
        # NB: interleaved step by step, so that both replays' steps see the
        # same machine (this box's noise moved the sequential ratio ±0.2).
        both = [native.steps_one_by_one(), kv.steps_one_by_one()]
        while both:
            for it in list(both):
                if next(it, None) is None:
                    both.remove(it)
        blocking = mgr.blocking_calls - blocking_at_start
        refused = mgr.refused_loads + mgr.refused_stores + mgr.refused_commits
        fallbacks = {"prepare_store": mgr.store_fallbacks, "prepare_load": mgr.load_fallbacks}
        mgr.shutdown()
    n, k = native.summary(), kv.summary()
    return {
        "requests": len(trace),
        "cold": bool(args.cold),
        "transport": args.transport,
        "cpu_blocks": args.cpu_blocks,
        "per_step": args.per_step,
        "model_ms": args.model_ms,
        "native_hit_rate": round(n["hit_rate"], 4),
        "kvtier_hit_rate": round(k["hit_rate"], 4),
        "native_step_p50_us": round(n["step_p50_us"], 1),
        "native_step_p99_us": round(n["step_p99_us"], 1),
        "kvtier_step_p50_us": round(k["step_p50_us"], 1),
        "kvtier_step_p99_us": round(k["step_p99_us"], 1),
        "step_ratio": round(k["step_p50_us"] / n["step_p50_us"], 2),
        "step_ratio_p99": round(k["step_p99_us"] / n["step_p99_us"], 2),
        "blocking_calls_per_step": round(blocking / max(1, k["steps"]), 4),
        "kvtier_blocking_calls": blocking,
        "kvtier_blocking_by_call": fallbacks,
        "kvtier_steps": k["steps"],
        "native_steps": n["steps"],
        "kvtier_deferred_scans": k["deferred_scans"],
        "native_deferred_scans": n["deferred_scans"],
        "native_store_full": n["store_full"],
        "kvtier_store_full": k["store_full"],
        "kvtier_refused_calls": refused,
        "preempted": kv.preempted,
        "aborted": kv.aborted,
        # Held blocks whose chain to the root is broken (no lookup can reach
        # them), every reach_every steps, over the run (kvtier sim's figure).
        "native_unreachable_capacity_fraction": round(native_reach.fraction, 4),
        "kvtier_unreachable_capacity_fraction": round(kv_reach.fraction, 4),
        "reach_every": args.reach_every,
        "native_reach_samples": native_reach.samples,
        "kvtier_reach_samples": kv_reach.samples,
        "native_held_blocks_mean": round(native_reach.held_sum / max(1, native_reach.samples)),
        "kvtier_held_blocks_mean": round(kv_reach.held_sum / max(1, kv_reach.samples)),
        # kvtierd's index entries beyond the replay's keys (0: every block
        # it holds was sampled).
        "kvtier_reach_stray_blocks_max": max(stray, default=0),
    }


# -- a node cache shared by N engines ----------------------------------------

TRACE_BLOCK_TOKENS = 512  # the conversation trace's hash block (Mooncake's release)


def route(trace: List[List[int]], engines: int, routing: str) -> List[List[List[int]]]:
    """The trace's requests spread over engines: round-robin, or by session
    (its first two blocks: the shared system prompt and the conversation's
    first turn, the trace's stand-in for a session id; a prefix-affinity
    router sends a conversation's turns to one engine)."""
    out: List[List[List[int]]] = [[] for _ in range(engines)]
    for i, ids in enumerate(trace):
        if routing == "round_robin":
            e = i % engines
        else:
            e = hash(tuple(ids[:2])) % engines
        out[e].append(ids)
    return out


class _Restarted:
    """An engine that restarts once, halfway through its requests: its
    first half is replayed through one manager, the second through a new
    one (make_manager() called again), as a restarted vLLM process would."""

    def __init__(self, make_manager, requests: List[List[int]], **order):
        half = len(requests) // 2
        self.make, self.halves, self.order = make_manager, [requests[:half], requests[half:]], order
        self.replays: List[Replay] = []

    def steps_one_by_one(self):
        for part in self.halves:
            if self.replays:
                getattr(self.replays[-1].m, "shutdown", lambda: None)()
            r = Replay(self.make(), part, **self.order)
            self.replays.append(r)
            yield from r.steps_one_by_one()


def _interleave(replays) -> None:
    """Steps every replay one step at a time, round-robin, to the end."""
    its = [r.steps_one_by_one() for r in replays]
    while its:
        for it in list(its):
            if next(it, None) is None:
                its.remove(it)


def _totals(replays) -> Dict[str, float]:
    looked = hit = 0
    for r in replays:
        for x in getattr(r, "replays", [r]):
            looked, hit = looked + x.looked, hit + x.hit
    return {"hit_rate": round(hit / looked, 4) if looked else 0.0,
            "recomputed_tokens": (looked - hit) * TRACE_BLOCK_TOKENS}


def share_case(binary: str, trace: List[List[int]], capacity: int, engines: int, routing: str,
               restart: bool, transport: str, per_step: int,
               store_credit: Optional[int] = None) -> Dict[str, object]:
    """One configuration, native and kvtier in the same run: N native
    managers of capacity // N blocks each, against N kvtier managers sharing
    one kvtierd of capacity blocks; with restart, engine 0 restarts halfway
    through its requests (a new native manager starts empty; a new kvtier
    manager finds the node's cache). store_credit is each kvtier manager's
    kvtier_store_credit (None: the connector's default): slots kvtierd
    keeps free for an engine's stores come out of the shared capacity."""
    from .vllm_harness import kvtier_manager, native_manager

    extra = {} if store_credit is None else {"kvtier_store_credit": store_credit}

    page = 4096
    parts = route(trace, engines, routing)
    order = dict(per_step=per_step, preempt_every=0, abort_every=0, model_ms=0.0)

    def engine(make, i):
        if restart and i == 0:
            return _Restarted(make, parts[i], **order)
        return Replay(make(), parts[i], **order)

    native = [engine(lambda: native_manager(max(1, capacity // engines), page_bytes=page), i)
              for i in range(engines)]
    _interleave(native)
    # NB: vLLM's own manager of the whole capacity shared by the N engines:
    # what one shared LRU costs or gains on this trace against partitions,
    # apart from anything kvtier does (a restart keeps it, as kvtierd's:
    # the restarted engine's shutdown of it is vLLM's no-op).
    one = native_manager(capacity, page_bytes=page)
    shared = [engine(lambda: one, i) for i in range(engines)]
    _interleave(shared)
    with kvtierd(binary, page, capacity, transport=transport) as addr:
        kv = [engine(lambda: kvtier_manager(addr, page_bytes=page, extra=extra), i) for i in range(engines)]
        _interleave(kv)
        for r in kv:
            for x in getattr(r, "replays", [r])[-1:]:
                x.m.shutdown()
    n, sh, k = _totals(native), _totals(shared), _totals(kv)
    return {"engines": engines, "routing": routing, "restart": restart, "store_credit": store_credit,
            "native_hit_rate": n["hit_rate"], "kvtier_hit_rate": k["hit_rate"],
            "native_shared_hit_rate": sh["hit_rate"],
            "native_recomputed_tokens": n["recomputed_tokens"],
            "native_shared_recomputed_tokens": sh["recomputed_tokens"],
            "kvtier_recomputed_tokens": k["recomputed_tokens"],
            "recomputed_ratio": round(k["recomputed_tokens"] / max(1, n["recomputed_tokens"]), 4),
            "shared_native_ratio": round(sh["recomputed_tokens"] / max(1, n["recomputed_tokens"]), 4),
            "kvtier_vs_shared_native": round(k["recomputed_tokens"] / max(1, sh["recomputed_tokens"]), 4)}


def mixed_case(binary: str, trace: List[List[int]], capacity: int, transport: str, per_step: int,
               pages: Tuple[int, int] = (4096, 8192), first_share: int = 1,
               in_turn: bool = False) -> Dict[str, object]:
    """Two models whose blocks differ in size (pages, bytes per block), the
    trace split between them by session (first_share of every
    first_share + 1 sessions to the first model): their two engines on one
    kvtierd whose pool is capacity blocks of the first size (--block-bytes;
    the second size is served from the same budget), against two native
    tiers of half that memory each, in the same run. in_turn: the first
    model's engine runs its requests, then goes idle while the second runs
    its own (a model busy while another is idle), instead of both at
    once."""
    from .vllm_harness import kvtier_manager, native_manager

    spread = route(trace, first_share + 1, "by_session")
    parts = [[ids for part in spread[:first_share] for ids in part], spread[first_share]]
    order = dict(per_step=per_step, preempt_every=0, abort_every=0, model_ms=0.0)
    memory = capacity * pages[0]
    run = (lambda rs: [_interleave([r]) for r in rs]) if in_turn else _interleave
    native = [Replay(native_manager(max(1, memory // 2 // p), page_bytes=p, model=f"model-{i}"), parts[i], **order)
              for i, p in enumerate(pages)]
    run(native)
    with kvtierd(binary, pages[0], capacity, transport=transport) as addr:
        kv = [Replay(kvtier_manager(addr, page_bytes=p, model=f"model-{i}"), parts[i], **order)
              for i, p in enumerate(pages)]
        run(kv)
        for r in kv:
            r.m.shutdown()
    n, k = _totals(native), _totals(kv)
    return {"engines": 2, "routing": "by_session", "page_bytes": list(pages), "memory_bytes": memory,
            "first_model_sessions": f"{first_share}/{first_share + 1}", "in_turn": in_turn,
            "native_hit_rate": n["hit_rate"], "kvtier_hit_rate": k["hit_rate"],
            "native_hit_rate_by_model": [_totals([r])["hit_rate"] for r in native],
            "kvtier_hit_rate_by_model": [_totals([r])["hit_rate"] for r in kv],
            "native_recomputed_tokens": n["recomputed_tokens"],
            "kvtier_recomputed_tokens": k["recomputed_tokens"],
            "recomputed_ratio": round(k["recomputed_tokens"] / max(1, n["recomputed_tokens"]), 3),
            # NB: a token of the larger model costs more to recompute; its KV
            # bytes per block stand in for that cost (both models here keep
            # as many tokens per block).
            "recomputed_kv_bytes_ratio": round(_recomputed_bytes(kv, pages) / max(1, _recomputed_bytes(native, pages)), 3)}


def _recomputed_bytes(replays, pages: Tuple[int, int]) -> int:
    """The KV bytes of every block the engines' lookups missed."""
    return sum((r.looked - r.hit) * p for r, p in zip(replays, pages))


def bench_share(args) -> Dict[str, object]:
    trace = read_trace(args.trace, args.limit)
    binary = kvtierd_binary(args.repo)
    cases = [share_case(binary, trace, args.cpu_blocks, n, routing, False, args.transport, args.per_step,
                        args.store_credit)
             for n in args.engines for routing in ("round_robin", "by_session")]
    restarts = [share_case(binary, trace, args.cpu_blocks, n, "by_session", True, args.transport,
                           args.per_step, args.store_credit) for n in args.restart_engines]
    mixed = [mixed_case(binary, trace, args.cpu_blocks, args.transport, args.per_step, first_share=share,
                        in_turn=turn) for share, turn in ((1, False), (3, False), (1, True))]
    return {"requests": len(trace), "capacity_blocks": args.cpu_blocks,
            "block_tokens": TRACE_BLOCK_TOKENS, "transport": args.transport,
            "cases": cases, "restart": restarts, "mixed_models": mixed}


def _workload_args(p, cpu_blocks_help=None) -> None:
    """The workload of a trace-driven command: the trace, how much of it,
    and the node's CPU capacity in blocks."""
    p.add_argument("--trace", default="testdata/traces/conversation_trace.jsonl")
    p.add_argument("--limit", type=int, default=0, help="first N requests (0: all)")
    p.add_argument("--cpu-blocks", type=int, default=20000, help=cpu_blocks_help)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvtier_bench.vllm")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manager", help="scheduler side: kvtier vs vLLM's native manager")
    _workload_args(m)
    m.add_argument("--per-step", type=int, default=16, help="requests admitted per step")
    m.add_argument("--repo", default=".", help="where to build kvtierd if not on PATH")
    m.add_argument("--transport", choices=("ipc", "unix"), default="ipc", help="kvtierd's engine socket")
    m.add_argument("--cold", action="store_true", help="no block shared between requests: every lookup a miss")
    m.add_argument("--model-ms", type=float, default=5.0,
                   help="the forward pass between a step's meta and its update (wall time, not counted)")
    m.add_argument("--preempt-every", type=int, default=50, help="preempt every Nth scheduled request once (0: never)")
    m.add_argument("--abort-every", type=int, default=100, help="abort every Nth new request unscheduled (0: never)")
    m.add_argument("--reach-every", type=int, default=50,
                   help="sample the capacity a prefix lookup can reach every N steps (0: never)")
    m.add_argument("--no-gc-freeze", dest="gc_freeze", action="store_false",
                   help="leave the trace in the garbage collector's generations (vLLM freezes its start-up heap)")
    m.add_argument("--json", action="store_true")
    sh = sub.add_parser("share", help="N engines: one shared kvtierd vs N partitioned native caches")
    _workload_args(sh, "the node's CPU capacity, all engines together")
    sh.add_argument("--engines", type=int, nargs="+", default=[2, 4, 8])
    sh.add_argument("--restart-engines", type=int, nargs="*", default=[2, 4, 8],
                    help="engine counts of the restart case (engine 0 restarts halfway)")
    sh.add_argument("--per-step", type=int, default=4, help="requests admitted per step, per engine")
    sh.add_argument("--repo", default=".")
    sh.add_argument("--transport", choices=("ipc", "unix"), default="ipc")
    sh.add_argument("--store-credit", type=int, default=None,
                    help="each kvtier manager's kvtier_store_credit (default: the connector's, 64)")
    sh.add_argument("--json", action="store_true")
    en = sub.add_parser("engines", help="N engine processes on one kvtierd: steps, step ratios, kvtierd CPU per call")
    _workload_args(en, "the node's CPU capacity, all engines together")
    en.add_argument("--engines", type=int, nargs="+", default=[1, 2, 4, 8])
    en.add_argument("--rounds", type=int, default=1,
                    help="run every N this many times, interleaved; the summary takes each figure's median")
    en.add_argument("--per-step", type=int, default=16, help="requests admitted per step, per engine")
    en.add_argument("--preempt-every", type=int, default=50)
    en.add_argument("--abort-every", type=int, default=100)
    en.add_argument("--repo", default=".")
    en.add_argument("--transport", choices=("ipc", "unix"), default="unix")
    en.add_argument("--json", action="store_true")
    ep = sub.add_parser("engine-part", help=argparse.SUPPRESS)  # one engine process of `engines`
    ep.add_argument("--address", required=True)
    ep.add_argument("--part", type=int, required=True)
    ep.add_argument("--of", type=int, required=True)
    for a, d in (("--trace", None), ("--limit", 0), ("--cpu-blocks", 20000), ("--per-step", 16),
                 ("--preempt-every", 50), ("--abort-every", 100)):
        ep.add_argument(a, default=d, type=type(d) if d is not None else str)
    t = sub.add_parser("ttft", help="engine side: TTFT reloaded from kvtier vs recomputed")
    t.add_argument("--prefix-tokens", type=int, default=2048)
    t.add_argument("--repeats", type=int, default=3)
    t.add_argument("--repo", default=".")
    t.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "manager":
        out = bench_manager(args)
    elif args.cmd == "share":
        out = bench_share(args)
    elif args.cmd == "engines":
        from .vllm_engines import bench_engines

        out = bench_engines(args)
    elif args.cmd == "engine-part":
        from .vllm_engines import engine_part

        print(json.dumps(engine_part(args)))
        return 0
    else:
        from .vllm_ttft import bench_ttft

        out = bench_ttft(args)
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:34} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

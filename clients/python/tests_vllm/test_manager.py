"""kvtier's manager driven the way vLLM's scheduler drives it (per-key
lookup scans, prepare/complete, touch, request finished, one
on_schedule_end per step), against a real kvtierd; and beside vLLM's native
CPUOffloadingManager at the same capacity, call for call (a differential
test). Where kvtier deliberately differs, the difference is named here and
in the README; every other answer must be identical."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Dict, List

import pytest

from conftest import needs_vllm

pytestmark = needs_vllm

CAPACITY = 48  # chunks, both managers
PAGE = 4096


@pytest.fixture
def small_daemon(daemon_factory):
    return daemon_factory(block_bytes=PAGE, pool_bytes=CAPACITY * PAGE)


@dataclass
class Req:
    id: str
    keys: List[bytes]
    ctx: Dict[str, object] = field(default_factory=dict)  # manager name -> ReqContext


def new_request(rid: str, keys, managers):
    from vllm.v1.kv_offload.base import ReqContext

    r = Req(rid, keys)
    for name, m in managers.items():
        ctx = ReqContext(req_id=rid)
        for i, k in enumerate(keys):
            ctx.set_offload_key_position(k, (i + 1) * 32)
        m.on_new_request(ctx)
        r.ctx[name] = ctx
    return r


def drive(managers, seed: int, steps: int = 150):
    """Runs one seeded scheduler-like workload through every manager at
    once; returns, per call, each manager's answer."""
    from kvtier_vllm.harness import chained_keys
    from vllm.v1.kv_offload.base import LookupResult

    rng = random.Random(seed)
    shared = [[rng.randrange(10_000) for _ in range(rng.randrange(1, 10))] for _ in range(12)]
    log: List[tuple] = []
    loads, stores, finished = [], [], []
    n = 0
    for step in range(steps):
        for r, keys in loads:
            for name, m in managers.items():
                m.complete_load(keys, r.ctx[name])
        for r, per, ok in stores:
            for name, m in managers.items():
                if per[name]:
                    m.complete_store(per[name], r.ctx[name], ok)
        for r in finished:
            for name, m in managers.items():
                m.on_request_finished(r.ctx[name])
        loads, stores, finished = [], [], []
        for _ in range(rng.randrange(1, 4)):
            n += 1
            blocks = rng.choice(shared) + [rng.randrange(10_000, 10**9)
                                           for _ in range(rng.randrange(0, 6))]
            r = new_request(f"r{n}", chained_keys(blocks), managers)
            # the prefix scan: per key, stop at the first MISS
            hits = {name: 0 for name in managers}
            for name, m in managers.items():
                for k in r.keys:
                    res = m.lookup(k, r.ctx[name])
                    log.append(("lookup", step, r.id, r.keys.index(k), name, res.name))
                    if res is not LookupResult.HIT:
                        break
                    hits[name] += 1
            for name, m in managers.items():
                if hits[name]:
                    m.prepare_load(r.keys[:hits[name]], r.ctx[name])
                    m.touch(r.keys[:hits[name]], r.ctx[name])
            per = {}
            for name, m in managers.items():
                todo = r.keys[hits[name]:]
                out = m.prepare_store(todo, r.ctx[name]) if todo else None
                per[name] = list(out.keys_to_store) if out else []
                log.append(("store", step, r.id, name,
                            None if out is None else (len(out.keys_to_store),
                                                      sorted(out.evicted_keys))))
            if hits[next(iter(managers))]:
                loads.append((r, r.keys[:hits[next(iter(managers))]]))
            stores.append((r, per, rng.random() > 0.1))
            finished.append(r)
        for m in managers.values():
            m.on_schedule_end(None)
    return log


def by_call(log):
    out: Dict[tuple, Dict[str, object]] = {}
    for entry in log:
        if entry[0] == "lookup":
            _, step, rid, idx, name, res = entry
            out.setdefault(("lookup", step, rid, idx), {})[name] = res
        else:
            _, step, rid, name, res = entry
            out.setdefault(("store", step, rid), {})[name] = res
    return out


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_same_answers_as_vllms_native_manager(small_daemon, seed):
    from kvtier_vllm.harness import kvtier_manager, native_manager

    native = native_manager(CAPACITY, page_bytes=PAGE)
    kv = kvtier_manager(small_daemon.address, page_bytes=PAGE)
    try:
        calls = by_call(drive({"native": native, "kvtier": kv}, seed))
    finally:
        kv.shutdown()
    differ = {c: a for c, a in calls.items() if len(set(map(repr, a.values()))) > 1}
    lookups = sum(1 for c in calls if c[0] == "lookup")
    stores = sum(1 for c in calls if c[0] == "store")
    assert lookups > 200 and stores > 200
    assert not differ, f"{len(differ)} of {len(calls)} calls differ, e.g. " + \
        repr(sorted(differ.items())[:5])

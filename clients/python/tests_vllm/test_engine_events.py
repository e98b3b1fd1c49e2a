"""KV events a router reads when vLLM runs with kvtier: a real engine
(vLLM's CPU build) publishing its own KV events, and a kvtierd learning the
token ids of the blocks vLLM stores in it from them (docs/VLLM.md,
"Events"). Decoded with vLLM's own KVEventBatch."""

from __future__ import annotations

import time

import pytest

from conftest import needs_vllm
from test_events import free_port, replay_all

pytestmark = needs_vllm


def decoded(addr: str):
    """Every replayed event, in order, as vLLM's own decoder reads it."""
    import msgspec
    from vllm.distributed.kv_events import KVEventBatch

    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    for _, payload in replay_all(addr):
        yield from decoder.decode(payload).events


def vllm_hash_chain(blocks: dict) -> dict:
    """vLLM's own block hash (sha256, its default, from its default root)
    of every block in ``blocks`` ({int hash: (int parent or None, token
    ids)}), computed along its parents: {int hash: full hash}."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils as kcu

    kcu.init_none_hash(sha256)
    full = {}

    def of(h):
        if h not in full:
            parent, toks = blocks[h]
            full[h] = kcu.hash_block_tokens(sha256, kcu.NONE_HASH if parent is None else of(parent),
                                            toks)
        return full[h]

    for h in blocks:
        of(h)
    return full


@pytest.mark.parametrize("transport", ["ipc", "unix"])
def test_every_block_vllm_offloaded_is_announced_with_its_token_ids_in_each_medium(
        daemon_factory, engine_factory, models, tmp_path, transport):
    """A real engine with vLLM's KV events on (its GPU prefix cache on, as
    by default) and a kvtierd with an fs tier, learning from vLLM's events
    (--events-learn-from): a subscriber to both streams, decoding with
    vLLM's own KVEventBatch, sees every block kvtier holds announced once
    per medium it is in (vLLM announces GPU, kvtierd CPU and STORAGE), with
    token ids that hash, by vLLM's own hash function along their parents, to
    the announced block hash; CPU evictions are announced as removals."""
    import json
    import random

    from kvtier_client import Client

    vpub, vrep, pub, rep = (free_port() for _ in range(4))
    slots = 24
    cfg = tmp_path / "kvtierd.yaml"
    # NB: learn_wait generous: a loaded CI box may delay vLLM's publisher
    # thread; an announcement without token ids would fail this test.
    cfg.write_text(f"secondary_tiers:\n  - {{kind: fs, root: {tmp_path / 'fs'}, capacity: 64MiB}}\n"
                   "events:\n  learn_wait: 20s\n")
    # model a's block: 2 layers x K,V x 32 tokens x 2 KV heads x 32 dims x
    # 2 bytes = 16 KiB. A pool sized in larger slots would give its own
    # geometry more than 24 slots of the engine's size (and no eviction).
    block_bytes = 16 << 10
    d = daemon_factory(block_bytes=block_bytes, pool_bytes=slots * block_bytes, config=str(cfg),
                       transport=transport,
                       extra_args=["--events-endpoint", f"tcp://127.0.0.1:{pub}",
                                   "--events-replay", f"tcp://127.0.0.1:{rep}",
                                   "--events-learn-from", f"tcp://127.0.0.1:{vpub}"])
    events_cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "vllm",
                  # NB: vLLM binds an endpoint with a wildcard host and connects to others
                  "endpoint": f"tcp://*:{vpub}", "replay_endpoint": f"tcp://*:{vrep}"}
    e = engine_factory(models["a"], d.address, "--gpu-prefix-cache", "--kv-events",
                       json.dumps(events_cfg))
    rng = random.Random(5)
    shared = [rng.randrange(1, 1000) for _ in range(64)]
    for i in range(8):  # 8 prompts of 5 blocks through a 24-slot pool: CPU evictions
        tail = [rng.randrange(1, 1000) for _ in range(96)]
        e.generate([(shared if i % 2 else []) + tail + ([] if i % 2 else shared)], max_tokens=4)
    d.wait_quiet(what="after the engine's work")

    # kvtierd publishes within batch windows and cascades to fs behind the
    # engine: replay until its events have caught up with what it holds.
    deadline = time.monotonic() + 60
    while True:
        with Client(d.address) as c:
            ready = c.stats()["ready"]
        on_disk = d.metrics().get('kvtier_tier_blocks{tier="fs"}', 0)
        live = {"CPU": set(), "STORAGE": set()}
        stored_once = {"CPU": set(), "STORAGE": set()}
        kvtier_blocks, removed, cpu_stores = {}, 0, 0
        for ev in decoded(f"tcp://127.0.0.1:{rep}"):
            if type(ev).__name__ == "BlockStored":
                assert ev.medium in live, ev
                assert ev.block_size == 32 and len(ev.token_ids) == 32 * len(ev.block_hashes), \
                    str({k[len("kvtier_events_"):]: v for k, v in d.metrics().items() if "events" in k})
                parent = ev.parent_block_hash
                for j, h in enumerate(ev.block_hashes):
                    assert h not in live[ev.medium], f"{h} announced twice in {ev.medium}"
                    live[ev.medium].add(h)
                    stored_once[ev.medium].add(h)
                    cpu_stores += ev.medium == "CPU"
                    kvtier_blocks[h] = (parent, tuple(ev.token_ids[32 * j:32 * (j + 1)]))
                    parent = h
            elif type(ev).__name__ == "BlockRemoved":
                for h in ev.block_hashes:
                    assert h in live[ev.medium], f"{h} removed from {ev.medium} before it was stored"
                    live[ev.medium].discard(h)
                    removed += ev.medium == "CPU"
            else:
                pytest.fail(f"nothing cleared the cache in this test: {ev}")
        if len(live["CPU"]) == ready and len(live["STORAGE"]) == on_disk > 0:
            break
        assert time.monotonic() < deadline, (ready, on_disk, {m: len(v) for m, v in live.items()})
        time.sleep(0.05)  # NB: polling a process's replay buffer; nothing to wait on

    topics: set = set()
    for _ in replay_all(f"tcp://127.0.0.1:{rep}", topics):
        pass
    assert topics == {"vllm"}, "kvtierd announced the engine's blocks under the engine's own topic"
    m = d.metrics()
    assert m["kvtier_events_placeholders_total"] == 0, "every block announced with its token ids"
    assert m["kvtier_events_learned_filled_total"] > 0
    assert removed > 0, "the 24-slot pool evicted, and said so"
    # every block vLLM offloaded (a block evicted and offloaded again, again)
    assert cpu_stores == m["kvtier_stores_total"], (cpu_stores, len(stored_once["CPU"]), m["kvtier_stores_total"])
    assert stored_once["STORAGE"] <= stored_once["CPU"]

    # vLLM's own stream: the GPU medium only (kvtier's media are kvtierd's).
    gpu = {}
    for ev in decoded(f"tcp://127.0.0.1:{vrep}"):
        if type(ev).__name__ == "BlockStored":
            assert ev.medium == "GPU", ev
            parent = ev.parent_block_hash
            for j, h in enumerate(ev.block_hashes):
                gpu[h] = (parent, tuple(ev.token_ids[ev.block_size * j:ev.block_size * (j + 1)]))
                parent = h
    assert set(kvtier_blocks) <= set(gpu), "kvtier holds only blocks vLLM cached"
    full = vllm_hash_chain({**gpu, **kvtier_blocks})
    for h in kvtier_blocks:  # the payload kvtierd announced hashes to the block's hash
        assert int.from_bytes(full[h], "big") & ((1 << 64) - 1) == h

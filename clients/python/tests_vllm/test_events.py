"""kvtierd's KV events read by vLLM's own decoder (``KVEventBatch`` via
msgspec, from the vLLM installed beside the connector): every event is
well-formed, and what the events say is stored minus removed, per medium,
is what kvtierd holds."""

from __future__ import annotations

import hashlib
import socket
import time

import pytest

from conftest import needs_vllm

pytestmark = needs_vllm

BLOCK, SLOTS, TOKENS = 4096, 12, 16
END = (1 << 64) - 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replay_all(addr: str, topics=None):
    """Every buffered batch, from sequence 0, through the replay ROUTER, read
    as vLLM's own publisher answers (since 0.32: ["", topic, seq, payload],
    then ["", "", END_SEQ, ""]) — kvtierd's and vLLM's alike."""
    import zmq

    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(addr)
    try:
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            assert dealer.poll(10_000), "replay stalled"
            empty, topic, seq, payload = dealer.recv_multipart()
            seq = int.from_bytes(seq, "big")
            if seq == END:
                return
            if topics is not None:
                topics.add(topic.decode())
            yield seq, payload
    finally:
        dealer.close()


def as_event_hash(h: bytes) -> int:
    return int.from_bytes(h[-8:], "big")  # hash_format int (docs/PROTOCOL.md)


def test_vllms_decoder_reads_every_event_and_they_add_up_to_the_inventory(
        daemon_factory, tmp_path):
    from kvtier_client import HIT, Client, Request

    pub, rep = free_port(), free_port()
    cfg = tmp_path / "fs.yaml"
    cfg.write_text(f"secondary_tiers:\n  - {{kind: fs, root: {tmp_path / 'fs'}, capacity: 64MiB}}\n")
    d = daemon_factory(block_bytes=BLOCK, pool_bytes=SLOTS * BLOCK, config=str(cfg),
                       extra_args=["--events-endpoint", f"tcp://127.0.0.1:{pub}",
                                   "--events-replay", f"tcp://127.0.0.1:{rep}"])
    keys = []
    with Client(d.address) as c:
        for r in range(10):  # 10 chains of 3 blocks through a 12-slot pool: evictions
            parent = hashlib.sha256(b"root").digest()
            chain = []
            for i in range(3):
                parent = hashlib.sha256(parent + bytes([r, i])).digest()
                chain.append(("ns", parent, 0))
            req = Request(f"w{r}", tokens=list(range(3 * TOKENS)), block_size=TOKENS,
                          kv_cache_spec_kind="full_attention", session_id=f"s{r % 2}")
            plan = c.prepare_store(req, chain)
            c.complete_store(req, plan.to_store, True)
            c.request_finished(req)
            keys += chain
            # NB: each chain's cascades land before the next chain's stores
            # evict it: a cascade whose block was evicted first is dropped
            # (by design), which a loaded machine makes likely.
            deadline = time.monotonic() + 30
            while d.metrics().get('kvtier_tier_blocks{tier="fs"}', 0) < len(keys):
                assert time.monotonic() < deadline, "cascades never landed"
                time.sleep(0.02)
        held = c.lookup(Request("probe"), keys, prefix=False)
        c.request_finished(Request("probe"))
        cpu_now = {as_event_hash(k[1]) for k, st in zip(keys, held) if st == HIT}
        ready = c.stats()["ready"]

    # The hub publishes in batch windows, so the last cascades' events may
    # still be gathering when the inventory is read: replay until the events
    # have caught up with it (or a deadline says they never will).
    want_storage = {as_event_hash(k[1]) for k in keys}
    want_announced = {"stored": 2 * len(keys), "removed": len(keys) - SLOTS}
    deadline = time.monotonic() + 10
    while True:
        live, announced = replayed_inventory(f"tcp://127.0.0.1:{rep}")
        if live["STORAGE"] == want_storage and announced == want_announced:
            break
        assert time.monotonic() < deadline, (announced, {m: len(v) for m, v in live.items()})
        time.sleep(0.02)
    assert live["CPU"] == cpu_now and len(cpu_now) == ready == SLOTS


def replayed_inventory(addr: str):
    """What the replayed events say each medium holds, and how many hashes
    were announced stored and removed (hashes, not events: the hub coalesces
    events), checking each event as vLLM's own decoder reads it."""
    import msgspec
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    live = {"CPU": set(), "STORAGE": set()}
    announced = {"stored": 0, "removed": 0}
    for _, payload in replay_all(addr):
        batch = decoder.decode(payload)  # raises on anything vLLM would not accept
        for e in batch.events:
            if isinstance(e, BlockStored):
                assert e.medium in live, e
                assert e.block_size == TOKENS
                assert len(e.token_ids) == TOKENS * len(e.block_hashes)
                if e.medium == "CPU":  # what the storing request said (vLLM 0.33 fields)
                    assert e.kv_cache_spec_kind == "full_attention", e
                    assert e.session_id in ("s0", "s1"), e
                announced["stored"] += len(e.block_hashes)
                live[e.medium].update(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                assert e.medium in live, e
                announced["removed"] += len(e.block_hashes)
                live[e.medium].difference_update(e.block_hashes)
            else:
                assert isinstance(e, AllBlocksCleared)
                pytest.fail("nothing cleared the cache in this test")
    return live, announced


"""kvtier's SGLang HiCache backend against a real kvtierd and SGLang's own
classes: its host pools (MHA, MLA; every generic layout), its file backend
(HiCacheFile) as the reference, its failure injector, its page hash chain."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import (HERE, expected_bytes, fill_page, indices, mha_pool, mla_pool, page_bytes_at,
                      storage_config)

from kvtier_client import Client
from kvtier_sglang.backend import KvtierConfigError, KvtierHiCacheStorage, page_bytes
from sglang.srt.mem_cache.hicache_storage import (HiCacheFile, HiCacheStorageExtraInfo,
                                                  HiCacheStorageFailureInjector)
from sglang.srt.mem_cache.utils import get_hash_str

LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


def chain(seed: int, pages: int, page_size: int = 4):
    """SGLang's own page keys (its sha256 chain) for a random prompt."""
    rng = random.Random(seed)
    tokens = [rng.randrange(32000) for _ in range(pages * page_size)]
    keys, prior = [], None
    for i in range(pages):
        prior = get_hash_str(tokens[i * page_size:(i + 1) * page_size], prior)
        keys.append(prior)
    return keys


def seed_of(key: str) -> int:
    return int(key[:12], 16)


def backend(address: str, pool, extra=None, **cfg) -> KvtierHiCacheStorage:
    opts = {"backend_name": "kvtier", "module_path": "kvtier_sglang.backend",
            "class_name": "KvtierHiCacheStorage", "interface_v1": 1,
            "kvtier_address": address, "kvtier_pending_wait_s": 10.0}
    opts.update(extra or {})
    b = KvtierHiCacheStorage(storage_config(opts, layout=pool.layout, **cfg), {})
    b.register_mem_pool_host(pool)
    return b


def store(b, pool, keys, pages, extra_info=None):
    """Fills the host pages with each key's bytes and stores them (v1)."""
    for k, p in zip(keys, pages):
        fill_page(pool, p * pool.page_size, seed_of(k))
    return b.batch_set_v1(keys, indices(pool, pages), extra_info)


def load_check(b, pool, keys, pages):
    """batch_get_v1 into zeroed pages; returns how many came back right."""
    for p in pages:
        pool.get_data_page(p * pool.page_size, flat=False).zero_()
    got = b.batch_get_v1(keys, indices(pool, pages))
    n = 0
    for ok, k, p in zip(got, keys, pages):
        if not ok:
            break
        assert page_bytes_at(pool, p * pool.page_size) == expected_bytes(pool, seed_of(k)), \
            f"page {k[:8]} came back with other bytes"
        n += 1
    return n


# -- round trips, layouts -------------------------------------------------------


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_trip_is_hicache_files_bytes(daemon_factory, tmp_path, kind, layout):
    """Every layout of both pool kinds: pages stored through kvtier come
    back byte for byte, and a slot holds exactly what SGLang's HiCacheFile
    writes to its file for the same page (get_data_page(flat=True))."""
    make = mha_pool if kind == "mha" else mla_pool
    pool = make(layout)
    d = daemon_factory(block_bytes=page_bytes(pool), slots=64)
    b = backend(d.address, pool, mla=kind == "mla")
    keys = chain(1, 6)
    assert store(b, pool, keys, range(6)) == [True] * 6
    assert b.batch_exists(keys) == 6
    assert load_check(b, pool, keys, range(10, 16)) == 6

    f = HiCacheFile(storage_config({"file_storage_path": str(tmp_path / "f")}, mla=kind == "mla",
                                   layout=layout))
    f.register_mem_pool_host(pool)
    for i, k in enumerate(keys):
        assert f.set(k, pool.get_data_page(i * pool.page_size, flat=True))
    job = Client(d.address)
    try:
        st = job.lookup(_req("peek"), b._keys(keys))
        assert st == [1] * 6
        load = job.prepare_load(_req("peek"), b._keys(keys))
        for k, slot in zip(keys, load.slots):
            path = os.path.join(f.file_path, f"{f._get_suffixed_key(k)}.bin")
            with open(path, "rb") as fh:
                assert bytes(job.slot(slot)[:page_bytes(pool)]) == fh.read()
        job.complete_load(_req("peek"), b._keys(keys))
        job.request_finished(_req("peek"))
    finally:
        job.close()
    st = b.get_stats()
    assert st["leases_held"] == 0 and st["exists_round_trips"] == 1
    b.close()


def _req(rid):
    from kvtier_client import Request
    return Request(rid)


def test_exists_answers_the_prefix_with_one_round_trip_and_none_for_a_miss(daemon_factory):
    pool = mha_pool()
    d = daemon_factory(block_bytes=page_bytes(pool), slots=64)
    b = backend(d.address, pool)
    keys = chain(2, 8)
    assert store(b, pool, keys[:3] + keys[4:6], [0, 1, 2, 4, 5]) == [True] * 5
    assert b.get_stats()["set_round_trips"] == 2, "a batch_set_v1: its reservation and its commit"
    rt = b.get_stats()["exists_round_trips"]
    assert b.batch_exists(keys) == 3, "stops at the first page kvtier lacks"
    assert b.get_stats()["exists_round_trips"] == rt + 1
    assert b.batch_exists(chain(3, 8)) == 0
    assert b.get_stats()["exists_round_trips"] == rt + 1, \
        "a first page the residency index lacks costs no round trip"
    # The leased prefix survives other stores filling the pool until the get.
    gets = b.get_stats()["get_round_trips"]
    assert load_check(b, pool, keys[:3], range(20, 23)) == 3
    assert b.get_stats()["get_round_trips"] == gets + 1, "a get of a leased prefix: its pin only"
    assert b.get_stats()["leases_held"] == 0
    b.close()


def test_a_reported_prefix_is_leased_until_the_get(daemon_factory):
    """batch_exists leases what it reports: a writer overfilling the pool
    meanwhile evicts the least recently used pages except those (which are
    the oldest: without the lease they would go first), and batch_get_v1
    finds them; after the get the lease is gone."""
    pool = mha_pool(pages=64)
    slots = 8
    d = daemon_factory(block_bytes=page_bytes(pool), slots=slots)
    reader = backend(d.address, pool)
    writer = backend(d.address, pool)
    keys = chain(4, 3)
    assert store(writer, pool, keys, range(3)) == [True] * 3
    assert reader.batch_exists(keys) == 3
    other = chain(5, slots - 3)
    assert store(writer, pool, other, range(10, 10 + len(other))) == [True] * len(other)
    more = chain(6, 3)
    assert store(writer, pool, more, range(20, 23)) == [True] * 3
    assert writer.batch_exists(other) == 0, "the unleased pages went instead"
    assert d.metrics()["kvtier_pool_slots_leased"] == 3
    assert load_check(reader, pool, keys, range(30, 33)) == 3
    assert d.metrics()["kvtier_pool_slots_leased"] == 0, "released by the get"
    reader.close()
    writer.close()


def test_generic_interface(daemon_factory):
    """get/set/batch_get/batch_set/exists (SGLang's path without interface_v1)."""
    pool = mha_pool()
    d = daemon_factory(block_bytes=page_bytes(pool), slots=32)
    b = backend(d.address, pool, extra={"interface_v1": 0})
    keys = chain(7, 3)
    for i, k in enumerate(keys):
        fill_page(pool, i * pool.page_size, seed_of(k))
    assert b.batch_set(keys, [pool.get_data_page(i * pool.page_size) for i in range(3)])
    assert b.exists(keys[1]) and not b.exists(chain(8, 1)[0])
    got = b.batch_get(keys + chain(8, 1), [pool.get_dummy_flat_data_page() for _ in range(4)])
    assert got[3] is None
    for k, t in zip(keys, got[:3]):
        assert bytes(t.view(torch.uint8).numpy()) == expected_bytes(pool, seed_of(k))
    one = b.get(keys[0], pool.get_dummy_flat_data_page())
    assert bytes(one.view(torch.uint8).numpy()) == expected_bytes(pool, seed_of(keys[0]))
    assert b.set(chain(9, 1)[0], pool.get_data_page(0))
    b.clear()
    assert b.get_stats()["leases_held"] == 0
    b.close()


# -- conformance against HiCacheFile ---------------------------------------------


def _file_get(f, pool, keys, pages):
    """SGLang's controller's generic read of HiCacheFile (_generic_page_get)."""
    data = f.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
    n = 0
    for d, k, p in zip(data, keys, pages):
        if d is None:
            break
        pool.set_from_flat_data_page(p * pool.page_size, d)
        assert page_bytes_at(pool, p * pool.page_size) == expected_bytes(pool, seed_of(k))
        n += 1
    return n


def _file_set(f, pool, keys, pages):
    for k, p in zip(keys, pages):
        fill_page(pool, p * pool.page_size, seed_of(k))
    return f.batch_set(keys, [pool.get_data_page(p * pool.page_size) for p in pages])


@pytest.mark.parametrize("seed", [11, 12])
def test_conformance_with_hicache_file(daemon_factory, tmp_path, seed):
    """Seeded random set / exists / get through kvtier's backend (v1, as
    SGLang's controller calls it with interface_v1) and through SGLang's
    HiCacheFile (its generic path), both bounded to CAPACITY pages (the
    file backend with its LRU evictor at eviction_ratio 1.0: it evicts just
    what a write needs, as kvtier does). Every hit of either must carry the
    page's bytes. Phase 1 never fills the capacity: the two must answer
    every batch_exists alike. Phase 2 stores three times the capacity.

    Where kvtier deliberately differs (phase 2 only): capacity eviction.
    kvtier's pool is shared and leased (a reported prefix is pinned until
    its get), its LRU is touched by loads and lookups, HiCacheFile's by
    reads and rewrites, so under pressure they may keep different pages.
    Both must still report the chain just stored (it fits in the capacity)
    and nothing that was never stored."""
    CAPACITY = 24
    pool = mha_pool(pages=64)
    pb = page_bytes(pool)
    d = daemon_factory(block_bytes=pb, slots=CAPACITY)
    kv = backend(d.address, pool)
    f = HiCacheFile(storage_config({"file_storage_path": str(tmp_path / "f"),
                                    "max_size": CAPACITY * pb, "eviction_ratio": 1.0}))
    f.register_mem_pool_host(pool)
    rng = random.Random(seed)

    def run(phase, chains, ops):
        stored = set()
        for _ in range(ops):
            c = chains[rng.randrange(len(chains))]
            op = rng.random()
            if op < 0.4:
                n = rng.randint(1, len(c))
                assert kv.batch_set_v1(c[:n], _filled(pool, c[:n], range(n))) == [True] * n
                assert _file_set(f, pool, c[:n], range(32, 32 + n))
                stored.update(c[:n])
                assert kv.batch_exists(c[:n]) == n and f.batch_exists(c[:n]) == n, \
                    "the chain just stored fits the capacity: both report it"
                load_check(kv, pool, c[:n], range(n))
            else:
                a, b = kv.batch_exists(c), f.batch_exists(c)
                assert set(c[:a]) <= stored and set(c[:b]) <= stored, "a page never stored"
                if phase == 1:
                    assert a == b, f"prefix lengths differ without eviction: kvtier {a}, file {b}"
                assert load_check(kv, pool, c[:a], range(a)) == a, "a leased prefix failed to load"
                assert _file_get(f, pool, c[:b], range(32, 32 + b)) == b

    # Phase 1: 4 chains of 4 pages (16 < CAPACITY): no eviction anywhere.
    run(1, [chain(seed * 100 + i, 4) for i in range(4)], 60)
    assert kv.get_stats()["leases_held"] == 0
    # Phase 2: 18 chains of 4 pages (72 = 3 x CAPACITY): eviction pressure.
    run(2, [chain(seed * 1000 + i, 4) for i in range(18)], 120)
    assert d.metrics().get("kvtier_pool_slots_leased", 0) == 0, "every lease released"
    kv.close()


def _filled(pool, keys, pages):
    for k, p in zip(keys, pages):
        fill_page(pool, p * pool.page_size, seed_of(k))
    return indices(pool, list(pages))


# -- namespaces ---------------------------------------------------------------


def test_namespaces_keep_engines_apart(daemon_factory):
    """One kvtierd, one page chain: only a backend whose pages are the same
    bytes (model, dtype, layout, page size, TP shard, salt) finds it. MLA
    pages are the same on every TP rank: those share."""
    base = mha_pool()
    d = daemon_factory(block_bytes=4 * page_bytes(base), slots=64)
    keys = chain(21, 4)
    a = backend(d.address, base)
    assert store(a, base, keys, range(4)) == [True] * 4
    same = backend(d.address, mha_pool())
    assert same.batch_exists(keys) == 4 and load_check(same, same.mem_pool_host, keys, range(4)) == 4
    others = {
        "model": backend(d.address, mha_pool(), model="other/model"),
        "dtype": backend(d.address, mha_pool(dtype=torch.float16)),
        "layout": backend(d.address, mha_pool("page_first")),
        "page size": backend(d.address, mha_pool(page_size=8)),
        "tp rank": backend(d.address, mha_pool(), tp_rank=1, tp_size=2),
        "salt": backend(d.address, mha_pool(), extra={"kvtier_namespace_salt": "tenant-b"}),
        "mla": backend(d.address, mla_pool(), mla=True),
    }
    for what, b in others.items():
        assert b.ns != a.ns, what
        assert b.batch_exists(keys) == 0, f"an engine differing in {what} found the pages"
    mla0 = others["mla"]
    assert store(mla0, mla0.mem_pool_host, keys, range(4)) == [True] * 4
    mla1 = backend(d.address, mla_pool(), mla=True, tp_rank=1, tp_size=2)
    assert mla1.ns == mla0.ns and mla1.batch_exists(keys) == 4
    for b in [a, same, mla1, *others.values()]:
        b.close()


def test_refusals_at_attach(daemon_factory):
    """What kvtier cannot serve is refused when SGLang attaches the backend
    (typed, with the fix in the message), never later in a controller thread."""
    pool = mha_pool()
    d = daemon_factory(block_bytes=page_bytes(pool) // 2, slots=16)
    with pytest.raises(KvtierConfigError, match="--block-bytes"):
        backend(d.address, pool)
    with pytest.raises(KvtierConfigError, match="unknown kvtier option"):
        backend(d.address, pool, extra={"kvtier_adress": "x"})
    big = daemon_factory(block_bytes=page_bytes(pool), slots=16)
    b = backend(big.address, pool)
    b.register_mem_host_pool_v2(pool, "kv")
    with pytest.raises(KvtierConfigError, match="hybrid"):
        b.register_mem_host_pool_v2(mla_pool(), "mamba")
    b.close()


# -- two processes, and the fs tier across a restart ---------------------------

CHILD = textwrap.dedent("""
    import os, sys
    sys.path[:0] = [sys.argv[1], os.path.dirname(sys.argv[1])]  # NB: a fresh process: the suite's dir and this tree
    from test_backend import backend, chain, store
    from conftest import mha_pool
    pool = mha_pool()
    b = backend(sys.argv[2], pool)
    keys = chain(int(sys.argv[3]), 6)
    ok = store(b, pool, keys, range(6))
    b.close()
    print("stored", sum(ok), flush=True)
""")


def test_two_processes_share_pages_and_a_restarted_kvtierd_serves_them_from_disk(
        daemon_factory, tmp_path):
    pool = mha_pool()
    pb = page_bytes(pool)
    cfg = tmp_path / "kvtierd.yaml"
    cfg.write_text(f"secondary_tiers:\n  - {{kind: fs, root: {tmp_path / 'fs'}, capacity: 64MiB}}\n")
    d = daemon_factory(block_bytes=pb, slots=32, config=str(cfg))
    child = subprocess.run([sys.executable, "-c", CHILD, HERE, d.address, "31"],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0 and "stored 6" in child.stdout, child.stderr[-3000:]
    keys = chain(31, 6)
    b = backend(d.address, pool)
    assert b.batch_exists(keys) == 6, "another process's pages"
    assert load_check(b, pool, keys, range(10, 16)) == 6
    # Written behind to the fs tier; then a clean restart on the same paths.
    d.wait_metric('kvtier_cascade_written_total{tier="fs"}', 6)
    d.stop()
    assert b.batch_exists(keys) == 0 and b.batch_get_v1(keys, indices(pool, range(6))) == [False] * 6
    d.start()
    assert b.wait_connected(30), "the backend reconnects to the restarted kvtierd"
    assert b.batch_exists(keys) == 6, "the pages, promoted from the fs tier"
    assert load_check(b, pool, keys, range(20, 26)) == 6
    b.close()


# -- faults ---------------------------------------------------------------------


def test_kvtierd_killed_mid_batch(daemon_factory):
    """SIGKILL while batch_set_v1 copies its pages (from inside the copy):
    the batch answers failures and nothing raises; while kvtierd is down
    every call answers as if kvtier were empty; once it is back, the backend
    reconnects and works."""
    pool = mha_pool()
    d = daemon_factory(block_bytes=page_bytes(pool), slots=32)
    b = backend(d.address, pool)
    keys = chain(41, 6)
    real = pool.get_data_page
    calls = {"n": 0}

    def killing(index, flat=True):
        calls["n"] += 1
        if calls["n"] == 3:
            d.kill()  # NB: returns once the process is gone
        return real(index, flat)

    for i, k in enumerate(keys):
        fill_page(pool, i * pool.page_size, seed_of(k))
    pool.get_data_page = killing
    try:
        assert b.batch_set_v1(keys, indices(pool, range(6))) == [False] * 6
    finally:
        del pool.get_data_page
    st = b.get_stats()
    assert (st["set_pages"], st["set_failed"]) == (6, 6), "a failed batch counts its pages, every one failed"
    assert not b.connected()
    assert b.batch_exists(keys) == 0
    assert b.batch_get_v1(keys, indices(pool, range(6))) == [False] * 6
    assert b.batch_set_v1(keys, indices(pool, range(6))) == [False] * 6
    assert b.get(keys[0], pool.get_dummy_flat_data_page()) is None
    assert b.get_stats()["link_lost"] == 1
    d.start()
    assert b.wait_connected(30)
    assert store(b, pool, keys, range(6)) == [True] * 6
    assert b.batch_exists(keys) == 6 and load_check(b, pool, keys, range(10, 16)) == 6

    # Killed between batch_exists (leases) and batch_get_v1.
    assert b.batch_exists(keys) == 6
    d.kill()
    assert b.batch_get_v1(keys, indices(pool, range(6))) == [False] * 6
    d.start()
    assert b.wait_connected(30)
    assert b.batch_exists(keys) == 0, "a new kvtierd holds nothing (no secondary tier)"
    b.close()


def test_failure_injector_over_kvtier(daemon_factory):
    """SGLang's HiCacheStorageFailureInjector (what SGLANG_TEST_HICACHE_
    BACKEND_RANDOM_FAILURE wraps backends in) over kvtier's, seeded: an
    injected failure is a clean miss or refusal; every page a successful
    batch_set_v1 stored reads back right; no lease outlives the run."""
    pool = mha_pool()
    d = daemon_factory(block_bytes=page_bytes(pool), slots=64)
    inner = backend(d.address, pool)
    inj = HiCacheStorageFailureInjector(inner, 0.0, 0.3)
    HiCacheStorageFailureInjector._thread_local.random = random.Random(51)
    rng = random.Random(52)
    stored, failures = set(), 0
    for i in range(60):
        c = chain(500 + rng.randrange(6), 4)
        if rng.random() < 0.5:
            ok = inj.batch_set_v1(c, _filled(pool, c, range(4)))
            failures += ok.count(False) == 4
            if all(ok):
                stored.update(c)
        else:
            n = inj.batch_exists(c, HiCacheStorageExtraInfo(prefix_keys=[]))
            assert set(c[:n]) <= stored
            for p in range(n):
                pool.get_data_page(p * pool.page_size, flat=False).zero_()
            got = inj.batch_get_v1(c[:n], indices(pool, range(n)))
            failures += n > 0 and not any(got)
            for ok, k, p in zip(got, c, range(n)):
                if ok:
                    assert page_bytes_at(pool, p * pool.page_size) == expected_bytes(pool, seed_of(k))
    assert failures > 0, "the seeded injector injected nothing"
    inner.clear()
    for k in stored:
        assert inner.batch_exists([k]) == 1
        assert load_check(inner, pool, [k], [0]) == 1
    assert d.metrics().get("kvtier_pool_slots_leased", 0) == 0
    inner.close()

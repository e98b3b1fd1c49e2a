"""kvtier under a real vLLM engine (vLLM's CPU backend, random-weight Llama
models saved as safetensors) and a real kvtierd. Each test reads what vLLM
produced (tokens, top-k logprobs, cached-token counts) and what kvtierd
counted (/metrics), never the connector's own view of itself."""

from __future__ import annotations

import json
import mmap
import os
import random
import signal
import subprocess
import threading
import time

import pytest

from conftest import needs_vllm

pytestmark = needs_vllm

BLOCK = 32                       # tokens per vLLM block
PREFIX = 512                     # a shared prefix: 16 blocks


def tokens(seed: int, n: int):
    rng = random.Random(seed)
    return [rng.randrange(1, 1000) for _ in range(n)]


PREFIX_X = tokens(1, PREFIX)
PREFIX_Y = tokens(2, PREFIX)
PROMPTS = {
    "x1": PREFIX_X + tokens(11, 40),
    "x2": PREFIX_X + tokens(12, 40),
    "x3": PREFIX_X + tokens(13, 40),
    "y1": PREFIX_Y + tokens(21, 40),
    "y2": PREFIX_Y + tokens(22, 40),
}
for i in range(20):  # distinct prompts that share nothing, for probing a daemon
    PROMPTS[f"z{i}"] = tokens(100 + i, 96)


@pytest.fixture(scope="module")
def reference(models, request):
    """What vLLM computes for every prompt without kvtier, one prompt at a
    time, with no prefix caching at all: the ground truth."""
    from conftest import Engine

    e = Engine(models["a"], None)
    try:
        return {name: e.generate([p])["outputs"][0] for name, p in PROMPTS.items()
                if not name.startswith("z")}
    finally:
        e.close()


def gen(engine, name):
    return engine.generate([PROMPTS[name]])["outputs"][0]


def same(out, ref):
    """Identical tokens and bit-identical top-k logprobs."""
    assert out["tokens"] == ref["tokens"]
    assert out["logprobs"] == ref["logprobs"]


def loads(daemon) -> float:
    return daemon.metrics().get("kvtier_lookup_hits_total", 0.0)


def test_kvtier_on_matches_off_and_serves_the_shared_prefix(daemon, engine_factory,
                                                            models, reference):
    e = engine_factory(models["a"], daemon.address)
    first = gen(e, "x1")
    same(first, reference["x1"])
    assert first["cached"] == 0
    m = daemon.metrics()
    assert m["kvtier_stores_total"] >= PREFIX // BLOCK, "vLLM offloaded the prompt's blocks"

    second = gen(e, "x2")  # vLLM's own prefix cache is off: only kvtier can serve it
    same(second, reference["x2"])
    assert second["cached"] >= PREFIX, "the shared prefix came back from kvtier"
    # nothing left held once the engine is idle (its last store job is
    # reported done asynchronously, after generate() returned)
    m = daemon.wait_quiet(what="once the engine is idle")
    assert m["kvtier_lookup_hits_total"] >= PREFIX // BLOCK
    assert m["kvtier_jobs_completed_total"] >= 3  # two stores and the load


def test_a_corrupted_block_changes_the_output(daemon, engine_factory, models, reference):
    """The negative control: the comparison above can fail. kvtier's pool is
    what vLLM loads from, byte for byte."""
    e = engine_factory(models["a"], daemon.address)
    same(gen(e, "x1"), reference["x1"])
    with open(daemon.pool, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        rng = random.Random(7)
        mm[:] = bytes(rng.getrandbits(8) for _ in range(256)) * (len(mm) // 256)
    out = gen(e, "x2")
    assert out["cached"] >= PREFIX
    assert out["logprobs"] != reference["x2"]["logprobs"], \
        "loading garbage KV must change what the model computes"


def test_two_engines_share_one_kvtierd_and_the_cache_outlives_them(
        daemon, engine_factory, models, reference):
    a = engine_factory(models["a"], daemon.address)
    b = engine_factory(models["a"], daemon.address)
    # NB: another engine's blocks are served once committed. generate()
    # returns before that (its store job and commit finish in its engine
    # core afterwards); on a loaded box the other engine's lookup can come
    # first, and a MISS then is right (as for a block vLLM's own tier is
    # still writing). So each prefix is waited for: x's, then y's too.
    ready = daemon.metrics().get("kvtier_pool_slots_ready", 0.0)
    same(gen(a, "x1"), reference["x1"])
    daemon.wait_metric("kvtier_pool_slots_ready", ready + PREFIX // BLOCK)
    same(gen(b, "y1"), reference["y1"])
    daemon.wait_metric("kvtier_pool_slots_ready", ready + 2 * PREFIX // BLOCK)
    out = gen(a, "y2")  # stored by b
    same(out, reference["y2"])
    assert out["cached"] >= PREFIX
    out = gen(b, "x2")  # stored by a
    same(out, reference["x2"])
    assert out["cached"] >= PREFIX
    a.close()
    b.close()
    c = engine_factory(models["a"], daemon.address)  # a new process
    out = gen(c, "x3")
    same(out, reference["x3"])
    assert out["cached"] >= PREFIX


def test_a_restarted_kvtierd_serves_the_prefix_from_its_fs_tier(
        daemon_factory, engine_factory, models, reference, tmp_path):
    cfg = tmp_path / "kvtierd.yaml"
    cfg.write_text(f"secondary_tiers:\n  - {{kind: fs, root: {tmp_path / 'fs'}, capacity: 1GiB}}\n")
    d = daemon_factory(config=str(cfg))
    e = engine_factory(models["a"], d.address)
    same(gen(e, "x1"), reference["x1"])
    want = PREFIX // BLOCK
    deadline = time.monotonic() + 60
    while d.metrics().get('kvtier_cascade_written_total{tier="fs"}', 0) < want:
        assert time.monotonic() < deadline, "the prefix never reached the fs tier"
        time.sleep(0.05)  # bounded wait on an observable counter
    e.close()
    d.stop()

    d2 = daemon_factory(config=str(cfg))  # a new pool: only the disk remembers
    e2 = engine_factory(models["a"], d2.address)
    out = gen(e2, "x2")
    same(out, reference["x2"])
    assert out["cached"] >= PREFIX, "promoted from disk and loaded"
    assert d2.metrics()["kvtier_lookup_hits_total"] >= want


@pytest.mark.parametrize("transport", ["ipc", "unix"])
def test_vllm_keeps_serving_when_kvtierd_dies_and_uses_it_again_when_back(
        daemon_factory, engine_factory, models, reference, transport):
    # NB: over unix:// a dead daemon is a broken pipe on the next write: it
    # must read as a lost link, never reach vLLM's engine core.
    d = daemon_factory(transport=transport)
    e = engine_factory(models["a"], d.address)
    same(gen(e, "x1"), reference["x1"])
    old_pool = os.stat(d.pool)
    d.kill()  # its pool file stays, as after a crash
    t = time.monotonic()
    out = gen(e, "x2")  # recomputed: kvtier is gone
    same(out, reference["x2"])
    assert out["cached"] == 0
    assert time.monotonic() - t < 60
    same(gen(e, "y1"), reference["y1"])

    # Same socket path, same pool path (issue 26, item 1): the new pool is a
    # new file, never the old one truncated and reused, so the workers —
    # which check a spec's pool by device, inode and size — cannot write a
    # store planned against the dead daemon into the new daemon's slots.
    d2 = daemon_factory(transport=transport, pool=d.pool)
    assert d2.address == d.address and d2.pool == d.pool
    assert os.stat(d2.pool).st_ino != old_pool.st_ino, "a fresh pool file, not the old one reused"
    deadline = time.monotonic() + 120
    i = 0
    while d2.metrics().get("kvtier_stores_total", 0) == 0:  # reconnects within ~1 s
        assert time.monotonic() < deadline, "vLLM never used the restarted kvtierd"
        e.generate([PROMPTS[f"z{i % 20}"]])
        i += 1
    same(gen(e, "y1"), reference["y1"])  # stored in the new daemon
    out = gen(e, "y2")
    same(out, reference["y2"])
    assert out["cached"] >= PREFIX, (
        f"y2 found {out['cached']} of {PREFIX} prefix tokens cached\n--- engine:\n{e.log_lines('kvtier|cannot store|Error|rror:')}"
        f"--- kvtierd:\n{d2.log_tail(60)}--- metrics: {d2.metrics()}")


@pytest.mark.parametrize("transport", ["ipc", "unix"])
def test_an_engine_started_before_kvtierd_recomputes_then_uses_it(
        daemon_factory, engine_factory, models, reference, transport):
    """vLLM started with kvtierd not yet up (issue 40): it starts and serves,
    recomputing, token-identical; once kvtierd serves, the connector takes
    it on within seconds (its reconnect period, 1 s), says so once in its
    log, and later requests hit kvtier."""
    d = daemon_factory(transport=transport, start=False)
    assert not os.path.exists(d.sock)
    e = engine_factory(models["a"], d.address)
    out = gen(e, "x1")
    same(out, reference["x1"])
    assert out["cached"] == 0
    same(gen(e, "y1"), reference["y1"])
    d.start()
    deadline = time.monotonic() + 120
    i = 0
    while d.metrics().get("kvtier_stores_total", 0) == 0:
        assert time.monotonic() < deadline, "vLLM never took kvtierd on\n" + e.log_lines("kvtier")
        e.generate([PROMPTS[f"z{i % 20}"]])
        i += 1
    same(gen(e, "x2"), reference["x2"])  # its blocks stored in kvtierd
    out = gen(e, "x3")
    same(out, reference["x3"])
    assert out["cached"] >= PREFIX, e.log_lines("kvtier|Error|rror:")
    log = e.log_lines("kvtier")
    assert log.count("not reachable at") == 1, log
    assert log.count("connected to") == 1 and "reconnected" not in log, log


@pytest.mark.parametrize("transport", ["ipc", "unix"])
def test_a_kvtierd_with_no_block_size_takes_the_engines(
        daemon_factory, engine_factory, models, reference, kvtier_cli, transport):
    """kvtierd started with --pool-bytes only (issue 40): its slots take the
    bytes per block the first engine declares (rounded up to a page), which
    is what `kvtier size` computes from the model's config.json at vLLM's
    block size; the engine serves from it and `kvtier status` shows it."""
    d = daemon_factory(transport=transport, block_bytes=0, pool_bytes=64 << 20)
    e = engine_factory(models["a"], d.address)
    same(gen(e, "x1"), reference["x1"])  # possibly before the node opened: recomputed
    deadline = time.monotonic() + 60
    i = 0
    while d.metrics().get("kvtier_stores_total", 0) == 0:
        assert time.monotonic() < deadline, ("vLLM never stored into the sized kvtierd\n" + e.log_lines("kvtier")
                                             + "\nkvtierd:\n" + d.log_tail())
        # NB: a new prompt each time: a repeated one is a GPU prefix hit,
        # with no block of its own to store once the session is up.
        e.generate([PROMPTS[f"z{i % 20}"]])
        i += 1
    same(gen(e, "x2"), reference["x2"])
    out = gen(e, "x3")
    same(out, reference["x3"])
    assert out["cached"] >= PREFIX
    size = json.loads(subprocess.run(
        [kvtier_cli, "size", "--model", os.path.join(models["a"], "config.json"), "--block-size", str(BLOCK),
         "--json"], capture_output=True, text=True, check=True).stdout)
    status = json.loads(subprocess.run([kvtier_cli, "status", d.address, "--json"], capture_output=True,
                                       text=True, check=True).stdout)
    want = -(-size["block_bytes"] // 4096) * 4096
    assert status["pool"]["block_bytes"] == want, (status["pool"], size)
    assert status["pool"]["slots"] == (64 << 20) // want


@pytest.mark.parametrize("transport", ["ipc", "unix"])
def test_kvtier_clear_during_requests_keeps_outputs_and_empties_the_node(
        daemon_factory, engine_factory, models, reference, kvtier_cli, transport):
    """`kvtier clear` (issue 40) while vLLM runs requests: none fails, every
    output is token-identical to the reference, the engine keeps its session;
    a clear with nothing running leaves the node empty, and it refills."""
    d = daemon_factory(transport=transport)
    e = engine_factory(models["a"], d.address)
    same(gen(e, "x1"), reference["x1"])
    stores = d.metrics()["kvtier_stores_total"]
    cleared: list = []

    def clear_once_storing() -> None:
        deadline = time.monotonic() + 120
        while d.metrics()["kvtier_stores_total"] <= stores and time.monotonic() < deadline:
            time.sleep(0.005)  # NB: polling a process's metrics; no message to wait on
        cleared.append(subprocess.run([kvtier_cli, "clear", d.address], capture_output=True,
                                      text=True, timeout=60))

    t = threading.Thread(target=clear_once_storing)
    t.start()
    for name in ("y1", "x2", "y2", "x3"):
        same(gen(e, name), reference[name])
    t.join()
    assert cleared and cleared[0].returncode == 0, cleared
    assert "readable blocks before" in cleared[0].stdout

    out = subprocess.run([kvtier_cli, "clear", d.address], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    status = json.loads(subprocess.run([kvtier_cli, "status", d.address, "--json"], capture_output=True,
                                       text=True, timeout=60, check=True).stdout)
    assert status["pool"]["ready"] == 0 and status["engines"] == 1, status
    out = gen(e, "x2")
    same(out, reference["x2"])
    assert out["cached"] == 0, "the node was empty: recomputed"
    out = gen(e, "x3")
    same(out, reference["x3"])
    assert out["cached"] >= PREFIX, "refilled: x2 stored the prefix again"
    d.wait_quiet(what="after the clears")


@pytest.mark.parametrize("transport", ["ipc", "unix"])
def test_a_stopped_kvtierd_costs_recomputes_and_leaks_nothing(
        daemon_factory, engine_factory, models, reference, transport):
    """kvtierd SIGSTOPped past the connector's timeout (kvtier_timeout_s,
    2 s), then continued (issue 26, item 2): vLLM serves meanwhile
    (recomputes), token-identical; the daemon, once continued, releases the
    session the connector gave up on — its jobs' slots quarantined, not
    freed at once, while the worker may still copy — the connector's new
    session uses kvtier again, and nothing stays held."""
    d = daemon_factory(transport=transport)
    e = engine_factory(models["a"], d.address)
    same(gen(e, "x1"), reference["x1"])
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        t = time.monotonic()
        same(gen(e, "x2"), reference["x2"])  # the link times out: recomputed
        same(gen(e, "y1"), reference["y1"])
        assert time.monotonic() - t < 60
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    stores = d.metrics().get("kvtier_stores_total", 0)
    deadline = time.monotonic() + 120
    i = 0
    while d.metrics().get("kvtier_stores_total", 0) <= stores:  # the new session stores
        assert time.monotonic() < deadline, "vLLM never used the continued kvtierd"
        e.generate([PROMPTS[f"z{i % 20}"]])
        i += 1
    same(gen(e, "x3"), reference["x3"])
    same(gen(e, "y2"), reference["y2"])
    d.wait_quiet(what="after the stop (the lost session's quarantine is --engine-grace, 3 s)")


def test_different_models_never_share_a_block(daemon, engine_factory, models, reference):
    a = engine_factory(models["a"], daemon.address)
    same(gen(a, "x1"), reference["x1"])
    # NB: committed first, or b's MISS would prove nothing
    daemon.wait_metric("kvtier_pool_slots_ready", PREFIX // BLOCK)
    a.close()
    b = engine_factory(models["b"], daemon.address)  # same geometry, other weights
    out = gen(b, "x2")
    assert out["cached"] == 0
    assert loads(daemon) == 0, "model b's keys live in another namespace"


def test_an_engine_killed_mid_run_leaks_nothing(daemon, engine_factory, models):
    e = engine_factory(models["a"], daemon.address)
    e.proc.stdin.write('{"op": "gen", "prompts": [%s], "max_tokens": 200}\n' % PROMPTS["x1"])
    e.proc.stdin.flush()
    deadline = time.monotonic() + 120
    # NB: not a lookup: a prompt kvtier holds nothing of is answered from
    # the residency index, with no message. The engine's stores reach the
    # daemon after its first step.
    while not any(daemon.metrics().get(m, 0) for m in (
            "kvtier_stores_total", "kvtier_pool_slots_write_pending", "kvtier_jobs_in_flight")):
        assert time.monotonic() < deadline, "the engine never stored anything"
        time.sleep(0.05)
    os.killpg(e.proc.pid, signal.SIGKILL)  # engine core and worker die mid-request
    e.proc.wait(timeout=30)
    m = daemon.wait_quiet(what="after the engine died", credit=True)
    assert m["kvtier_engine_sessions"] == 0


def test_chunks_of_two_blocks_round_trip_bit_identical(daemon, engine_factory, models,
                                                       reference):
    """vLLM offloading 64-token chunks of two 32-token blocks: every slot
    holds two engine blocks per layer, entered at the right sub-block."""
    e = engine_factory(models["a"], daemon.address, "--extra", '{"block_size": 64}')
    same(gen(e, "x1"), reference["x1"])
    assert daemon.metrics()["kvtier_stores_total"] == PREFIX // 64
    out = gen(e, "x2")
    same(out, reference["x2"])
    assert out["cached"] >= PREFIX


@pytest.mark.parametrize("transport", ["ipc", "unix"])
def test_a_namespace_mismatch_fails_the_engines_start(daemon_factory, models, tmp_path, transport):
    """kvtierd serving another namespace: a real engine (sha256 block
    hashes, vLLM's default) refuses to start, naming both namespaces, rather
    than starting and failing its first request."""
    from conftest import Engine

    cfg = tmp_path / "ns.yaml"
    cfg.write_text("namespace: 00000000deadbeef\n")
    d = daemon_factory(config=str(cfg), transport=transport)
    with pytest.raises(AssertionError) as failed:
        Engine(models["a"], d.address).close()
    assert "KvtierConfigError" in str(failed.value), str(failed.value)[-2000:]
    assert "serves only namespace '00000000deadbeef'" in str(failed.value)


# vLLM's GPU prefix cache on (its default), small enough to evict: what
# kvtier serves must reproduce an engine whose GPU cache never evicts.
SMALL_GPU = ("--gpu-prefix-cache", "--gpu-blocks", "64", "--max-model-len", "1024")
EVICT_X = [f"z{i}" for i in range(16)]  # 16 x 4 blocks after x1 and y1: both prefixes leave a 64-block cache


def run_sequence(engine, names):
    return {n: gen(engine, n) for n in names}


def prefix_cache_first_phase(daemon_factory, engine_factory, models, transport, later):
    """The reference (a never-evicting engine, prefix cache on) over the
    first phase and ``later``; a kvtierd on ``transport`` and an engine with
    a small GPU cache, through the first phase: every output identical,
    x2's prefix (evicted from the GPU cache) served by kvtier. Returns the
    daemon, the engine and the reference."""
    from conftest import Engine

    first = ["x1", "y1"] + EVICT_X + ["x2"]
    ref_engine = Engine(models["a"], None, "--gpu-prefix-cache", "--max-model-len", "1024")
    try:
        reference = run_sequence(ref_engine, first + later)
    finally:
        ref_engine.close()

    d = daemon_factory(transport=transport)
    e = engine_factory(models["a"], d.address, *SMALL_GPU)
    got = run_sequence(e, first)
    for n in first:
        same(got[n], reference[n])
    assert got["x2"]["cached"] >= PREFIX
    assert loads(d) >= PREFIX // BLOCK, "the evicted prefix came from kvtier"
    return d, e, reference


@pytest.mark.parametrize("transport", ["ipc", "unix"])
def test_with_vllms_prefix_cache_on_kvtier_matches_a_never_evicting_engine_across_a_crash(
        daemon_factory, engine_factory, models, transport):
    """vLLM's GPU prefix cache on and small: prefixes it evicted come back
    from kvtier, token- and logprob-identical to the same engine with a GPU
    cache that never evicts (the reference, same prompts in the same order);
    then kvtierd is SIGKILLed (vLLM recomputes, still identical) and
    restarted on the same pool path (kvtier serves again, identical)."""
    d, e, reference = prefix_cache_first_phase(daemon_factory, engine_factory, models, transport,
                                               later=["y2", "x3"])
    d.kill()
    out = gen(e, "y2")  # kvtierd dead: y's prefix (evicted from the GPU cache) recomputed
    same(out, reference["y2"])
    d2 = daemon_factory(transport=transport, pool=d.pool)
    deadline = time.monotonic() + 120
    i = len(EVICT_X)
    while d2.metrics().get("kvtier_stores_total", 0) == 0:  # reconnects within ~1 s
        assert time.monotonic() < deadline, "vLLM never used the restarted kvtierd"
        e.generate([PROMPTS[f"z{i % 20}"]])
        i += 1
    # x3's prefix: evicted from the GPU cache and gone with the dead daemon:
    # recomputed, in the restarted daemon's session, still identical
    same(gen(e, "x3"), reference["x3"])


@pytest.mark.parametrize("transport", ["ipc", "unix"])
def test_with_vllms_prefix_cache_on_a_stopped_kvtierd_costs_recomputes_and_leaks_nothing(
        daemon_factory, engine_factory, models, transport):
    """The SIGSTOP case with vLLM's GPU prefix cache on and small: kvtierd
    stopped past the connector's timeout, then continued; vLLM's outputs
    equal a never-evicting engine's throughout (prefixes recomputed while
    kvtierd is stopped, served again after), kvtier is used again, and
    nothing stays held."""
    d, e, reference = prefix_cache_first_phase(daemon_factory, engine_factory, models, transport,
                                               later=["y2", "x3"])
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        same(gen(e, "y2"), reference["y2"])  # the link times out: y's prefix recomputed
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    stores = d.metrics().get("kvtier_stores_total", 0)
    deadline = time.monotonic() + 120
    i = len(EVICT_X)
    while d.metrics().get("kvtier_stores_total", 0) <= stores:  # the new session stores
        assert time.monotonic() < deadline, "vLLM never used the continued kvtierd"
        e.generate([PROMPTS[f"z{i % 20}"]])
        i += 1
    same(gen(e, "x3"), reference["x3"])
    d.wait_quiet(what="after the stop (the lost session's quarantine is --engine-grace, 3 s)")


BLOCK_C = 64  # model c's --block-size (vLLM's CPU attention takes multiples of 32)


@pytest.fixture(scope="module")
def model_c(tmp_path_factory):
    """A model of another KV geometry than models["a"]: three layers and one
    KV head of 64 dims (a: two layers, two KV heads of 32)."""
    from kvtier_bench.vllm_harness import save_random_llama

    return save_random_llama(str(tmp_path_factory.mktemp("models") / "llama-c"), seed=2, layers=3,
                             heads=2, kv_heads=1)


@pytest.fixture(scope="module")
def reference_c(model_c):
    """Model c's ground truth at its block size, as `reference` is a's."""
    from conftest import Engine

    e = Engine(model_c, None, "--block-size", str(BLOCK_C))
    try:
        return {name: e.generate([PROMPTS[name]])["outputs"][0] for name in ("x1", "x2", "y1", "y2")}
    finally:
        e.close()


def status_of(kvtier_cli, d) -> dict:
    return json.loads(subprocess.run([kvtier_cli, "status", d.address, "--json"], capture_output=True,
                                     text=True, check=True).stdout)


@pytest.mark.parametrize("transport", ["ipc", "unix"])
def test_two_models_of_different_shapes_share_one_kvtierd_and_its_byte_budget(
        daemon_factory, engine_factory, models, model_c, reference, reference_c, kvtier_cli, transport):
    """Issue 42: two engines whose blocks differ in size (other layer count,
    KV heads, head dim and --block-size) on one kvtierd started with
    --pool-bytes only, at the same time: each is served slots of its own
    size from the one budget, each reuses its own prefixes from kvtier with
    outputs identical to the engine without kvtier, their keys are in
    different namespaces, and the pool's memory stays within the budget."""
    budget = 64 << 20
    d = daemon_factory(transport=transport, block_bytes=0, pool_bytes=budget)
    a = engine_factory(models["a"], d.address)
    c = engine_factory(model_c, d.address, "--block-size", str(BLOCK_C))
    deadline = time.monotonic() + 120
    i = 0
    while True:  # both links up: the first sizes the pool, both reconnect within ~1 s
        try:
            st = status_of(kvtier_cli, d)
            if st["engines"] == 2:
                break
        except subprocess.CalledProcessError:  # still sizing: the status command is answered SIZING
            pass
        assert time.monotonic() < deadline, "both engines never held a session\nkvtierd:\n" + d.log_tail()
        for e in (a, c):
            e.generate([PROMPTS[f"z{i % 20}"]])
        i += 1
    stores = d.metrics().get("kvtier_stores_total", 0)
    same(gen(a, "x1"), reference["x1"])
    same(gen(c, "x1"), reference_c["x1"])
    d.wait_metric("kvtier_stores_total", stores + PREFIX // BLOCK + PREFIX // BLOCK_C, timeout=60)
    for e, ref in ((a, reference), (c, reference_c)):
        out = gen(e, "x2")
        same(out, ref["x2"])
        assert out["cached"] >= PREFIX, "its own prefix, from kvtier"

    st = status_of(kvtier_cli, d)
    sizes = sorted(s["block_bytes"] for s in st["sessions"])
    assert len(set(sizes)) == 2, st["sessions"]
    assert len({s["namespace"] for s in st["sessions"]}) == 2, "the models' keys are in namespaces of their own"
    geos = {g["block_bytes"]: g for g in st["pool"]["geometries"]}
    for declared in sizes:
        g = geos[-(-declared // 4096) * 4096]  # a declared size is served in slots of it rounded to a page
        assert g["ready"] >= PREFIX // max(BLOCK, BLOCK_C), (g, st["pool"])
    m = d.metrics()
    assert m["kvtier_pool_bytes_budget"] == budget
    assert m["kvtier_pool_bytes_committed"] <= budget, m


BLOCK_BYTES_A = 2 * 2 * BLOCK * 2 * 32 * 2      # model a: layers x K,V x tokens x KV heads x dims x bf16
BLOCK_BYTES_C = 3 * 2 * BLOCK_C * 1 * 64 * 2    # model c


def _pass(engine, prompts):
    """Generates prompts in batches of vLLM's max_num_seqs; returns the
    tokens vLLM took from cache and the prompt tokens in all."""
    cached = total = 0
    for i in range(0, len(prompts), 8):
        batch = prompts[i:i + 8]
        for out in engine.generate(batch, max_tokens=1)["outputs"]:
            cached += out["cached"]
        total += sum(len(p) for p in batch)
    return cached, total


def test_a_busy_model_takes_the_pool_from_an_idle_one(daemon_factory, engine_factory, models, model_c):
    """Issue 42: engine A (model a, 16 KiB blocks) fills a kvtierd's pool and
    goes idle; engine C (model c, 48 KiB blocks) then runs its trace twice.
    C's hit rate, read from vLLM's cached-token counts, is what C gets alone
    on a kvtierd of the same budget, and the bytes it took were A's: A's
    blocks are evicted, C's all kept."""
    from kvtier_client import Client

    slots_c = 512                                      # the budget in C's blocks: credit at most an eighth of it
    budget = slots_c * BLOCK_BYTES_C
    a_prompts = [tokens(1000 + i, 32 * BLOCK) for i in range(budget // BLOCK_BYTES_A // 32)]
    c_prompts = [tokens(2000 + i, 16 * BLOCK_C) for i in range(25)]  # 400 blocks: C's trace fits what credit leaves

    def run_c(d):
        c = engine_factory(model_c, d.address, "--block-size", str(BLOCK_C))
        first = _pass(c, c_prompts)
        d.wait_quiet(what="after C's first pass")
        second = _pass(c, c_prompts)
        return first, second

    shared = daemon_factory(block_bytes=BLOCK_BYTES_A, pool_bytes=budget)
    a = engine_factory(models["a"], shared.address)
    _pass(a, a_prompts)
    shared.wait_quiet(what="after A filled the pool")
    with Client(shared.address) as cl:
        filled = {g["block_bytes"]: g["ready"] for g in cl.stats()["geometries"]}
    assert filled[BLOCK_BYTES_A] * BLOCK_BYTES_A >= budget * 3 // 4, ("A filled the pool", filled)
    together = run_c(shared)

    alone = run_c(daemon_factory(block_bytes=BLOCK_BYTES_A, pool_bytes=budget, sock_name="alone.sock"))
    assert together[0][0] == alone[0][0] == 0, "the first pass finds nothing"
    rate_together, rate_alone = together[1][0] / together[1][1], alone[1][0] / alone[1][1]
    assert rate_alone > 0.9, f"C's second pass comes from kvtier alone: {rate_alone}"
    assert abs(rate_together - rate_alone) <= 0.01, (rate_together, rate_alone)

    with Client(shared.address) as cl:
        st = cl.stats()
    ready = {g["block_bytes"]: g["ready"] for g in st["geometries"]}
    assert ready[BLOCK_BYTES_C] == len(c_prompts) * 16, ("every block of C's trace kept", ready)
    assert filled[BLOCK_BYTES_A] - ready[BLOCK_BYTES_A] >= 3 * ready[BLOCK_BYTES_C] - (
        budget - filled[BLOCK_BYTES_A] * BLOCK_BYTES_A) // BLOCK_BYTES_A, ("C's bytes came from A's blocks", filled, ready)
    assert st["committed_bytes"] <= budget

"""The Python reader of the residency index against the Go writer (built
from this repository): golden fingerprints, a fixed index, a live churn,
malformed files. Run: python3 -m pytest clients/python/tests/test_residency.py -q"""

import hashlib
import os
import select
import struct
import subprocess

import pytest

from kvtier_client.residency import (
    Residency,
    fingerprint,
    fingerprint_key,
    ns_fingerprint,
)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


MASK64 = (1 << 64) - 1
NS = "vllm-test"  # the writer's documented key set: see internal/writer/main.go
NKEYS = 32


def sha(s):
    return hashlib.sha256(s.encode()).digest()


# The SAME vectors as TestFingerprintGolden in tiers/cpu/residency.
GOLDEN_NAMESPACES = {"": 0x141CFC9842C4B0E3, "vllm-test": 0x59A390D5781078E2}
GOLDEN = [
    ("", b"", 0, 0xBCC9599953628295),
    ("vllm-test", sha("0"), 0, 0x963E7792A0E0983F),
    ("vllm-test", sha("1"), 1, 0x9C58147535928064),
    ("ns", bytes(range(1, 14)), 7, 0xFDB8D203C77DE7B6),  # 13 bytes: padded fold
    ("0123456789abcdef", b"\xff" * 32, 0xFFFFFFFF, 0x9FFC109B2923DAEA),
    # The hash cancels the namespace: the mix of 0 is 0, clamped to 4.
    ("vllm-test", (0x59A390D5781078E2).to_bytes(8, "little"), 0, 4),
]


def test_golden_fingerprints():
    for ns, want in GOLDEN_NAMESPACES.items():
        assert ns_fingerprint(ns) == want, ns
    for ns, h, group, want in GOLDEN:
        nsfp = ns_fingerprint(ns)
        assert fingerprint(nsfp, h, group) == want, (ns, h.hex(), group)
        assert fingerprint_key(nsfp, h + group.to_bytes(4, "big")) == want, (ns, h.hex(), group)


def key_fps():
    nsfp = ns_fingerprint(NS)
    return [fingerprint(nsfp, sha(str(i)), i % 2) for i in range(NKEYS)]


@pytest.fixture(scope="session")
def writer_bin(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("bin") / "residency-writer")
    subprocess.run(["go", "build", "-o", out, "./tiers/cpu/residency/internal/writer"], cwd=REPO, check=True)
    return out


def start(writer_bin, path, *args):
    proc = subprocess.Popen(
        [writer_bin, "--path", path, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def finish(proc, path):
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    assert not os.path.exists(path), "the writer's Close left the file"


def fixed_state(i):
    """Key i's state in the writer's fixed index: odd keys in a secondary
    tier, even keys readable in CPU memory or (every other) being written."""
    return 2 if i % 2 else (3 if i % 4 == 2 else 1)


def test_fixed_index(writer_bin, tmp_path):
    path = str(tmp_path / "residency")
    proc = start(writer_bin, path, "--mode", "fixed")
    try:
        with Residency(path) as r:
            assert r.regions == 2 and r.generation != 0
            for i, fp in enumerate(key_fps()):
                assert r.state(fp) == fixed_state(i), i
            nsfp = ns_fingerprint(NS)
            for i in range(NKEYS):
                assert r.state(fingerprint(nsfp, sha(f"absent-{i}"), i % 2)) == 0, i
                key = sha(str(i)) + (i % 2).to_bytes(4, "big")
                assert r.state(fingerprint_key(nsfp, key)) in (1, 2, 3)
                assert r.held(nsfp, key) == fixed_state(i), "held answers the state"
            assert r.state(0) == 0 and r.state(3) == 0
    finally:
        finish(proc, path)


def test_churn_never_torn(writer_bin, tmp_path):
    path = str(tmp_path / "residency")
    proc = start(writer_bin, path, "--mode", "churn", "--iterations", "200000")
    fps = key_fps()
    legal = {0} | {(fp & MASK64 & ~3) | s for fp in fps for s in (1, 2)}
    with Residency(path) as r:
        proc.stdin.write("go\n")  # mapped: let the churn start
        proc.stdin.flush()
        sweeps, seen = 0, set()
        done = False
        while not done:
            # Decide before the sweep, so the last sweep may see the end state.
            done = proc.poll() is not None or _printed_done(proc)
            words = r.words(0)
            bad = [hex(w) for w in words if w not in legal]
            assert not bad, f"torn or foreign entries: {bad[:4]}"
            seen.update(words)
            for fp in fps:
                assert r.state(fp) in (0, 1, 2)
            sweeps += 1
    assert sweeps > 1 and len(seen) > 2, (sweeps, len(seen))
    finish(proc, path)


def _printed_done(proc):
    """True once the writer printed "done" (stdout has nothing else to say
    before it, so a ready line means the churn is over)."""
    ready, _, _ = select.select([proc.stdout], [], [], 0)
    if not ready:
        return False
    assert proc.stdout.readline().strip() == "done"
    return True


def valid_image():
    """A one-region index image (4 buckets), built by hand."""
    head = struct.pack("<8sIIQ40x", b"KVTRES01", 1, 1, 42)
    desc = struct.pack("<QIIQQ", 192, 4, 8, 0, 0) + bytes(96)
    return bytearray(head + desc + bytes(4 * 64))


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(lambda b: b[:100], id="truncated header"),
        pytest.param(lambda b: b"KVTRES99" + b[8:], id="magic"),
        pytest.param(lambda b: b[:8] + struct.pack("<I", 2) + b[12:], id="version"),
        pytest.param(lambda b: b[:12] + struct.pack("<I", 5) + b[16:], id="regions"),
        pytest.param(lambda b: b[:64] + struct.pack("<Q", 200) + b[72:], id="offset align"),
        pytest.param(lambda b: b[:72] + struct.pack("<I", 3) + b[76:], id="buckets"),
        pytest.param(lambda b: b[:76] + struct.pack("<I", 4) + b[80:], id="entries"),
        pytest.param(lambda b: b[:-64], id="past the end"),
        pytest.param(lambda b: b[:64] + struct.pack("<Q", 1 << 63) + b[72:], id="huge offset"),
        pytest.param(lambda b: b[:12] + struct.pack("<I", 2) + b[16:96] + b[64:96] + b[128:], id="overlap"),
    ],
)
def test_malformed(tmp_path, corrupt):
    path = tmp_path / "bad"
    path.write_bytes(bytes(valid_image()))
    with Residency(str(path)) as r:  # the uncorrupted image is valid
        assert r.generation == 42 and r.state(12345) == 0
    path.write_bytes(bytes(corrupt(valid_image())))
    with pytest.raises(ValueError):
        Residency(str(path))


def test_held_cpu_agrees_with_state(writer_bin, tmp_path):
    """held_cpu (the scheduler's inlined path) answers state(...) == 1 for
    every key of the fixed index, held or absent, 32-byte hash or not."""
    path = str(tmp_path / "residency")
    proc = start(writer_bin, path, "--mode", "fixed")
    try:
        with Residency(path) as r:
            nsfp = ns_fingerprint(NS)
            keys = [sha(str(i)) + (i % 2).to_bytes(4, "big") for i in range(NKEYS + 8)]
            keys += [b"short" + (0).to_bytes(4, "big"), bytes(64) + (1).to_bytes(4, "big")]
            for k in keys:
                assert r.held_cpu(nsfp, k) == (r.state(fingerprint_key(nsfp, k)) == 1), k
            assert r.not_held_cpu(nsfp, keys) == [k for k in keys if r.state(fingerprint_key(nsfp, k)) != 1]
            assert sum(r.held_cpu(nsfp, k) for k in keys) == (NKEYS + 3) // 4  # keys 0, 4, 8, ...: readable
            for k in keys:
                assert r.held(nsfp, k) == r.state(fingerprint_key(nsfp, k)), k
    finally:
        finish(proc, path)

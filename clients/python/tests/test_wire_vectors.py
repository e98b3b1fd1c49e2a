"""The engine protocol's shared test vectors (wire_vectors.json, written by
the Go codec: scheduler/wire/vectors_test.go).

The Python client replays the vectors' session over a transport that serves
the Go codec's reply bytes: every request it writes must decode to the same
map as the Go codec's encoding of that call, and every reply must decode to
what the Go side put in it. Its constants (protocol version, lookup
statuses, bounds) and every op name and error code it uses are checked
against the protocol's table, so nothing copied by hand can drift."""

import json
import os
import re

import msgpack
import pytest

import kvtier_client.client as kc
from kvtier_client import Client, KvtierError, Request

HERE = os.path.dirname(os.path.abspath(__file__))

with open(os.path.join(HERE, "wire_vectors.json")) as f:
    VECTORS = json.load(f)

# Codes the client raises itself, never read from the wire: a reply that
# does not fit the session (BAD_REPLY), no daemon at the address
# (UNAVAILABLE).
CLIENT_CODES = {"BAD_REPLY", "UNAVAILABLE"}


def test_constants_match_the_protocol_table():
    assert kc.PROTOCOL_VERSION == VECTORS["protocol"]
    statuses = {name: getattr(kc, name) for name in VECTORS["lookup_status"]}
    assert statuses == VECTORS["lookup_status"]
    assert kc.MAX_FRAME_BYTES == VECTORS["bounds"]["max_frame_bytes"]
    assert kc.MAX_HASH_BYTES == VECTORS["bounds"]["max_hash_bytes"]


def _sources():
    pkg = os.path.join(os.path.dirname(HERE), "kvtier_client")
    return [open(os.path.join(pkg, name)).read() for name in sorted(os.listdir(pkg)) if name.endswith(".py")]


def test_every_op_and_code_the_client_uses_is_in_the_table():
    src = "\n".join(_sources())
    ops = set(re.findall(r'(?:_call|send|call|frame)\(\s*"([a-z_]+)"', src))
    ops |= set(re.findall(r'"op": "([a-z_]+)"', src))
    assert ops, "the client's op names were found"
    assert ops <= set(VECTORS["ops"]), f"ops not in the protocol: {ops - set(VECTORS['ops'])}"
    codes = set(re.findall(r'KvtierError\(\s*"([A-Z_]+)"', src))
    assert codes, "the client's error codes were found"
    assert codes <= set(VECTORS["codes"]) | CLIENT_CODES, f"codes not in the protocol: {codes - set(VECTORS['codes'])}"


class _VectorTransport:
    """Serves the vectors' replies, one per request, after checking that
    the request decodes to the same map as the Go codec's."""

    def __init__(self, calls):
        self.calls = list(calls)
        self.at = 0
        self.replies = []

    def _take(self, frame: bytes) -> None:
        assert self.at < len(self.calls), "more calls than the vectors hold"
        c = self.calls[self.at]
        self.at += 1
        want = msgpack.unpackb(bytes.fromhex(c["request"]), raw=False)
        got = msgpack.unpackb(frame, raw=False)
        assert got == want, f"{c['op']} ({c['note']}): Python writes {got}, Go writes {want}"
        self.replies.extend(bytes.fromhex(r) for r in c["replies"])

    def send(self, frame: bytes) -> None:
        self._take(frame)

    def send_many(self, frames) -> None:
        for frame in frames:
            self._take(frame)

    def poll(self, wait_ms: int) -> bool:
        return bool(self.replies)

    def recv(self) -> bytes:
        return self.replies.pop(0)

    def drain(self):
        out, self.replies = self.replies, []
        return out

    def close(self) -> None:
        pass


@pytest.fixture
def session(tmp_path, monkeypatch):
    fx = VECTORS["fixtures"]
    monkeypatch.chdir(tmp_path)
    with open(fx["pool_path"], "wb") as f:  # the hello's pool: 4 slots of 64 bytes
        f.write(bytes(4 * 64))
    transport = _VectorTransport(VECTORS["calls"])
    monkeypatch.setattr(kc, "_transport", lambda addr, timeout, poll_us: transport)
    client = Client("unix:///vectors", name=fx["client"], timeout=fx["timeout_ms"] / 1000, heartbeat=False)
    return client, transport, fx


def test_the_python_client_replays_the_go_codecs_session(session):
    client, transport, fx = session
    ns = fx["namespace"]
    keys = [(ns, bytes.fromhex(h), 0) for h in fx["hashes"]]
    req = Request(fx["request_id"], tokens=fx["tokens"], block_size=fx["block_size"])

    h = client.hello
    assert (h.session, h.block_bytes, h.slots, h.namespace) == (7, 64, 4, ns)
    assert h.packed_keys and h.credit and h.batch and not h.index_complete
    assert client.lookup(req, keys) == [kc.HIT, kc.HIT_PENDING, kc.MISS]
    load = client.prepare_load(req, keys[:2])
    assert (load.job, load.slots, load.workers) == (5, [3, 0], 1)
    plan = client.prepare_store(req, keys)
    assert (plan.job, plan.to_store, plan.slots, plan.evicted, plan.workers) == (6, keys[2:], [2], keys[:1], 1)
    client.complete_store(req, keys[2:])
    client.job_done(6)
    with pytest.raises(KvtierError) as err:
        client.complete_load(req, keys[:2])
    assert err.value.code == "UNKNOWN_KEY" and "not loading" in err.value.msg
    stored, removed = client.take_events()
    assert (stored["kind"], stored["keys"], stored["medium"], stored["at_ns"]) == (
        "BlockStored", keys[2:], "CPU", 1_700_000_000 * 10**9)
    assert stored["req"]["id"] == fx["request_id"]
    assert (removed["kind"], removed["keys"], removed["req"]) == ("BlockRemoved", keys[:1], None)
    assert client.has_pending_work() is True
    stats = client.stats()
    assert (stats["slots"], stats["free"], stats["ready"], stats["hits"]) == (4, 1, 3, 1)
    client.pause(clear_cache=True)
    client.resume()
    client.touch(req, keys[:1])
    client.request_finished(req)
    lookup, frame = client.call("lookup", req=req.wire(), **client._key_field(keys[:1]), prefix=True, want_slots=True)
    _, commit = client.call("complete_store", req=req.wire(), **client._key_field(keys[2:]), ok=True, quiet=True)
    _, finish = client.call("request_finished", req=req.wire(), noreply=True)
    client.send_calls([frame, commit, finish], keep=[lookup])
    (rid, reply), = client.take_replies()
    assert (rid, list(reply["status"]), reply["slots"]) == (lookup, [kc.HIT], [2])
    client.ping()
    client.close()
    assert transport.at == len(VECTORS["calls"]), "every vector was replayed"


def test_protocol_module_is_the_table():
    """kvtier_client/protocol.py is generated from the Go codec's table."""
    from kvtier_client import protocol

    assert protocol.OPS == VECTORS["ops"]
    assert protocol.CODES == frozenset(VECTORS["codes"])
    assert protocol.MAX_KEYS == VECTORS["bounds"]["max_keys"]


def test_an_op_not_in_the_table_is_refused_before_it_is_sent():
    kc._check_op("lookup")
    with pytest.raises(ValueError, match="not an operation"):
        kc._check_op("lokup")

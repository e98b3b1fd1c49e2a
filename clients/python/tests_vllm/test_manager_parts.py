"""The manager's parts on their own, without a kvtierd: the lookup phases and
generations (lookups.py), stores settling in either order (stores.py) and
credit sizing (credit.py). test_manager.py drives them together, in vLLM's
call order, against a real kvtierd."""

from __future__ import annotations

from types import SimpleNamespace

from vllm.v1.kv_offload.base import make_offload_key

from kvtier_client import HIT, MISS, RETRY
from kvtier_vllm.calls import GrantCall, LookupCall, Outbox, StoreCall
from kvtier_vllm.credit import Credit
from kvtier_vllm.lookups import Lookups, Phase
from kvtier_vllm.stores import Stores


def _key(i: int, group: int = 0):
    return make_offload_key(i.to_bytes(32, "big"), group)


def _ctx(req_id: str):
    return SimpleNamespace(req_id=req_id)


class _Client:
    """The outbox's side of kvtier_client.Client: numbered frames."""

    def __init__(self):
        self.rid = 0
        self.sent = []

    def call(self, op, **fields):
        self.rid += 1
        return self.rid, {"op": op, **fields}


def _lookups() -> Lookups:
    return Lookups(chunk_tokens=16, ttl=30.0, single_group=True, keys=None, session=None, writing={})


def test_a_request_runs_idle_collecting_asking_idle():
    lk = _lookups()
    r = lk.req(_ctx("a"))
    assert r.phase is Phase.IDLE and r.wire == {"id": "a", "block_size": 16}
    k1, k2 = _key(1), _key(2)
    r.collect(k1)
    r.collect(k2)
    assert r.phase is Phase.COLLECTING and lk.to_ask() == [r]
    r.sent(7, now=1.0)
    assert r.phase is Phase.ASKING and lk.to_ask() == [], "one Lookup in flight per request"
    err = lk.answered(LookupCall("a", [k1, k2], lk.generation), {"status": [HIT, MISS], "slots": [5, 0]}, step=3)
    assert err is None and r.phase is Phase.IDLE and r.asking == 0
    assert lk.leased(r, [k1]) == [5], "a HIT's slot is its lease"
    assert lk.leased(r, [k1]) is None, "a lease is used once"


def test_an_answer_of_an_older_generation_is_void():
    lk = _lookups()
    r = lk.req(_ctx("a"))
    k = _key(1)
    r.collect(k)
    r.sent(1, now=1.0)
    old = LookupCall("a", [k], lk.generation)
    lk.void()  # a lost session or reset_cache
    assert r.phase is Phase.IDLE and r.generation == lk.generation and not r.ask
    lk.answered(old, {"status": [HIT], "slots": [9]}, step=1)
    assert k not in r.answers, "a reply from before the reset leased nothing"
    assert lk.leased(r, [k]) is None


def test_a_refused_lookup_ends_asking_and_records_nothing():
    lk = _lookups()
    r = lk.req(_ctx("a"))
    r.collect(_key(1))
    r.sent(1, now=1.0)
    err = lk.answered(LookupCall("a", [_key(1)], lk.generation), {"err": {"code": "BUSY"}}, step=1)
    assert err == {"code": "BUSY"} and r.phase is Phase.IDLE and not r.answers


def test_short_replies_answer_the_missing_keys_miss():
    lk = _lookups()
    r = lk.req(_ctx("a"))
    keys = [_key(i) for i in range(3)]
    lk.record(r, keys, {"status": [HIT], "slots": [4]}, step=2)
    assert [r.answers[k].status for k in keys] == [HIT, MISS, MISS]


def test_deferred_answers_are_forgotten_hits_kept():
    lk = _lookups()
    r = lk.req(_ctx("a"))
    lk.record(r, [_key(1), _key(2)], {"status": [HIT, RETRY], "slots": [4, 0]}, step=2)
    lk.forget_deferred()
    assert list(r.answers) == [_key(1)]


def _store(stores: Stores, keys, slots):
    return stores.bind(keys, slots, {"id": "a"}, epoch=1)


def _settle_all(stores, batches, credit):
    commits = []
    for b in batches:
        stores.settle(b, 1, credit, lambda b, ks, ok: commits.append((ks, ok)))
    return commits


def test_a_store_settles_the_same_whichever_half_comes_first():
    for answer_first in (True, False):
        stores, credit = Stores(), Credit(8)
        keys = [_key(i) for i in range(3)]
        b = _store(stores, keys, [10, 11, 12])
        reply = {"bound": [True, False, True]}  # key 1: another engine stored it meanwhile
        commits = []
        if answer_first:
            stores.answered(StoreCall(b), reply)
            ready = stores.complete(keys, True)
            assert ready == [b] and not stores.awaiting
        else:
            ready = stores.complete(keys, True)
            assert ready == [] and id(b) in stores.awaiting, "completed, its answer not in: awaited"
            assert all(k in stores.batches for k in keys), "HIT_PENDING until the answer"
            stores.answered(StoreCall(b), reply)
            ready = [b]
        commits = _settle_all(stores, ready, credit)
        assert commits == [([keys[0], keys[2]], True)], answer_first
        assert credit.slots == [11], "the duplicate's slot returns to the credit"
        assert not stores.batches and not stores.awaiting


def test_a_refused_store_commits_nothing_and_keeps_no_slot():
    stores, credit = Stores(), Credit(8)
    keys = [_key(1), _key(2)]
    b = _store(stores, keys, [3, 4])
    stores.answered(StoreCall(b), {"err": {"code": "FULL"}})
    assert stores.refused == 1
    assert _settle_all(stores, stores.complete(keys, True), credit) == []
    assert credit.slots == [] and not stores.batches


def test_a_store_of_an_older_session_is_forgotten():
    stores, credit = Stores(), Credit(8)
    keys = [_key(1)]
    b = _store(stores, keys, [3])
    stores.complete(keys, True)
    commits = []
    stores.settle(b, 2, credit, lambda b, ks, ok: commits.append(ks))  # the link's epoch moved on
    assert commits == [] and not stores.batches and not stores.awaiting


def test_a_key_completed_twice_counts_once():
    stores = Stores()
    keys = [_key(1), _key(2)]
    b = _store(stores, keys, [3, 4])
    stores.complete([keys[0]], True)
    stores.complete([keys[0]], True)
    assert b.open == 1 and len(b.deferred) == 1


def test_credit_is_sized_by_the_next_steps_stores_with_a_margin():
    c = Credit(64)
    c.predict(0)
    assert c.target == 64, "never below the configured credit"
    c.predict(400)
    assert c.target == 450, "this step's predicted 0, the next 400: +1/8"
    c.predict(100)
    assert c.target == (500 + 500 // 8)
    assert Credit(0).target == 0


def test_once_a_steps_stores_took_theirs_credit_covers_the_next_steps_only():
    c, out, client = Credit(64), Outbox(), _Client()
    c.predict(400)  # the next step will store 400
    c.predict(200)  # this step 400, the next 200
    assert c.target == 675
    c.slots = list(range(675))
    c.take(400)
    c.refill(out, client, epoch=1)
    assert not out.frames, "275 in hand covers the next step's 200 and a quarter"
    c.take(100)  # the step stored more than predicted
    assert c.target == 250, "never below the next step's 200 and a quarter"
    c.refill(out, client, epoch=1)
    assert out.frames[0]["n"] == 75, "the old sizing (two steps' stores) asked for 500"


def test_credit_refills_up_to_its_target_once_until_granted():
    c, out, client = Credit(64), Outbox(), _Client()
    c.refill(out, client, epoch=1)
    assert c.granting == 64 and len(out.frames) == 1 and out.frames[0]["n"] == 64
    c.refill(out, client, epoch=1)
    assert len(out.frames) == 1, "what is being granted is not asked again"
    call = out.settled(1)
    assert isinstance(call, GrantCall)
    c.granted(call, {"slots": list(range(64)), "evicted": []}, epoch=1, unwire=list)
    assert c.granting == 0 and len(c.slots) == 64
    assert c.take(3) == [61, 62, 63] and len(c.slots) == 61


def test_a_grant_of_an_older_session_adds_no_slot():
    c = Credit(8)
    c.granting = 8
    c.granted(GrantCall(8, epoch=1), {"slots": [1, 2], "evicted": []}, epoch=2, unwire=list)
    assert c.slots == [] and c.granting == 0


def test_one_synchronous_grant_a_step():
    c, asked = Credit(64), []

    def grant(n):
        asked.append(n)
        return {"slots": list(range(n)), "evicted": []}

    c.grant_now(100, step=4, grant=grant, unwire=list)
    c.grant_now(100, step=4, grant=grant, unwire=list)
    assert asked == [100], "never more than one a step"
    c.grant_now(200, step=5, grant=grant, unwire=list)
    assert asked == [100, 100]


def test_a_quiet_call_is_not_awaited_a_noreply_call_says_so():
    out, client = Outbox(), _Client()
    out.queue(client, "prepare_load", quiet=True)
    out.queue(client, "touch")
    rid = out.queue(client, "grant", GrantCall(1, 1), n=1)
    assert out.frames[0]["quiet"] is True and "noreply" not in out.frames[0]
    assert out.frames[1]["noreply"] is True
    assert list(out.awaited) == [rid]
    out.void()
    assert not out.frames and not out.awaited

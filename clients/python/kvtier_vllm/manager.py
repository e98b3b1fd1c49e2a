"""The scheduler side: vLLM's OffloadingManager backed by a kvtierd.

vLLM calls ``lookup`` one key at a time inside its scheduler step, and asks
``prepare_load`` / ``prepare_store`` for the step's transfers. The rule that
keeps this fast: **one socket round trip per request, never one per key**,
and a request whose blocks kvtier does not hold is answered at once (never
deferred a step). The first ``lookup`` of a request in a step sends one
batched, leasing Lookup for every key of the request from that key on (the
keys vLLM already recorded in the request context); the statuses answer that
key and every later one from memory. kvtier leases each HIT to the request,
so a block the scheduler saw as a HIT is still there at ``prepare_load`` —
no lock between lookup and load (seed 001). HIT_PENDING / RETRY (a write or
a promotion from a secondary tier in flight) are asked again next step.

Completions go one way: vLLM aggregates its workers' reports and calls
``complete_store`` / ``complete_load`` once per job; they are sent without
waiting (calls of one connection are processed in order, so the next call
sees their effect). If vLLM's engine dies, kvtierd releases its session when
the connection closes: leases end, loads unpin, stores fail (seed 003).

kvtierd unreachable: every call answers as if kvtier were empty (MISS, no
store), vLLM recomputes, and a background thread reconnects; the new session
gets a new pool file, which the specs name, so workers remap it.

Not thread-safe by design: vLLM enters a manager from its scheduler thread
only (``lock`` stays vLLM's default no-op).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence

from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    make_offload_key,
)

from kvtier_client import HIT, HIT_PENDING, MISS, RETRY, Client, KvtierError, Request

from .layout import PoolRef
from .transfer import KvtierLoadStoreSpec

log = logging.getLogger("kvtier_vllm")

_RESULT = {
    MISS: LookupResult.MISS,
    HIT: LookupResult.HIT,
    HIT_PENDING: LookupResult.HIT_PENDING,
    RETRY: LookupResult.RETRY,
}

# Errors that mean the connection or session is gone, not that the call was refused.
_LINK_ERRORS = {"TIMEOUT", "CLOSED", "NO_SESSION", "BAD_VERSION", "BAD_REPLY"}


class KvtierLoadError(RuntimeError):
    """prepare_load failed for blocks kvtier had answered HIT: only possible
    if kvtierd went away between the lookup and the load in one step. vLLM
    cannot recompute a load it already planned, so this stops the engine
    with this message rather than hand it bytes that are not there."""


@dataclass
class _Answers:
    """What kvtier said about one request's keys in its last batched Lookup."""

    status: Dict[OffloadKey, int] = field(default_factory=dict)
    step: int = -1          # the manager step it was asked in
    at: float = 0.0         # monotonic time it was asked (leases expire)
    epoch: int = 0          # the link epoch (session) it was asked on


class _Link:
    """The connection to kvtierd, and its replacement when kvtierd goes
    away. ``epoch`` counts sessions: answers and leases from an older epoch
    are void."""

    def __init__(self, address: str, timeout: float, reconnect_s: float, check, poll_us: float):
        self.address, self.timeout, self.reconnect_s = address, timeout, reconnect_s
        self.poll_us = poll_us
        self._check = check  # validates a new session's hello (geometry)
        self.client: Optional[Client] = self._connect()
        self.epoch = 1
        self.pool = self._pool_ref(self.client)
        self._next: Optional[Client] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _connect(self) -> Client:
        c = Client(self.address, name="vllm-scheduler", timeout=self.timeout, poll_us=self.poll_us)
        try:
            self._check(c.hello)
        except Exception:
            c.close()
            raise
        return c

    @staticmethod
    def _pool_ref(c: Client) -> PoolRef:
        return PoolRef.of(c.hello.pool_path, c.hello.block_bytes, c.hello.slots)

    def up(self) -> bool:
        """True when a session is usable; takes over a reconnected one."""
        if self.client is None and self._next is not None:
            self.client, self._next = self._next, None
            self.pool = self._pool_ref(self.client)
            self.epoch += 1
            log.warning("kvtier: reconnected to %s (session %d)",
                        self.address, self.client.hello.session)
        return self.client is not None

    def lost(self, err: Exception) -> None:
        """The session is gone: drop it and reconnect in the background."""
        if self.client is None:
            return
        log.warning("kvtier: lost %s (%s); answering MISS until it is back", self.address, err)
        self.client.close(bye=False)
        self.client = None
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._reconnect, name="kvtier-reconnect",
                                             daemon=True)
            self._thread.start()

    def _reconnect(self) -> None:
        while not self._stop.wait(self.reconnect_s):
            try:
                self._next = self._connect()
                return
            except Exception as e:  # unreachable, or a geometry that no longer fits
                log.debug("kvtier: reconnect to %s failed: %s", self.address, e)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for c in (self.client, self._next):
            if c is not None:
                c.close()
        self.client = self._next = None


class KvtierManager(OffloadingManager):
    def __init__(self, spec):
        self._spec = spec
        cfg = spec.kvtier
        self._link = _Link(cfg["kvtier_address"], float(cfg["kvtier_timeout_s"]),
                           float(cfg["kvtier_reconnect_s"]), self._check_hello, float(cfg["kvtier_poll_us"]))
        self._lookup_ttl = float(cfg["kvtier_lookup_ttl_s"])
        self._single_group = len(spec.config.groups) <= 1
        tpb = spec.tokens_per_block[0] if spec.tokens_per_block else 0
        self._chunk_tokens = tpb * spec.blocks_per_chunk
        self._ns: Optional[str] = None
        self._reqs: Dict[str, Request] = {}
        self._answers: Dict[str, _Answers] = {}
        # Keys each request loaded or offered for storage, in first-seen
        # order: re-ranked for eviction when it finishes (vLLM's LRU order).
        self._seen: Dict[str, Dict[OffloadKey, None]] = {}
        # Keys this manager is writing (prepared, not yet completed).
        self._writing: set = set()
        # complete_store calls in flight per request (answered once readable).
        self._completing: Dict[str, List[int]] = {}
        self._step = 0
        self.round_trips = 0  # synchronous calls made (benchmarks read it)

    def _check_hello(self, hello) -> None:
        self._spec.geometry.check(hello.block_bytes)
        if hello.namespace:
            log.warning("kvtier: kvtierd serves only namespace %r; this engine's keys use "
                        "their own layout namespace and will be refused", hello.namespace)

    # -- keys -------------------------------------------------------------

    def _namespace(self) -> str:
        if self._ns is None:
            self._ns = self._spec.namespace()
            log.info("kvtier: layout namespace %s", self._ns)
        return self._ns

    def _wire(self, keys: Iterable[OffloadKey]) -> list:
        ns = self._namespace()
        return [[ns, bytes(k[:-4]), int.from_bytes(k[-4:], "big")] for k in keys]

    def _unwire(self, keys) -> List[OffloadKey]:
        ns = self._namespace()
        return [make_offload_key(h, g) for n, h, g in keys if n == ns]

    def _req(self, ctx: ReqContext) -> Request:
        r = self._reqs.get(ctx.req_id)
        if r is None:
            # a key stands for one chunk: its events' block size is the chunk's
            r = self._reqs[ctx.req_id] = Request(ctx.req_id, block_size=self._chunk_tokens)
        return r

    # -- calls ------------------------------------------------------------

    def _call(self, fn, *args, **kw):
        """A synchronous call; None when the link is down or goes down."""
        if not self._link.up():
            return None
        self.round_trips += 1
        try:
            return fn(self._link.client, *args, **kw)
        except KvtierError as e:
            if e.code in _LINK_ERRORS:
                self._link.lost(e)
                self._reset_requests()
                return None
            raise

    def _fire(self, op: str, **fields) -> None:
        """A call whose answer nobody needs (completions, touches)."""
        if not self._link.up():
            return
        try:
            self._link.client.send(op, keep=False, **fields)
        except KvtierError as e:
            self._link.lost(e)
            self._reset_requests()

    def _reset_requests(self) -> None:
        # Leases and jobs of a lost session are void; so are its answers.
        self._answers.clear()
        self._completing.clear()
        self._writing.clear()

    # -- lookup -----------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        ans = self._answers.get(req_context.req_id)
        status = None if ans is None else ans.status.get(key)
        if status is None or self._stale(ans, status):
            ans = self._ask(key, req_context)
            if ans is None:
                return LookupResult.MISS
            status = ans.status.get(key, MISS)
        return _RESULT[status]

    def _stale(self, ans: _Answers, status: int) -> bool:
        if ans.epoch != self._link.epoch:
            return True
        if status in (HIT_PENDING, RETRY):
            return ans.step != self._step  # ask again next step
        return time.monotonic() - ans.at > self._lookup_ttl  # before the lease ends

    def _ask(self, key: OffloadKey, ctx: ReqContext) -> Optional[_Answers]:
        """One batched, leasing Lookup for the request's keys from key on
        (all its keys, without a prefix cut, for hybrid models whose groups
        interleave and whose sliding-window groups scan from the end)."""
        keys = self._request_keys(key, ctx)
        wire = self._wire(keys)
        status = self._call(Client.lookup, self._req(ctx), wire, prefix=self._single_group)
        if status is None:
            return None
        ans = _Answers(dict(zip(keys, status)), self._step, time.monotonic(), self._link.epoch)
        self._answers[ctx.req_id] = ans
        return ans

    def _request_keys(self, key: OffloadKey, ctx: ReqContext) -> List[OffloadKey]:
        positions = getattr(ctx, "_offload_key_positions", None) or {}
        at = positions.get(key)
        if at is None:
            return [key]
        if not self._single_group:
            return sorted(positions, key=positions.__getitem__)
        return [k for k, p in sorted(positions.items(), key=lambda kv: kv[1]) if p >= at]

    # -- loads ------------------------------------------------------------

    def prepare_load(self, keys, req_context: ReqContext) -> KvtierLoadStoreSpec:
        keys = list(keys)
        self._answers.pop(req_context.req_id, None)  # leases become pins
        try:
            job = self._call(Client.prepare_load, self._req(req_context), self._wire(keys))
        except KvtierError as e:
            raise KvtierLoadError(f"kvtier refused a load of {len(keys)} leased HIT(s): {e}") from e
        if job is None:
            raise KvtierLoadError(
                f"kvtier went away between lookup and load of {len(keys)} block(s) of "
                f"request {req_context.req_id!r}")
        self._saw(req_context, keys)
        return KvtierLoadStoreSpec(job.slots, self._link.pool)

    def _saw(self, ctx: ReqContext, keys: Iterable[OffloadKey]) -> None:
        seen = self._seen.setdefault(ctx.req_id, {})
        for k in keys:
            seen[k] = None

    def touch(self, keys, req_context: ReqContext) -> None:
        keys = list(keys)
        if keys:  # vLLM's LRU ranks a prefix's root most recent: touch tail first
            self._fire("touch", req=self._req(req_context).wire(),
                       keys=self._wire(reversed(keys)))

    def complete_load(self, keys, req_context: ReqContext) -> None:
        self._fire("complete_load", req=self._req(req_context).wire(), keys=self._wire(keys))

    # -- stores -----------------------------------------------------------

    def prepare_store(self, keys, req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        keys = list(keys)
        try:
            plan = self._call(Client.prepare_store, self._req(req_context), self._wire(keys))
        except KvtierError as e:
            if e.code != "FULL":
                log.warning("kvtier: prepare_store refused: %s", e)
            return None
        if plan is None:
            return None
        to_store = self._unwire(plan.to_store)
        # vLLM's LRU counts a key as used by this request if it stores it or
        # finds it ready; a key another request is still writing is neither.
        self._saw(req_context, (k for k in keys if k not in self._writing))
        self._writing.update(to_store)
        return PrepareStoreOutput(
            keys_to_store=to_store,
            store_spec=KvtierLoadStoreSpec(plan.slots, self._link.pool),
            evicted_keys=self._unwire(plan.evicted),
        )

    def complete_store(self, keys, req_context: ReqContext, success: bool = True) -> None:
        keys = list(keys)
        self._writing.difference_update(keys)
        if keys and self._link.up():
            try:
                rid = self._link.client.send("complete_store", req=self._req(req_context).wire(),
                                             keys=self._wire(keys), ok=bool(success))
            except KvtierError as e:
                self._link.lost(e)
                self._reset_requests()
                return
            self._completing.setdefault(req_context.req_id, []).append(rid)

    # -- requests and steps ---------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self._req(req_context)
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        rid = req_context.req_id
        self._answers.pop(rid, None)
        self._settle(self._completing.pop(rid, ()))
        seen = self._seen.pop(rid, None)
        if seen:
            # vLLM's LRU re-ranks every key a finished request used, its
            # prefix's root most recent; the stores must be readable first
            # (a pending key's rank is its commit).
            pos = req_context.get_offload_key_position
            order = sorted(seen, key=lambda k: pos(k) or 0)
            self.touch(order, req_context)
        req = self._reqs.pop(rid, None)
        if req is not None:
            self._fire("request_finished", req=req.wire())

    def _settle(self, rids: Sequence[int]) -> None:
        """Waits for calls whose effect the next call must see."""
        for r in rids:
            if not self._link.up():
                return
            try:
                self._link.client.wait(r)
            except KvtierError as e:
                if e.code in _LINK_ERRORS:
                    self._link.lost(e)
                    self._reset_requests()
                    return
                log.debug("kvtier: complete_store answered %s", e)

    def on_schedule_end(self, context=None) -> None:
        self._step += 1
        if self._link.up():
            self._link.client.drain()

    def has_pending_work(self) -> bool:
        # Nothing of kvtier's needs an engine step: lookups are answered in
        # the call, completions are the scheduler's own (seed 002).
        return False

    def take_events(self) -> Iterable[OffloadingEvent]:
        # kvtierd publishes the CPU and STORAGE media itself (README, "Run
        # vLLM with kvtier"); vLLM's publisher announces GPU blocks only.
        return ()

    def reset_cache(self) -> None:
        self._reset_requests()
        self._call(Client.reset_cache)

    def shutdown(self) -> None:
        self._link.close()

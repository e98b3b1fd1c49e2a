"""The scheduler side: vLLM's OffloadingManager backed by a kvtierd, with no
blocking round trip on the common path (docs/VLLM.md, "The scheduler step").

vLLM calls the manager from its scheduler thread, inside every step, in this
order (vLLM 0.32/0.33 ``offloading/scheduler.py``):

1. ``lookup`` per key of each waiting request (a RETRY does not stop the
   scan; a MISS does), then ``prepare_load`` for the hits it schedules;
2. ``on_schedule_end`` (inside ``build_connector_meta``), then the step's
   ``prepare_store`` calls, then ``on_request_finished`` for the requests
   that finished — whose store jobs may still be in flight;
3. after the model ran, ``complete_store`` / ``complete_load`` as the
   workers' jobs finish: possibly after that request's
   ``on_request_finished`` (late completions).

What each call costs here:

- **lookup** reads the daemon's residency index, and asks kvtierd about
  held keys without waiting (lookups.py); the lease is the guarantee: a HIT
  the scheduler acts on is not evicted before its pin.
- **prepare_load** builds the load spec from those slots; the pin is sent
  ahead, on the same ordered connection, of the completion.
- **prepare_store** takes slots from the session's *credit* (slots the
  daemon reserved for it ahead of need) and binds them to the keys in a
  ``store`` message sent without waiting; a key another engine stored
  meanwhile is settled by the daemon (its slot stays in the credit).
  Credit is sized by the next step's stores and asked for, without
  waiting, before the forward pass; when it runs short anyway, one
  synchronous ``grant`` a step, then a synchronous ``prepare_store``
  (counted in ``blocking_calls``).
- **complete_*, touch, on_request_finished** are queued and never wait.

What a step queues goes out in one write at each of three points:
``on_schedule_end``, the first completion after it, the first lookup or load
after that; ``has_pending_work`` is true while something is queued, so an
idle engine steps once more to send it. Replies are read without blocking at
the same points.

State is bounded: a request's state lives from its first call to its
``on_request_finished``; late completions never re-create it; a store's
record lives until its completion and the daemon's answer to it.

kvtierd unreachable, or answering that it knows no session of ours (a
restarted kvtierd; over ZeroMQ the old socket reconnects to it by itself):
every call answers as if kvtier were empty (MISS, no store), vLLM
recomputes, and a background thread reconnects; the new session
gets a new pool file, which the specs name, so workers remap it.

Not thread-safe by design: vLLM enters a manager from its scheduler thread
only (``lock`` stays vLLM's default no-op).
"""

from __future__ import annotations

import logging
import time
from typing import Dict, Iterable, List, Optional

from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)

from kvtier_client import Client, KvtierError, Request

from .calls import GrantCall, LookupCall, StoreBatch, StoreCall
from .credit import Credit
from .keys import Keys
from .layout import KvtierConfigError
from .link import Link
from .lookups import Lookups, RequestState
from .session import Session
from .stores import Stores
from .transfer import KvtierLoadStoreSpec

log = logging.getLogger("kvtier_vllm")

class KvtierLoadError(RuntimeError):
    """prepare_load failed for blocks kvtier had answered HIT: only possible
    if kvtierd went away between the lookup and the load in one step. vLLM
    cannot recompute a load it already planned, so this stops the engine
    with this message rather than hand it bytes that are not there."""


class KvtierManager(OffloadingManager):
    """vLLM's calls, in vLLM's order, on the parts that hold the state: the
    link (link.py), the calls in flight (calls.py), lookups (lookups.py),
    stores (stores.py) and credit (credit.py)."""

    def __init__(self, spec):
        self._spec = spec
        cfg = spec.kvtier
        tpb = spec.tokens_per_block[0] if spec.tokens_per_block else 0
        self._keys = Keys(spec, cfg["kvtier_address"], self._served_namespace)
        self._stores = Stores()
        self._credit = Credit(int(cfg["kvtier_store_credit"]))
        self._step = 0
        self._step_clock = time.monotonic()  # the step's time (answers' age), read once a step
        # Flush points (one write each): on_schedule_end; the first
        # completion after it (the step's stores and ends); the first lookup
        # or load after that (the completions).
        self._flush_at_completion = False
        self._flush_at_schedule = False
        # Counters (the benchmark and tests read them).
        self.refused_loads = 0      # pins the daemon refused after the load was planned
        self.refused_commits = 0    # store completions the daemon refused (blocks never readable)
        self.last_refusal = None
        self.store_fallbacks = 0    # prepare_store calls that waited (credit short)
        self.load_fallbacks = 0     # prepare_load calls that waited (no leased slot known)
        self._link = Link(cfg["kvtier_address"], float(cfg["kvtier_timeout_s"]),
                          float(cfg["kvtier_reconnect_s"]), self._check_hello,
                          float(cfg["kvtier_poll_us"]), spec.geometry.slot_bytes_needed,
                          spec.events_topic())
        self._s = Session(self._link, self._settled, self._refused, self._voided)
        self._s.begun = self._session_begun
        self._lookups = Lookups(tpb * spec.blocks_per_chunk, float(cfg["kvtier_lookup_ttl_s"]),
                                len(spec.config.groups) <= 1, self._keys, self._s, self._stores.batches)
        self._session_begun()

    @property
    def blocking_calls(self) -> int:
        """Calls that waited on kvtierd."""
        return self._s.blocking_calls

    @property
    def refused_stores(self) -> int:
        """Store messages the daemon refused."""
        return self._stores.refused

    def _check_hello(self, hello) -> None:
        lacks = [name for name in ("batch", "credit", "packed_keys") if not getattr(hello, name, False)]
        if lacks:
            # NB: every kvtierd of this release serves them; the connector
            # keeps no path for one that does not.
            raise KvtierConfigError(f"kvtierd at {self._spec.kvtier['kvtier_address']} does not serve "
                                    f"{', '.join(lacks)}: run the kvtierd of this kvtier release")
        self._spec.geometry.check(hello.block_bytes)
        self._keys.check_served(hello.namespace)

    def _served_namespace(self) -> str:
        c = self._link.client if hasattr(self, "_link") else None
        return c.hello.namespace if c is not None else ""

    # -- the connection ---------------------------------------------------

    def _session_begun(self) -> None:
        """A new session: its credit starts with one synchronous grant."""
        if self._credit.on(self._link.client):
            self._credit.begun(self._s.grant)

    def _voided(self) -> None:
        """The session is gone: its leases, stores and credit with it."""
        self._lookups.void()
        self._stores.void()
        self._credit.void()

    def _flush_before_schedule(self) -> None:
        if self._flush_at_schedule or self._flush_at_completion:
            self._flush_at_schedule = self._flush_at_completion = False
            self._step_clock = time.monotonic()
            self._s.flush()

    def _flush_before_completion(self) -> None:
        if self._flush_at_completion:
            self._flush_at_completion, self._flush_at_schedule = False, True
            self._s.flush()

    # -- replies ----------------------------------------------------------

    def _settled(self, call, reply: dict) -> None:
        if isinstance(call, LookupCall):
            err = self._lookups.answered(call, reply, self._step)
            if err:
                log.debug("kvtier: leasing lookup refused: %s", err)
        elif isinstance(call, StoreCall):
            self._stores.answered(call, reply)
            self._settle(call.batch)
        elif isinstance(call, GrantCall):
            self._credit.granted(call, reply, self._link.epoch, self._keys.unwire)

    def _refused(self, err: dict) -> None:
        """A quiet call failed: its error is its only reply."""
        op = err.get("op") if isinstance(err, dict) else None
        if op == "prepare_load":
            self.refused_loads += 1
            self.last_refusal = err
            log.warning("kvtier: a planned load's pin was refused: %s", err)
        elif op == "complete_store":
            self.refused_commits += 1
            log.debug("kvtier: a store's completion was refused: %s", err)
        else:
            log.debug("kvtier: a call without reply failed: %s", err)

    # -- lookup -----------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        # NB: per key, inside vLLM's scheduler step: the common paths avoid
        # calls and attribute chains.
        if self._flush_at_schedule or self._flush_at_completion:
            self._flush_before_schedule()
        if self._keys.ns is None:
            self._keys.namespace()  # NB: not before: vLLM seeds its root hash after building us
        lookups = self._lookups
        r = lookups.reqs.get(req_context.req_id) or lookups.req(req_context)
        if r.scan_step != self._step:
            lookups.scan(r, req_context, self._step)
        res = lookups.find(r, key, req_context, self._step, self._step_clock)
        if res is LookupResult.HIT:
            r.scan_hits += 1
        elif res is not LookupResult.MISS:
            r.scan_deferred = True
        return res

    # -- loads ------------------------------------------------------------

    def prepare_load(self, keys, req_context: ReqContext) -> KvtierLoadStoreSpec:
        self._flush_before_schedule()
        keys = list(keys)
        r = self._lookups.req(req_context)
        slots = self._lookups.leased(r, keys)
        r.seen.update(dict.fromkeys(keys))
        if slots is not None and self._s.up():
            # The lease becomes a pin: sent ahead of the completion, on the
            # same ordered connection; the workers copy meanwhile.
            self._s.queue("prepare_load", quiet=True, req=r.wire, **self._keys.fields(keys))
            return KvtierLoadStoreSpec(slots, self._link.pool)
        self.load_fallbacks += 1
        try:
            job = self._s.call(Client.prepare_load, Request(req_context.req_id), self._keys.wire(keys))
        except KvtierError as e:
            raise KvtierLoadError(f"kvtier refused a load of {len(keys)} leased HIT(s): {e}") from e
        if job is None:
            raise KvtierLoadError(
                f"kvtier went away between lookup and load of {len(keys)} block(s) of "
                f"request {req_context.req_id!r}")
        return KvtierLoadStoreSpec(job.slots, self._link.pool)

    def touch(self, keys, req_context: ReqContext) -> None:
        keys = list(keys)
        if keys and self._s.up():  # vLLM's LRU ranks a prefix's root most recent: touch tail first
            self._s.queue("touch", req=self._lookups.wire(req_context), **self._keys.fields(keys[::-1]))

    def complete_load(self, keys, req_context: ReqContext) -> None:
        self._flush_before_completion()
        keys = list(keys)
        if keys and self._s.up():
            self._s.queue("complete_load", req=self._lookups.wire(req_context), **self._keys.fields(keys))

    # -- stores -----------------------------------------------------------

    def prepare_store(self, keys, req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        keys = list(keys)
        r = self._lookups.req(req_context)
        if not self._s.up():
            return None
        self._keys.namespace()
        writing, credit = self._stores.batches, self._credit
        offered = [k for k in dict.fromkeys(keys) if k not in writing]  # NB: once each, in order
        r.seen.update(dict.fromkeys(offered))
        index, fp = self._link.index, self._keys.fp
        to_store = offered
        if index is not None and offered and (
                not credit.on(self._link.client) or index.held_cpu(fp, offered[0])):
            # NB: through credit, the whole store is probed only when its
            # first block is held (another engine stored the prefix, or a
            # chain has a gap): a later duplicate is settled by the daemon
            # (its slot stays credit), at the cost of one needless copy.
            to_store = index.not_held_cpu(fp, offered)
        evicted = credit.take_evicted()
        if not to_store:
            return PrepareStoreOutput(keys_to_store=[], store_spec=KvtierLoadStoreSpec([], self._link.pool),
                                      evicted_keys=evicted)
        if len(to_store) > len(credit.slots) and credit.granting:
            self._s.flush(send=False)  # a grant may have come since on_schedule_end
        if len(to_store) > len(credit.slots) and index is not None and credit.on(self._link.client):
            credit.grant_now(len(to_store), self._step, self._s.grant, self._keys.unwire)
        if len(to_store) > len(credit.slots) or self._link.index is None:
            return self._prepare_store_now(keys, len(to_store), r, evicted)
        slots = credit.take(len(to_store))
        b = self._stores.bind(to_store, slots, r.wire, self._link.epoch)
        self._s.queue("store", StoreCall(b), req=r.wire, slots=slots, **self._keys.fields(to_store))
        credit.refill(self._s.out, self._link.client, self._link.epoch)
        return PrepareStoreOutput(keys_to_store=to_store,
                                  store_spec=KvtierLoadStoreSpec(slots, self._link.pool),
                                  evicted_keys=evicted)

    def _prepare_store_now(self, keys, short: int, r: RequestState, evicted) -> Optional[PrepareStoreOutput]:
        """Credit short (or no index): the synchronous prepare_store."""
        self.store_fallbacks += 1
        self._credit.refill(self._s.out, self._link.client, self._link.epoch, short)
        try:
            plan = self._s.call(Client.prepare_store, Request(r.wire["id"]), self._keys.wire(keys))
        except KvtierError as e:
            if e.code != "FULL":
                log.warning("kvtier: prepare_store refused: %s", e)
            return None
        if plan is None:
            return None
        stored = self._keys.unwire(plan.to_store)
        self._stores.bind(stored, list(plan.slots), r.wire, self._link.epoch, bound=True)
        return PrepareStoreOutput(keys_to_store=stored,
                                  store_spec=KvtierLoadStoreSpec(plan.slots, self._link.pool),
                                  evicted_keys=evicted + self._keys.unwire(plan.evicted))

    def complete_store(self, keys, req_context: ReqContext, success: bool = True) -> None:
        self._flush_before_completion()
        for b in self._stores.complete(keys, success):
            self._settle(b)

    def _settle(self, b: StoreBatch) -> None:
        self._stores.settle(b, self._link.epoch, self._credit, self._commit)

    def _commit(self, b: StoreBatch, keys: List[OffloadKey], ok: bool) -> None:
        if self._s.up():
            # NB: quiet: its reply only says why the blocks are not
            # readable, read later, never waited for (refused_commits).
            self._s.queue("complete_store", quiet=True, req=b.req, ok=ok, **self._keys.fields(keys))

    # -- requests and steps ---------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self._lookups.req(req_context)
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        r = self._lookups.reqs.pop(req_context.req_id, None)
        if r is None or not self._s.up():
            return
        if r.seen:
            # vLLM's LRU re-ranks every key a finished request used, its
            # prefix's root most recent.
            pos = req_context.get_offload_key_position
            order = sorted(r.seen, key=lambda k: pos(k) or 0)
            self._s.queue("touch", req=r.wire, **self._keys.fields(order[::-1]))
        self._s.queue("request_finished", req=r.wire)

    def on_schedule_end(self, context=None) -> None:
        self._step += 1
        self._step_clock = time.monotonic()
        self._credit.predict(self._lookups.predicted_stores())
        if not self._s.up():
            return
        # NB: credit is refilled after a step's stores (at its first
        # completion): the next step's stores find it there, so the peak of
        # recent steps, with a margin, is enough.
        if self._stores.awaiting and self._stores.overdue(self._link.timeout):
            self._s.lost(KvtierError("LINK_TIMEOUT", f"no store reply within {self._link.timeout}s"))
            return
        self._lookups.ask_queued()
        self._credit.refill(self._s.out, self._link.client, self._link.epoch)
        self._s.flush()
        self._flush_at_completion, self._flush_at_schedule = True, False
        self._lookups.read_this_step = False

    def has_pending_work(self) -> bool:
        # Only something queued and not yet sent, or a completed store's
        # answer (bounded by the link's timeout), needs another engine step
        # (seed 002: never true for long).
        return bool(self._s.out.frames) or bool(self._stores.awaiting)

    def take_events(self) -> Iterable[OffloadingEvent]:
        # kvtierd publishes the CPU and STORAGE media itself (README, "Run
        # vLLM with kvtier"); vLLM's publisher announces GPU blocks only.
        return ()

    def reset_cache(self) -> None:
        self._lookups.void()  # NB: leases from before a reset are gone
        self._stores.drop_writes()
        self._s.call(Client.reset_cache)

    def shutdown(self) -> None:
        self._s.flush()
        self._link.close()

    # -- introspection (tests, benchmarks) --------------------------------

    def settle(self, timeout: float = 10.0) -> None:
        """Tests and tools only (it waits; vLLM's path never calls it):
        sends what is queued, waits for every reply the manager reads, and
        forgets the answers that said "ask again" (RETRY, HIT_PENDING), so
        the next lookup asks anew."""
        if self._s.up():
            self._lookups.ask_queued()
        self._s.drain(timeout)
        self._lookups.forget_deferred()

    def state_sizes(self) -> Dict[str, int]:
        """How much per-request and per-store state the manager holds."""
        return {"requests": len(self._lookups.reqs), "stores": len(self._stores.batches),
                "calls": len(self._s.out.awaited),
                "queued": len(self._s.out.frames), "credit": len(self._credit.slots)}

"""Lookups: vLLM asks per key, inside its scheduler step, and must not wait.

A key the residency index does not hold is a MISS at once. A held key
answers RETRY and joins its request's leasing Lookup, sent without waiting
at ``on_schedule_end``; the reply carries each HIT's slot, so the next
step's lookup of that key answers HIT from memory (the lease keeps the
block until its load's pin). Per request, the Lookup runs through three
phases (:class:`Phase`); every answer belongs to a *generation* of lookups,
which a lost session or ``reset_cache`` ends: answers, asks and replies of
an older generation are void.

The index holds a key being written (state 3) as well as a readable one:
a key whose store this engine completed is asked about, not recomputed,
while its commit is still landing, and so is a key another engine is
writing (kvtierd answers it pending, as vLLM's own tier answers a block
it is still writing).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext

from kvtier_client import HIT, HIT_PENDING, MISS, RETRY, Client, KvtierError

from .calls import LookupCall, StoreBatch
from .keys import Keys

if TYPE_CHECKING:
    from .session import Session

_RESULT = {
    MISS: LookupResult.MISS,
    HIT: LookupResult.HIT,
    HIT_PENDING: LookupResult.RETRY,  # NB: vLLM waits for kvtier's write as for a RETRY
    RETRY: LookupResult.RETRY,
}


class Phase(enum.Enum):
    """Where a request's leasing Lookup stands."""

    IDLE = "idle"              # nothing to ask
    COLLECTING = "collecting"  # held keys gathered this step; sent at on_schedule_end
    ASKING = "asking"          # sent; answered by a later step


class Answer(NamedTuple):
    """kvtierd's answer for one key, as a lookup re-reads it."""

    status: int      # HIT, MISS, HIT_PENDING or RETRY
    slot: int        # a HIT's leased slot
    step: int        # the step it was answered in
    at: float        # when (monotonic): a HIT's lease lasts the lookup TTL
    generation: int  # the lookup generation it belongs to


@dataclass
class RequestState:
    """One request's state, from its first call to on_request_finished."""

    wire: dict                                  # its ReqContext on the wire
    generation: int                             # the lookup generation of its answers and asks
    phase: Phase = Phase.IDLE
    answers: Dict[OffloadKey, Answer] = field(default_factory=dict)
    ask: Dict[OffloadKey, None] = field(default_factory=dict)  # keys for this step's leasing Lookup
    asking: int = 0                             # the Lookup's call id while ASKING
    asked_at: float = 0.0                       # when it was sent (monotonic)
    seen: Dict[OffloadKey, None] = field(default_factory=dict)  # re-ranked for eviction at the end
    # This step's scan (lookups): the stores it predicts for the next step.
    scan_step: int = -1
    scan_hits: int = 0
    scan_deferred: bool = False
    scan_keys: int = 0

    def collect(self, key: OffloadKey) -> None:
        self.ask[key] = None
        self.phase = Phase.COLLECTING

    def sent(self, rid: int, now: float) -> None:
        """The collected keys are asked, by call rid."""
        self.ask.clear()
        self.asking, self.asked_at, self.phase = rid, now, Phase.ASKING

    def void(self, generation: int) -> None:
        """A new generation: what this request was told or asking is void."""
        self.answers.clear()
        self.ask.clear()
        self.asking, self.phase, self.generation = 0, Phase.IDLE, generation


class Lookups:
    """The requests' lookup state."""

    def __init__(self, chunk_tokens: int, ttl: float, single_group: bool, keys: Keys,
                 session: "Session", writing: Dict[OffloadKey, StoreBatch]):
        self._chunk_tokens = chunk_tokens
        self._ttl = ttl                    # a HIT's lease, as the lookups count on it
        self._single_group = single_group  # a lookup's keys are a prefix: asked as one
        self._keys = keys
        self._s = session
        self._writing = writing            # keys this engine is writing (Stores.batches)
        self.read_this_step = False        # a lookup found its answer missing and read
        self.reqs: Dict[str, RequestState] = {}
        self.generation = 0
        self.scanned: List[RequestState] = []  # requests whose scan began this step

    def req(self, ctx: ReqContext) -> RequestState:
        r = self.reqs.get(ctx.req_id)
        if r is None:
            r = self.reqs[ctx.req_id] = RequestState(self.wire(ctx), self.generation)
        return r

    def wire(self, ctx: ReqContext) -> dict:
        """The request's context on the wire, without creating its state
        (late completions come after on_request_finished)."""
        r = self.reqs.get(ctx.req_id)
        if r is not None:
            return r.wire
        # A key stands for one chunk: its events' block size is the chunk's.
        if self._chunk_tokens:
            return {"id": ctx.req_id, "block_size": self._chunk_tokens}
        return {"id": ctx.req_id}

    def scan(self, r: RequestState, ctx: ReqContext, step: int) -> None:
        """The first lookup of r in this step begins its scan."""
        r.scan_step, r.scan_hits, r.scan_deferred = step, 0, False
        r.scan_keys = len(getattr(ctx, "_offload_key_positions", None) or ())
        self.scanned.append(r)

    def predicted_stores(self) -> int:
        """The blocks the requests scanned this step and did not defer will
        store next step (those past their hits)."""
        need = sum(max(0, r.scan_keys - r.scan_hits) for r in self.scanned if not r.scan_deferred)
        self.scanned.clear()
        return need

    def find(self, r: RequestState, key: OffloadKey, ctx: ReqContext, step: int,
             clock: float) -> LookupResult:
        """vLLM's lookup of key, answered from r's answers, the engine's own
        writes or the residency index; a held key joins r's next Lookup."""
        a = r.answers.get(key) if r.answers else None
        if a is not None:
            # A HIT holds (leased) until the lookup TTL; anything else is
            # this step's answer only (a block may be promoted or stored by
            # the next). NB: unpacked, not read by name: per key, per step.
            st, _, at_step, at, gen = a
            if gen == self.generation and clock - at <= self._ttl and (st == HIT or at_step == step):
                return _RESULT[st]
            del r.answers[key]  # stale: ask again
        if key in self._writing:
            return LookupResult.HIT_PENDING  # this engine is writing it
        s = self._s
        link = s.link
        client = link.client
        if client is None:
            if not s.up():
                return LookupResult.MISS
            client = link.client
        index = link.index
        if index is None:
            return self._find_now(key, ctx, step)
        # NB: a key being written (an engine's store, its commit still
        # landing; a promotion) is in the index too: asked, never a MISS.
        if not index.held(self._keys.fp, key) and client.hello.index_complete:  # type: ignore[union-attr]
            return LookupResult.MISS  # nothing asked: the index covers every tier
        if not r.asking:
            r.collect(key)
        elif not self.read_this_step:
            # Its answer may have come since the last read: one
            # non-blocking read a step, then ask this key again.
            self.read_this_step = True
            s.flush(send=False)
            if key in r.answers:
                return self.find(r, key, ctx, step, clock)
        elif time.monotonic() - r.asked_at > link.timeout:
            s.lost(KvtierError("LINK_TIMEOUT", f"no lookup reply within {link.timeout}s"))
            return LookupResult.MISS
        return LookupResult.RETRY

    def _find_now(self, key: OffloadKey, ctx: ReqContext, step: int) -> LookupResult:
        """Without a residency index (its file unusable): one synchronous,
        leasing Lookup for the request's keys from key on."""
        r = self.req(ctx)
        keys = self.request_keys(key, ctx, self._single_group)
        reply = self._s.call(Client._call, "lookup", req=r.wire, prefix=self._single_group,
                             want_slots=True, **self._keys.fields(keys))
        if reply is None:
            return LookupResult.MISS
        self.record(r, keys, reply, step)
        return _RESULT[r.answers[key].status] if key in r.answers else LookupResult.MISS

    def ask_queued(self) -> None:
        """Queues one leasing Lookup per request whose keys the index holds
        (their statuses and slots come back by the next step)."""
        gen, now = self.generation, time.monotonic()
        for r in self.to_ask():
            keys = list(r.ask)
            rid = self._s.queue("lookup", LookupCall(r.wire["id"], keys, gen), req=r.wire,
                                prefix=self._single_group, want_slots=True, **self._keys.fields(keys))
            r.sent(rid, now)

    def answered(self, call: LookupCall, reply: dict, step: int) -> Optional[dict]:
        """Records a leasing Lookup's answers; returns its error, if any."""
        r = self.reqs.get(call.req_id)
        if r is None or call.generation != self.generation or r.generation != self.generation:
            return None  # finished meanwhile (request_finished released its leases), or void
        r.asking, r.phase = 0, Phase.IDLE
        err = reply.get("err")
        if err:
            return err
        self.record(r, call.keys, reply, step)
        return None

    def record(self, r: RequestState, keys: List[OffloadKey], reply: dict, step: int) -> None:
        status, slots = reply["status"], reply.get("slots") or ()
        now, gen, answers = time.monotonic(), self.generation, r.answers
        if len(status) == len(keys) == len(slots):
            for k, st, slot in zip(keys, status, slots):
                answers[k] = Answer(st, slot, step, now, gen)
            return
        for i, k in enumerate(keys):
            answers[k] = Answer(status[i] if i < len(status) else MISS,
                                slots[i] if i < len(slots) else 0, step, now, gen)

    def to_ask(self) -> List[RequestState]:
        """The requests whose collected keys are to be asked now (none of
        theirs in flight); the caller sends each (RequestState.sent)."""
        return [r for r in self.reqs.values() if r.ask and not r.asking]

    def leased(self, r: RequestState, keys: List[OffloadKey]) -> Optional[List[int]]:
        """The slots of keys when every one is a HIT leased in this
        generation (taken: a load uses a lease once), else None."""
        slots: List[int] = []
        for k in keys:
            a = r.answers.pop(k, None)
            if a is None or a.status != HIT or a.generation != self.generation:
                return None
            slots.append(a.slot)
        return slots

    def forget_deferred(self) -> None:
        """Forgets the answers that said "ask again" (RETRY, HIT_PENDING):
        the next lookup of their keys asks anew."""
        for r in self.reqs.values():
            for k in [k for k, a in r.answers.items() if a.status in (RETRY, HIT_PENDING)]:
                del r.answers[k]

    def void(self) -> None:
        """Ends the generation: every request's answers and asks are void."""
        self.generation += 1
        for r in self.reqs.values():
            r.void(self.generation)

    @staticmethod
    def request_keys(key: OffloadKey, ctx: ReqContext, single_group: bool) -> List[OffloadKey]:
        """The request's keys a synchronous lookup of key asks about."""
        positions = getattr(ctx, "_offload_key_positions", None) or {}
        at = positions.get(key)
        if at is None:
            return [key]
        if not single_group:
            return sorted(positions, key=positions.__getitem__)
        return [k for k, p in sorted(positions.items(), key=lambda kv: kv[1]) if p >= at]

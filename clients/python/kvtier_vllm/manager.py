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

- **lookup** reads the daemon's residency index (shared memory, no
  syscall). A key it does not hold is a MISS at once, with no message. A
  held key answers RETRY and joins the request's leasing Lookup, sent
  without waiting at ``on_schedule_end``; its reply carries each HIT's
  slot, so the next step's lookup answers HIT from memory. The lease is the
  guarantee: a HIT the scheduler acts on is not evicted before its pin.
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
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

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
from kvtier_client.residency import Residency, ns_fingerprint

from .layout import KvtierConfigError, PoolRef
from .transfer import KvtierLoadStoreSpec

log = logging.getLogger("kvtier_vllm")



_RESULT = {
    MISS: LookupResult.MISS,
    HIT: LookupResult.HIT,
    HIT_PENDING: LookupResult.HIT_PENDING,
    RETRY: LookupResult.RETRY,
}

# Errors that mean the connection or session is gone, not that one call was
# refused. NB: not TIMEOUT: the daemon's TIMEOUT answers one slow call on a
# live session (a call this client timed out on is raised as LINK_TIMEOUT).
_LINK_ERRORS = {"CLOSED", "NO_SESSION", "BAD_VERSION", "BAD_REPLY", "LINK_TIMEOUT"}


def _link_error(err) -> bool:
    """An error reply that says the session is gone (not one call refused)."""
    return isinstance(err, dict) and err.get("code") in _LINK_ERRORS


class KvtierLoadError(RuntimeError):
    """prepare_load failed for blocks kvtier had answered HIT: only possible
    if kvtierd went away between the lookup and the load in one step. vLLM
    cannot recompute a load it already planned, so this stops the engine
    with this message rather than hand it bytes that are not there."""


@dataclass
class _Req:
    """One request's state, from its first call to on_request_finished."""

    wire: dict                                  # its ReqContext on the wire
    # key → (status, slot, step answered, monotonic time, epoch)
    answers: Dict[OffloadKey, Tuple[int, int, int, float, int]] = field(default_factory=dict)
    ask: Dict[OffloadKey, None] = field(default_factory=dict)  # keys for this step's leasing Lookup
    asking: int = 0                             # id of the leasing Lookup in flight; 0: none
    asked_at: float = 0.0                       # when it was sent (monotonic)
    seen: Dict[OffloadKey, None] = field(default_factory=dict)  # re-ranked for eviction at the end
    # This step's scan (lookups): the stores it predicts for the next step.
    scan_step: int = -1
    scan_hits: int = 0
    scan_deferred: bool = False
    scan_keys: int = 0


@dataclass
class _StoreBatch:
    """One ``store`` message: keys bound to credited slots. Lives until every
    key was completed (and the daemon said which keys it bound)."""

    keys: List[OffloadKey]
    slots: List[int]
    req: dict                           # the request's wire context
    epoch: int
    bound: Optional[List[bool]] = None  # the daemon's answer; None until it came
    failed: bool = False                # the daemon refused the store: no slot is ours to reuse
    open: int = 0                       # keys not completed yet
    completed: Dict[OffloadKey, None] = field(default_factory=dict)  # keys completed (each once)
    queued: float = 0.0                 # when the store was queued (monotonic): its answer is due
    deferred: List[Tuple[List[OffloadKey], bool]] = field(default_factory=list)  # completions awaiting `bound`


class _Link:
    """The connection to kvtierd, and its replacement when kvtierd goes
    away. ``epoch`` counts sessions: answers, leases and credit from an
    older epoch are void."""

    def __init__(self, address: str, timeout: float, reconnect_s: float, check, poll_us: float,
                 block_bytes: int = 0, topic: str = ""):
        self.address, self.timeout, self.reconnect_s = address, timeout, reconnect_s
        self.poll_us = poll_us
        self.block_bytes = block_bytes  # declared in hello: a kvtierd with no block size takes it
        self.topic = topic  # declared in hello: kvtierd announces this engine's blocks under it
        self._check = check  # validates a new session's hello (geometry, namespace)
        self.client: Optional[Client] = None
        self.epoch = 0
        self.pool: Optional[PoolRef] = None
        self.index: Optional[Residency] = None
        self._next: Optional[Client] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._failure = ""  # the last reconnect failure logged (each new one once)
        try:
            self._take(self._connect())
        except KvtierConfigError:
            raise  # a kvtierd that serves, but cannot serve this engine: say so at start
        except (KvtierError, OSError) as e:
            # NB: vLLM starts all the same, recomputing (every lookup a
            # MISS), and takes kvtierd on once it serves (up()).
            log.warning("kvtier: kvtierd not reachable at %s (%s); recomputing until it "
                        "serves (retrying every %gs)", address, e, reconnect_s)
            self._start_reconnect()

    def _take(self, c: Client) -> None:
        """Makes c the session: a new epoch voids the older one's answers."""
        self.client, self.epoch = c, self.epoch + 1
        self.pool = self._pool_ref(c)
        self.index = self._index(c)

    def _connect(self) -> Client:
        c = Client(self.address, name="vllm-scheduler", timeout=self.timeout, poll_us=self.poll_us,
                   block_bytes=self.block_bytes, topic=self.topic)
        try:
            self._check(c.hello)
        except Exception:
            c.close()
            raise
        return c

    @staticmethod
    def _pool_ref(c: Client) -> PoolRef:
        return PoolRef.of(c.hello.pool_path, c.hello.block_bytes, c.hello.slots)

    @staticmethod
    def _index(c: Client) -> Optional[Residency]:
        if not c.hello.index_path:
            return None
        try:
            return Residency(c.hello.index_path)
        except (OSError, ValueError) as e:
            log.warning("kvtier: residency index %s unusable (%s); lookups ask kvtierd",
                        c.hello.index_path, e)
            return None

    def up(self) -> bool:
        """True when a session is usable; takes over a reconnected one."""
        if self.client is None and self._next is not None:
            first = self.epoch == 0
            c, self._next = self._next, None
            self._take(c)
            log.warning("kvtier: %s %s (session %d)", "connected to" if first else "reconnected to",
                        self.address, c.hello.session)
        return self.client is not None

    def lost(self, err: Exception) -> None:
        """The session is gone: drop it and reconnect in the background."""
        if self.client is None:
            return
        log.warning("kvtier: lost %s (%s); answering MISS until it is back", self.address, err)
        self.client.close(bye=False)
        self.client = None
        if self.index is not None:
            self.index.close()
            self.index = None
        self._start_reconnect()

    def _start_reconnect(self) -> None:
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
                self._log_failure(e)

    def _log_failure(self, e: Exception) -> None:
        """Unreachable is expected while kvtierd is away (debug); a kvtierd
        that answers but cannot serve this engine is said once per cause."""
        if not isinstance(e, KvtierConfigError):
            log.debug("kvtier: reconnect to %s failed: %s", self.address, e)
        elif str(e) != self._failure:
            self._failure = str(e)
            log.warning("kvtier: %s cannot serve this engine: %s", self.address, e)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for c in (self.client, self._next):
            if c is not None:
                c.close()
        if self.index is not None:
            self.index.close()
        self.client = self._next = self.index = None


class KvtierManager(OffloadingManager):
    def __init__(self, spec):
        self._spec = spec
        cfg = spec.kvtier
        self._lookup_ttl = float(cfg["kvtier_lookup_ttl_s"])
        self._credit_min = int(cfg["kvtier_store_credit"])
        self._single_group = len(spec.config.groups) <= 1
        tpb = spec.tokens_per_block[0] if spec.tokens_per_block else 0
        self._chunk_tokens = tpb * spec.blocks_per_chunk
        self._ns: Optional[str] = None
        self._nsfp = 0
        self._reqs: Dict[str, _Req] = {}
        self._stores: Dict[OffloadKey, _StoreBatch] = {}  # keys this manager is writing
        # Batches completed (some keys) whose store the daemon has not
        # answered yet: their keys stay HIT_PENDING meanwhile, so an answer
        # that does not come within the link's timeout means the link is gone.
        self._awaiting: Dict[int, _StoreBatch] = {}
        # Keys whose store this manager completed in the last steps: their
        # commit may not be in the index yet (it lands a little after the
        # completion is sent), so a lookup asks kvtierd instead of MISS.
        # Keys whose commit was sent, until the residency index holds them
        # (monotonic time sent): asked about, never a MISS from the index.
        # Oldest first: a step drops the expired from the front, and a
        # lookup the landed key it meets — no step probes every key in flight.
        self._committing: "OrderedDict[OffloadKey, float]" = OrderedDict()
        self._calls: Dict[int, tuple] = {}  # id → what its reply settles
        self._out: List[bytes] = []         # frames queued, sent at the next flush
        self._keep: List[int] = []          # ids among them whose replies are read
        self._credit: List[int] = []        # slots the daemon reserved for our stores
        self._granting = 0                  # slots asked for and not yet granted
        # Credit is sized by what the next step will store: the keys past the
        # hits of the requests this step scanned and did not defer (their
        # prefill's blocks, stored at the next step's build_connector_meta).
        self._credit_target = self._credit_min
        self._scanned: List[_Req] = []      # requests whose scan began this step
        self._need_now = 0                  # stores predicted for this step's meta
        self._need_next = 0                 # ... for the next step's
        self._evicted: List[OffloadKey] = []  # evictions granting made, for the next store's output
        self._step = 0
        # Flush points (one write each): on_schedule_end; the first
        # completion after it (the step's stores and ends); the first lookup
        # or load after that (the completions).
        self._flush_at_completion = False
        self._flush_at_schedule = False
        self._read_this_step = False  # a lookup found its answer missing and read
        self._step_clock = time.monotonic()  # the step's time (answers' age), read once a step
        self._granted_now_step = -1    # the step credit was granted synchronously in
        # Counters (the benchmark and tests read them).
        self.blocking_calls = 0     # calls that waited on kvtierd
        self.refused_loads = 0      # pins the daemon refused after the load was planned
        self.refused_stores = 0     # store messages the daemon refused
        self.refused_commits = 0    # store completions the daemon refused (blocks never readable)
        self.last_refusal = None
        self._resets = 0            # reset_cache calls: lookups asked before one are void
        self.store_fallbacks = 0    # prepare_store calls that waited (credit short)
        self.load_fallbacks = 0     # prepare_load calls that waited (no leased slot known)
        self._link = _Link(cfg["kvtier_address"], float(cfg["kvtier_timeout_s"]),
                           float(cfg["kvtier_reconnect_s"]), self._check_hello,
                           float(cfg["kvtier_poll_us"]), spec.geometry.slot_bytes_needed,
                           spec.events_topic())
        self._session_begun()

    def _check_hello(self, hello) -> None:
        lacks = [name for name in ("batch", "credit", "packed_keys") if not getattr(hello, name, False)]
        if lacks:
            # NB: every kvtierd of this release serves them; the connector
            # keeps no path for one that does not.
            raise KvtierConfigError(f"kvtierd at {self._link_address()} does not serve {', '.join(lacks)}: "
                                    "run the kvtierd of this kvtier release")
        self._spec.geometry.check(hello.block_bytes)
        if not hello.namespace:
            return
        # NB: this engine's namespace digests vLLM's root hash, which vLLM
        # seeds after it builds the connector: the namespaces it can have are
        # known now by vLLM's own seed rule; the one it has, at the first key
        # (_namespace).
        possible = self._spec.possible_namespaces()
        if possible is not None and hello.namespace not in possible:
            raise self._namespace_error(hello.namespace, " or ".join(map(repr, possible)) or
                                        "one of its own (vLLM seeds its root hash at random)")
        log.info("kvtier: kvtierd serves only namespace %r (checked at the first key)",
                 hello.namespace)

    # -- keys -------------------------------------------------------------

    def _namespace(self) -> str:
        if self._ns is None:
            ns = self._spec.namespace()
            c = self._link.client
            served = c.hello.namespace if c is not None else ""
            if served and served != ns:
                # NB: where the root hash could not be predicted at the
                # engine's start (_check_hello), the first key is the
                # earliest this is known. Every key would be refused (BAD_KEY).
                raise self._namespace_error(served, repr(ns))
            self._ns, self._nsfp = ns, ns_fingerprint(ns)
            log.info("kvtier: layout namespace %s", self._ns)
        return self._ns

    def _namespace_error(self, served: str, ns: str) -> KvtierConfigError:
        return KvtierConfigError(
            f"kvtierd at {self._link_address()} serves only namespace {served!r}, and this "
            f"engine's keys are in namespace {ns} (its model, KV layout and vLLM's root "
            f"hash): give kvtierd this namespace, or none")

    def _link_address(self) -> str:
        # NB: _check_hello runs while the link is being built
        link = getattr(self, "_link", None)
        return link.address if link is not None else self._spec.kvtier["kvtier_address"]

    def _wire(self, keys: Iterable[OffloadKey]) -> list:
        ns = self._namespace()
        return [[ns, bytes(k[:-4]), int.from_bytes(k[-4:], "big")] for k in keys]

    def _keys(self, keys: List[OffloadKey]) -> dict:
        """Keys as the "pkeys" field: the hashes in one join, the groups in
        another (an OffloadKey ends with its group as 4 big-endian bytes,
        the wire's own encoding) — no Python object per key."""
        if not keys:
            return {"keys": []}
        n, hash_len = len(keys), len(keys[0]) - 4
        hashes = b"".join([k[:-4] for k in keys])
        if not 0 < hash_len <= 64 or len(hashes) != n * hash_len:
            return {"keys": self._wire(keys)}
        groups = b"".join([k[-4:] for k in keys])
        pk = {"ns": self._namespace(), "hash_len": hash_len, "hashes": hashes}
        if groups.count(groups[:4]) == n:
            pk["group"] = int.from_bytes(groups[:4], "big")
        else:
            pk["groups"] = groups
        return {"pkeys": pk}

    def _unwire(self, keys) -> List[OffloadKey]:
        ns = self._namespace()
        return [make_offload_key(h, g) for n, h, g in keys if n == ns]

    def _req(self, ctx: ReqContext) -> _Req:
        r = self._reqs.get(ctx.req_id)
        if r is None:
            r = self._reqs[ctx.req_id] = _Req(self._req_wire(ctx))
        return r

    def _req_wire(self, ctx: ReqContext) -> dict:
        """The request's context on the wire, without creating its state
        (late completions come after on_request_finished)."""
        r = self._reqs.get(ctx.req_id)
        if r is not None:
            return r.wire
        # A key stands for one chunk: its events' block size is the chunk's.
        # NB: Request(id, block_size=...).wire(), built directly (per request).
        if self._chunk_tokens:
            return {"id": ctx.req_id, "block_size": self._chunk_tokens}
        return {"id": ctx.req_id}

    # -- the connection ---------------------------------------------------

    def _session_begun(self) -> None:
        """A new session: its credit starts with one synchronous grant."""
        if self._credit_on():
            r = self._call(Client._call, "grant", n=self._credit_target)
            if r is not None:
                self._credit.extend(r["slots"])

    def _queue(self, op: str, settle: Optional[tuple] = None, quiet: bool = False, **fields) -> int:
        """Queues a call for the next flush; its reply, if settle is given,
        is handed to _settle_reply, otherwise the daemon sends none. Quiet:
        a reply only if the call fails, its error settled by _refused
        (settle is then not kept)."""
        if quiet:
            settle, fields["quiet"] = None, True
        elif settle is None:
            fields["noreply"] = True
        rid, call = self._link.client.call(op, **fields)
        self._out.append(call)
        if settle is not None:
            self._keep.append(rid)
            self._calls[rid] = settle
        return rid

    def _flush(self, send: bool = True, wait_ms: int = 0) -> None:
        """Sends what is queued (one write) and reads the replies that came;
        without send, only reads. Waits for a reply up to wait_ms only
        (0 on vLLM's path: never)."""
        if not self._link.up():
            return
        c = self._link.client
        try:
            if send and self._out:
                out, keep = self._out, self._keep
                self._out, self._keep = [], []
                c.send_calls(out, keep)  # one frame for the lot
            replies = c.take_replies(wait_ms)
        except KvtierError as e:
            self._lost(e)
            return
        for rid, reply in replies:
            err = reply.get("err")
            if err is not None and _link_error(err):
                # NB: whichever call it answers (a quiet one, a store, a
                # lookup): the session is gone — e.g. a restarted kvtierd
                # that ZeroMQ reconnected this socket to, which knows no
                # session of ours. Nothing it answers from now on counts.
                self._lost(KvtierError(err.get("code", ""), err.get("msg", "")))
                return
            settle = self._calls.pop(rid, None)
            if settle is not None:
                self._settle_reply(settle, reply)
            elif err is not None:
                self._refused(err)

    def _flush_before_schedule(self) -> None:
        if self._flush_at_schedule or self._flush_at_completion:
            self._flush_at_schedule = self._flush_at_completion = False
            self._step_clock = time.monotonic()
            self._flush()

    def _flush_before_completion(self) -> None:
        if self._flush_at_completion:
            self._flush_at_completion, self._flush_at_schedule = False, True
            self._flush()

    def _call(self, fn, *args, **kw):
        """A synchronous call (counted); None when the link is down or goes down."""
        if not self._link_up():
            return None
        self._flush()  # NB: what was queued first is processed first
        if self._link.client is None:
            return None
        self.blocking_calls += 1
        try:
            return fn(self._link.client, *args, **kw)
        except KvtierError as e:
            if e.code in _LINK_ERRORS or e.code == "TIMEOUT" and "no reply within" in e.msg:
                self._lost(e)
                return None
            raise

    def _lost(self, err: Exception) -> None:
        """The session is gone: what it held (leases, credit, stores) is void."""
        self._link.lost(err)
        for r in self._reqs.values():
            r.answers.clear()
            r.ask.clear()
            r.asking = 0
        self._stores.clear()
        self._awaiting.clear()
        self._committing.clear()
        self._calls.clear()
        self._out, self._keep = [], []
        self._credit.clear()
        self._granting = 0

    def _link_up(self) -> bool:
        """Up, taking over a reconnected session (and granting its credit)."""
        epoch = self._link.epoch
        up = self._link.up()
        if up and self._link.epoch != epoch:
            self._session_begun()
        return up and self._link.client is not None

    # -- replies ----------------------------------------------------------

    def _settle_reply(self, settle: tuple, reply: dict) -> None:
        kind = settle[0]
        err = reply.get("err")
        if kind == "lookup":
            if settle[4] == self._resets:  # NB: leases from before a reset_cache are gone
                self._lookup_answered(settle[1], settle[2], settle[3], reply, err)
        elif kind == "store":
            self._store_answered(settle[1], err)
            if not err:
                settle[1].bound = [bool(b) for b in reply["bound"]]
            self._settle_deferred(settle[1])
        elif kind == "grant":
            self._granting -= settle[1]
            if not err and settle[2] == self._link.epoch:
                self._credit.extend(reply["slots"])
                self._evicted.extend(self._unwire(reply.get("evicted")))
        elif kind == "load" and err:
            self.refused_loads += 1
            self.last_refusal = err
            log.warning("kvtier: a planned load's pin was refused: %s", err)
        elif kind == "commit" and err:
            self.refused_commits += 1
            log.debug("kvtier: a store's completion was refused: %s", err)

    def _refused(self, err: dict) -> None:
        """A quiet call failed: its error is its only reply."""
        op = err.get("op") if isinstance(err, dict) else None
        if op == "prepare_load":
            self._settle_reply(("load",), {"err": err})
        elif op == "complete_store":
            self._settle_reply(("commit",), {"err": err})
        else:
            log.debug("kvtier: a call without reply failed: %s", err)

    def _lookup_answered(self, req_id: str, keys: List[OffloadKey], epoch: int, reply: dict, err) -> None:
        r = self._reqs.get(req_id)
        if r is None or epoch != self._link.epoch:
            return  # finished meanwhile: request_finished released its leases
        r.asking = 0
        if err:
            log.debug("kvtier: leasing lookup refused: %s", err)
            return
        status, slots = reply["status"], reply.get("slots") or ()
        now, step, answers = time.monotonic(), self._step, r.answers
        if len(status) == len(keys) == len(slots):
            for k, st, slot in zip(keys, status, slots):
                answers[k] = (st, slot, step, now, epoch)
            return
        for i, k in enumerate(keys):
            st = status[i] if i < len(status) else MISS
            answers[k] = (st, slots[i] if i < len(slots) else 0, step, now, epoch)

    def _store_answered(self, b: _StoreBatch, err) -> None:
        if err:
            self.refused_stores += 1
            b.failed = True
            b.bound = [False] * len(b.keys)
            log.warning("kvtier: store of %d block(s) refused: %s", len(b.keys), err)

    # -- lookup -----------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        # NB: per key, inside vLLM's scheduler step: the common paths avoid
        # calls and attribute chains.
        if self._flush_at_schedule or self._flush_at_completion:
            self._flush_before_schedule()
        if self._ns is None:
            self._namespace()  # NB: not before: vLLM seeds its root hash after building us
        r = self._reqs.get(req_context.req_id) or self._req(req_context)
        if r.scan_step != self._step:
            r.scan_step, r.scan_hits, r.scan_deferred = self._step, 0, False
            r.scan_keys = len(getattr(req_context, "_offload_key_positions", None) or ())
            self._scanned.append(r)
        res = self._lookup(r, key, req_context)
        if res is LookupResult.HIT:
            r.scan_hits += 1
        elif res is not LookupResult.MISS:
            r.scan_deferred = True
        return res

    def _lookup(self, r: _Req, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        ans = r.answers.get(key) if r.answers else None
        if ans is not None:
            st, _, step, at, epoch = ans
            # A HIT holds (leased) until the lookup TTL; anything else is
            # this step's answer only (a block may be promoted or stored by
            # the next).
            if epoch == self._link.epoch and self._step_clock - at <= self._lookup_ttl and (
                    st == HIT or step == self._step):
                return _RESULT[st] if st != HIT_PENDING else LookupResult.RETRY
            del r.answers[key]  # stale: ask again
        if key in self._stores:
            return LookupResult.HIT_PENDING  # this engine is writing it
        link = self._link
        if link.client is None and not self._link_up():
            return LookupResult.MISS
        index = link.index
        if index is None:
            return self._lookup_now(key, req_context)
        if not index.held(self._nsfp, key):
            if key not in self._committing and link.client.hello.index_complete:
                return LookupResult.MISS  # nothing asked: the index covers every tier
        elif self._committing:
            self._committing.pop(key, None)  # its commit landed
        if not r.asking:
            r.ask[key] = None
        elif not self._read_this_step:
            # Its answer may have come since the last read: one
            # non-blocking read a step, then ask this key again.
            self._read_this_step = True
            self._flush(send=False)
            if key in r.answers:
                return self._lookup(r, key, req_context)
        elif time.monotonic() - r.asked_at > self._link.timeout:
            self._lost(KvtierError("LINK_TIMEOUT", f"no lookup reply within {self._link.timeout}s"))
            return LookupResult.MISS
        return LookupResult.RETRY

    def _lookup_now(self, key: OffloadKey, ctx: ReqContext) -> LookupResult:
        """Without a residency index (an older kvtierd): one synchronous,
        leasing Lookup for the request's keys from key on."""
        r = self._req(ctx)
        keys = self._request_keys(key, ctx)
        reply = self._call(Client._call, "lookup", req=r.wire, prefix=self._single_group,
                           want_slots=True, **self._keys(keys))
        if reply is None:
            return LookupResult.MISS
        self._lookup_answered(ctx.req_id, keys, self._link.epoch, reply, None)
        st = r.answers.get(key, (MISS,))[0]
        return _RESULT[st] if st != HIT_PENDING else LookupResult.RETRY

    def _request_keys(self, key: OffloadKey, ctx: ReqContext) -> List[OffloadKey]:
        positions = getattr(ctx, "_offload_key_positions", None) or {}
        at = positions.get(key)
        if at is None:
            return [key]
        if not self._single_group:
            return sorted(positions, key=positions.__getitem__)
        return [k for k, p in sorted(positions.items(), key=lambda kv: kv[1]) if p >= at]

    def _ask_queued(self) -> None:
        """Queues one leasing Lookup per request whose keys the index holds
        (their statuses and slots come back by the next step)."""
        epoch = self._link.epoch
        for req_id, r in self._reqs.items():
            if not r.ask or r.asking:
                continue
            keys = list(r.ask)
            r.ask.clear()
            r.asked_at = time.monotonic()
            r.asking = self._queue("lookup", ("lookup", req_id, keys, epoch, self._resets), req=r.wire,
                                   prefix=self._single_group, want_slots=True,
                                   **self._keys(keys))

    # -- loads ------------------------------------------------------------

    def prepare_load(self, keys, req_context: ReqContext) -> KvtierLoadStoreSpec:
        self._flush_before_schedule()
        keys = list(keys)
        r = self._req(req_context)
        slots: List[int] = []
        leased = True  # every key answered HIT by this session's lookup
        for k in keys:
            ans = r.answers.pop(k, None)
            if ans is None or ans[0] != HIT or ans[4] != self._link.epoch:
                leased = False
                break
            slots.append(ans[1])
        self._saw(r, keys)
        if leased and self._link_up():
            # The lease becomes a pin: sent ahead of the completion, on the
            # same ordered connection; the workers copy meanwhile.
            self._queue("prepare_load", ("load",), quiet=True, req=r.wire, **self._keys(keys))
            return KvtierLoadStoreSpec(slots, self._link.pool)
        self.load_fallbacks += 1
        try:
            job = self._call(Client.prepare_load, Request(req_context.req_id), self._wire(keys))
        except KvtierError as e:
            raise KvtierLoadError(f"kvtier refused a load of {len(keys)} leased HIT(s): {e}") from e
        if job is None:
            raise KvtierLoadError(
                f"kvtier went away between lookup and load of {len(keys)} block(s) of "
                f"request {req_context.req_id!r}")
        return KvtierLoadStoreSpec(job.slots, self._link.pool)

    @staticmethod
    def _saw(r: _Req, keys: Iterable[OffloadKey]) -> None:
        for k in keys:
            r.seen[k] = None

    def touch(self, keys, req_context: ReqContext) -> None:
        keys = list(keys)
        if keys and self._link_up():  # vLLM's LRU ranks a prefix's root most recent: touch tail first
            self._queue("touch", req=self._req_wire(req_context),
                        **self._keys(keys[::-1]))

    def complete_load(self, keys, req_context: ReqContext) -> None:
        self._flush_before_completion()
        keys = list(keys)
        if keys and self._link_up():
            self._queue("complete_load", req=self._req_wire(req_context),
                        **self._keys(keys))

    # -- stores -----------------------------------------------------------

    def prepare_store(self, keys, req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        keys = list(keys)
        r = self._req(req_context)
        if not self._link_up():
            return None
        self._namespace()
        stores, rseen = self._stores, r.seen
        offered = []
        for k in dict.fromkeys(keys):  # NB: once each, in order
            if k not in stores:  # this engine is writing it: neither stored nor ready
                rseen[k] = None
                offered.append(k)
        index = self._link.index
        to_store = offered
        if index is not None and offered and (
                not self._credit_on() or index.held_cpu(self._nsfp, offered[0])):
            # NB: through credit, the whole store is probed only when its
            # first block is held (another engine stored the prefix, or a
            # chain has a gap): a later duplicate is settled by the daemon
            # (its slot stays credit), at the cost of one needless copy.
            to_store = index.not_held_cpu(self._nsfp, offered)
        evicted, self._evicted = self._evicted, []
        if not to_store:
            return PrepareStoreOutput(keys_to_store=[], store_spec=KvtierLoadStoreSpec([], self._link.pool),
                                      evicted_keys=evicted)
        if len(to_store) > len(self._credit) and self._granting:
            self._flush(send=False)  # a grant may have come since on_schedule_end
        if len(to_store) > len(self._credit) and self._link.index is not None:
            self._grant_now(len(to_store))
        if len(to_store) > len(self._credit) or self._link.index is None:
            return self._prepare_store_now(keys, to_store, r, evicted)
        slots = self._credit[-len(to_store):]
        del self._credit[-len(to_store):]
        b = _StoreBatch(to_store, slots, r.wire, self._link.epoch, open=len(to_store),
                        queued=time.monotonic())
        self._queue("store", ("store", b), req=r.wire, slots=slots,
                    **self._keys(to_store))
        for k in to_store:
            self._stores[k] = b
        self._refill()
        return PrepareStoreOutput(keys_to_store=to_store,
                                  store_spec=KvtierLoadStoreSpec(slots, self._link.pool),
                                  evicted_keys=evicted)

    def _grant_now(self, need: int) -> None:
        """Credit ran short in this step: one synchronous grant for the rest
        of the step (never more than one a step), so the step's other
        stores do not each wait."""
        if self._granted_now_step == self._step or not self._credit_on():
            return
        self._granted_now_step = self._step
        want = max(need - len(self._credit), self._credit_target // 2)
        r = self._call(Client._call, "grant", n=want)
        if r is not None:
            self._credit.extend(r["slots"])
            self._evicted.extend(self._unwire(r.get("evicted")))

    def _prepare_store_now(self, keys, to_store, r: _Req, evicted) -> Optional[PrepareStoreOutput]:
        """Credit short (or no index): the synchronous prepare_store."""
        self.store_fallbacks += 1
        self._refill(len(to_store))
        try:
            plan = self._call(Client.prepare_store, Request(r.wire["id"]), self._wire(keys))
        except KvtierError as e:
            if e.code != "FULL":
                log.warning("kvtier: prepare_store refused: %s", e)
            return None
        if plan is None:
            return None
        stored = self._unwire(plan.to_store)
        b = _StoreBatch(stored, list(plan.slots), r.wire, self._link.epoch, open=len(stored),
                        bound=[True] * len(stored))
        for k in stored:
            self._stores[k] = b
        return PrepareStoreOutput(keys_to_store=stored,
                                  store_spec=KvtierLoadStoreSpec(plan.slots, self._link.pool),
                                  evicted_keys=evicted + self._unwire(plan.evicted))

    def _quiet(self) -> bool:
        """A quiet call can be sent (the link is up): the daemon answers it
        only when it fails, so a pin's or a commit's reply is read only when
        it was refused."""
        return self._link.client is not None

    def _forget_stored(self, b: _StoreBatch, keys: Iterable[OffloadKey]) -> None:
        """keys of b are settled: no longer this engine's writes (a later
        batch of the same key, once vLLM stores it again, is left alone)."""
        stores = self._stores
        for k in keys:
            if stores.get(k) is b:
                del stores[k]

    def _credit_on(self) -> bool:
        """Stores go through credit: the link is up and credit is not turned
        off (kvtier_store_credit: 0)."""
        return self._credit_min > 0 and self._link.client is not None

    def _refill(self, short: int = 0) -> None:
        """Asks for credit up to the target (without waiting)."""
        if not self._credit_on():
            return
        want = max(self._credit_target, short) - len(self._credit) - self._granting
        if want > 0 and (short or want >= max(8, self._credit_target // 16)):
            self._granting += want
            self._queue("grant", ("grant", want, self._link.epoch), n=want)

    def complete_store(self, keys, req_context: ReqContext, success: bool = True) -> None:
        self._flush_before_completion()
        by_batch: Dict[int, Tuple[_StoreBatch, List[OffloadKey]]] = {}
        for k in keys:
            b = self._stores.get(k)
            if b is not None and k not in b.completed:
                b.completed[k] = None
                by_batch.setdefault(id(b), (b, []))[1].append(k)
        for b, ks in by_batch.values():
            b.open -= len(ks)
            b.deferred.append((ks, bool(success)))
            if b.bound is not None:
                self._settle_deferred(b)
            else:
                self._awaiting[id(b)] = b

    def _settle_deferred(self, b: _StoreBatch) -> None:
        """Completions of a batch whose bound keys are known: bound keys are
        committed (or freed); a duplicate's slot returns to the credit (its
        copy is over). A refused batch's slots are not ours: dropped.

        NB: a completed key stays in _stores (a lookup answers HIT_PENDING)
        until this settles it. Dropped at its completion, it was neither
        this engine's write nor committing until the daemon's answer came —
        later than the worker's completion on a loaded box — and the index
        did not hold it yet: a lookup answered MISS and recomputed a prefix
        the engine had just stored."""
        if b.bound is None and b.epoch == self._link.epoch:
            return
        self._awaiting.pop(id(b), None)
        if b.epoch != self._link.epoch:
            for ks, _ in b.deferred:
                self._forget_stored(b, ks)
            b.deferred.clear()
            return
        assert b.bound is not None
        pos = {k: i for i, k in enumerate(b.keys)}
        for ks, ok in b.deferred:
            self._forget_stored(b, ks)
            commit = [k for k in ks if b.bound[pos[k]]]
            if ok:
                now, committing = time.monotonic(), self._committing
                for k in commit:
                    committing[k] = now
                    committing.move_to_end(k)
            if commit and self._link_up():
                # NB: its reply says the blocks are readable (or why not):
                # read later, never waited for, it counts refused commits.
                self._queue("complete_store", ("commit",), quiet=True, req=b.req, ok=ok,
                            **self._keys(commit))
            if not b.failed:
                self._credit.extend(b.slots[pos[k]] for k in ks if not b.bound[pos[k]])
        b.deferred.clear()

    # -- requests and steps ---------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self._req(req_context)
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        r = self._reqs.pop(req_context.req_id, None)
        if r is None or not self._link_up():
            return
        if r.seen:
            # vLLM's LRU re-ranks every key a finished request used, its
            # prefix's root most recent.
            pos = req_context.get_offload_key_position
            order = sorted(r.seen, key=lambda k: pos(k) or 0)
            self._queue("touch", req=r.wire, **self._keys(order[::-1]))
        self._queue("request_finished", req=r.wire)

    def on_schedule_end(self, context=None) -> None:
        self._step += 1
        self._step_clock = time.monotonic()
        self._predict()
        if not self._link_up():
            return
        # NB: credit is refilled after a step's stores (at its first
        # completion): the next step's stores find it there, so the peak of
        # recent steps, with a margin, is enough.
        if self._committing:
            self._prune_committing()
        if self._awaiting and not self._stores_answered_in_time():
            return
        self._ask_queued()
        self._refill()
        self._flush()
        self._flush_at_completion, self._flush_at_schedule = True, False
        self._read_this_step = False

    def _stores_answered_in_time(self) -> bool:
        """False, and the link lost, when a completed store's answer is
        overdue (its keys would otherwise stay HIT_PENDING, and the engine
        stepping, for as long as a dead daemon stays silent — over ZeroMQ a
        dead peer is silence, not an error)."""
        oldest = min(b.queued for b in self._awaiting.values())
        if time.monotonic() - oldest <= self._link.timeout:
            return True
        self._lost(KvtierError("LINK_TIMEOUT", f"no store reply within {self._link.timeout}s"))
        return False

    def _prune_committing(self) -> None:
        """A commit has landed once the residency index holds its key (a
        lookup then asks the daemon, as for any held key, and drops the key
        from here); until then the key is asked about too. NB: not a count
        of steps: under load a commit (checksummed off the daemon's mailbox)
        can take longer than a few steps, and a MISS from the index
        meanwhile recomputes a prefix the engine just stored. One that has
        not landed within the link's timeout failed, or its link did: the
        step drops it from the front of the oldest-first order, so a step
        costs the keys that expired, not the keys in flight (probing each
        one every step made a step 1.3× native's at thousands of keys)."""
        oldest = time.monotonic() - self._link.timeout
        committing = self._committing
        while committing:
            key, sent = next(iter(committing.items()))
            if sent >= oldest:
                return
            del committing[key]

    def _predict(self) -> None:
        """At on_schedule_end: this step's stores were predicted a step ago;
        the next step's are the blocks past the hits of the requests this
        step scanned and did not defer."""
        need = 0
        for r in self._scanned:
            if not r.scan_deferred:
                need += max(0, r.scan_keys - r.scan_hits)
        self._scanned.clear()
        self._need_now, self._need_next = self._need_next, need
        # NB: asked for now, before this step's forward pass: the grant is
        # back long before the next step's stores (this step's were asked
        # for a step ago).
        self._credit_target = self._target(self._need_now + self._need_next)

    def _target(self, need: int) -> int:
        return max(self._credit_min, need + need // 8) if self._credit_min > 0 else 0

    def has_pending_work(self) -> bool:
        # Only something queued and not yet sent, or a completed store's
        # answer (bounded by the link's timeout), needs another engine step
        # (seed 002: never true for long).
        return bool(self._out) or bool(self._awaiting)

    def take_events(self) -> Iterable[OffloadingEvent]:
        # kvtierd publishes the CPU and STORAGE media itself (README, "Run
        # vLLM with kvtier"); vLLM's publisher announces GPU blocks only.
        return ()

    def reset_cache(self) -> None:
        self._resets += 1
        for r in self._reqs.values():
            r.answers.clear()
            r.ask.clear()
            r.asking = 0
        # NB: stores in flight are dropped by vLLM (stale jobs): their
        # credited slots are not reused (a worker may still copy into them).
        self._stores.clear()
        self._call(Client.reset_cache)

    def shutdown(self) -> None:
        self._flush()
        self._link.close()

    # -- introspection (tests, benchmarks) --------------------------------

    def settle(self, timeout: float = 10.0) -> None:
        """Tests and tools only (it waits; vLLM's path never calls it):
        sends what is queued, waits for every reply the manager reads, and
        forgets the answers that said "ask again" (RETRY, HIT_PENDING), so
        the next lookup asks anew."""
        deadline = time.monotonic() + timeout
        if self._link_up():
            self._ask_queued()
        self._flush()
        while self._calls and self._link.client is not None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"kvtier: {len(self._calls)} replies not in after {timeout}s")
            self._flush(wait_ms=10)  # NB: sends too what an answer queued (a deferred completion)
        # Quiet calls (pins, commits) send no reply: the session says when
        # every call sent has taken effect.
        while self._link.client is not None and self._quiet():
            try:
                if self._link.client.stats().get("session_calls_in_flight", 0) == 0:
                    break
            except KvtierError as e:
                self._lost(e)
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"kvtier: calls still in flight after {timeout}s")
        self._flush()  # NB: a quiet call's refusal
        for r in self._reqs.values():
            for k in [k for k, a in r.answers.items() if a[0] in (RETRY, HIT_PENDING)]:
                del r.answers[k]

    def state_sizes(self) -> Dict[str, int]:
        """How much per-request and per-store state the manager holds."""
        return {"requests": len(self._reqs), "stores": len(self._stores), "committing": len(self._committing),
                "calls": len(self._calls), "queued": len(self._out), "credit": len(self._credit)}

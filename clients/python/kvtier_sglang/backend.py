"""SGLang's HiCache L3 storage backed by a kvtierd (docs/SGLANG.md).

SGLang loads it at start with ``--hicache-storage-backend dynamic`` and
constructs ``KvtierHiCacheStorage(storage_config, kwargs)``
(``sglang/srt/mem_cache/storage/backend_factory.py``); the cache controller
then registers its host KV pool (``register_mem_pool_host``) and calls, from
three threads of its own:

- ``batch_exists`` (prefetch thread): the length of the consecutive prefix
  of page keys kvtier holds. One leasing ``lookup`` per batch at most, none
  when kvtierd's residency index says the first page is not held. What it
  reports is leased to a request id of this backend's own, so it is still
  there when ``batch_get_v1`` runs; the lease ends after that get, or at the
  next ``batch_exists`` once ``kvtier_lease_s`` passed (the controller may
  drop a prefetch it had asked about), or at kvtierd's own lease TTL.
- ``batch_get_v1`` (prefetch I/O thread): the leases become pins
  (``prepare_load``), each page is copied from its kvtier slot (the shared
  pool, mapped here) straight into the host pool's page, then the pins and
  the leases are released.
- ``batch_set_v1`` (backup thread): ``prepare_store`` reserves slots for the
  pages kvtier lacks, each page is copied from the host pool into its slot,
  ``complete_store`` makes them readable.

A slot holds a page exactly as SGLang's ``get_data_page(index, flat=True)``
lays it out (the bytes ``HiCacheFile`` writes to a file); the copy goes
between the host pool's strided page view and the slot, with no staging
buffer. Keys live in a namespace derived from the model, the pool's dtype,
layout, page size and page bytes, the TP/PP/CP shard and a salt
(``namespace``), so engines whose pages differ never share one.

kvtierd unreachable or failing: every call answers as if kvtier were empty
or refused (0, False, None), SGLang recomputes, and a background thread
reconnects. Nothing raises into SGLang's controller threads; a
configuration kvtier cannot serve (a page larger than kvtier's slot, a
hybrid model's extra pools) is refused at attach with ``KvtierConfigError``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import mmap
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from kvtier_client import HIT, HIT_PENDING, RETRY, Client, KvtierError, Request, default_address
from kvtier_client.residency import STATE_NONE, STATE_SECONDARY, Residency, fingerprint, ns_fingerprint

log = logging.getLogger("kvtier_sglang")

# Errors that mean the connection or session is gone, not one call refused.
_LINK_ERRORS = {"CLOSED", "NO_SESSION", "BAD_VERSION", "BAD_REPLY", "UNAVAILABLE"}

# The extra_config keys this backend reads, with their defaults (README,
# "Run SGLang with kvtier"; docs/SGLANG.md has the table).
DEFAULTS: Dict[str, Any] = {
    "kvtier_address": None,  # default: $KVTIER_ADDRESS, else kvtierd's default socket
    "kvtier_timeout_s": 5.0,
    "kvtier_reconnect_s": 1.0,
    "kvtier_lease_s": 10.0,
    "kvtier_pending_wait_s": 0.5,
    "kvtier_namespace_salt": "",
    "kvtier_poll_us": 100.0,
}
# SGLang's own keys for a dynamic backend (read by SGLang, ignored here).
SGLANG_KEYS = {"backend_name", "module_path", "class_name", "interface_v1"}


class KvtierConfigError(ValueError):
    """A configuration kvtier cannot serve; raised at attach, never later."""


def settings(extra: Optional[dict]) -> Dict[str, Any]:
    """extra_config's kvtier keys over DEFAULTS; an unknown kvtier_ key is
    refused (a typo would otherwise silently fall back to a default)."""
    extra = dict(extra or {})
    unknown = [k for k in extra if k.startswith("kvtier_") and k not in DEFAULTS]
    if unknown:
        raise KvtierConfigError(f"unknown kvtier option(s) {unknown}; known: {sorted(DEFAULTS)}")
    out = dict(DEFAULTS)
    for k, default in DEFAULTS.items():
        if k in extra:
            out[k] = str(extra[k]) if default is None else type(default)(extra[k])
    return out


def page_hash(key: str) -> bytes:
    """kvtier's hash of an SGLang page key: the digest itself when the key is
    a hex digest (SGLang's sha256 chain), else sha256 of the key's text."""
    if len(key) <= 128 and len(key) % 2 == 0:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    return hashlib.sha256(key.encode()).digest()


def namespace(cfg: HiCacheStorageConfig, pool, salt: str = "") -> str:
    """The layout namespace of this engine's pages: equal exactly when two
    engines' pages are interchangeable byte for byte. MLA KV is the same on
    every TP rank (HiCacheFile shares one file per page across them), so
    its namespace leaves the TP rank out; MHA's keeps it (each rank holds
    its heads' shard)."""
    parts = {
        "v": 1,
        "model": cfg.model_name or "",
        "kind": "mla" if cfg.is_mla_model else "mha",
        "pool": type(pool).__name__,
        "dtype": str(pool.dtype),
        "layout": pool.layout,
        "page_size": int(pool.page_size),
        "page_bytes": page_bytes(pool),
        "tp": None if cfg.is_mla_model else [cfg.tp_rank, cfg.tp_size],
        "pp": [cfg.pp_rank, cfg.pp_size],
        "cp": [cfg.attn_cp_rank, cfg.attn_cp_size],
        "dcp": [cfg.dcp_rank, cfg.dcp_size],
        "salt": salt,
    }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return "sglang-" + digest[:32]


def page_bytes(pool) -> int:
    page = pool.get_data_page(0, flat=False)
    return page.numel() * page.element_size()


@dataclass
class _Lease:
    """Keys batch_exists reported held, leased to request ``rid``."""

    rid: str
    keys: List[str]
    slots: List[int]
    epoch: int
    deadline: float


class _PoolMap:
    """kvtier's pool file mapped read-write here, as bytes per slot."""

    def __init__(self, path: str, block_bytes: int, slots: int):
        fd = os.open(path, os.O_RDWR)
        try:
            size = block_bytes * slots  # NB: at least that: the file is every block size's
            if os.fstat(fd).st_size < size:
                raise KvtierError("BAD_REPLY", f"pool file {path} is smaller than {size} bytes")
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.block_bytes = block_bytes
        self.bytes = torch.frombuffer(self._mm, dtype=torch.uint8)

    def slot(self, i: int, n: int) -> torch.Tensor:
        at = i * self.block_bytes
        return self.bytes[at:at + n]

    def close(self) -> None:
        self.bytes = None
        try:
            self._mm.close()
        except BufferError:
            pass  # a copy still holds a view; the mapping goes with it


class KvtierHiCacheStorage(HiCacheStorage):
    """``HiCacheStorage`` over a kvtierd (module docstring)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.storage_config = storage_config
        self.opts = settings(storage_config.extra_config)
        self.address = self.opts["kvtier_address"] or default_address()
        self.mem_pool_host: Any = None  # SGLang's HostKVCache, once registered
        self.ns: Optional[str] = None
        self._nsfp = 0
        self._page_bytes = 0
        self._lock = threading.Lock()  # guards the fields below; never held across a call
        self._client: Optional[Client] = None
        self._pool: Optional[_PoolMap] = None
        self._index: Optional[Residency] = None
        self._epoch = 0
        self._leases: Dict[str, _Lease] = {}   # rid -> its lease
        self._leased: Dict[str, Tuple[str, int]] = {}  # page key -> (rid, slot), newest lease
        self._ids = itertools.count(1)
        self._tag = f"sgl-{os.getpid()}-{os.urandom(4).hex()}"
        self._reconnecting: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._up = threading.Condition(self._lock)  # notified when a session starts
        self.stats_counters = {k: 0 for k in (
            "exists_calls", "exists_round_trips", "exists_hits", "get_pages", "get_failed",
            "get_round_trips", "set_pages", "set_stored", "set_failed", "set_round_trips",
            "link_lost", "reconnects")}
        try:
            self._connect()
        except Exception as e:  # kvtierd not up yet: SGLang starts all the same
            log.warning("kvtier: %s unreachable at start (%s); reconnecting in the background",
                        self.address, e)
            self._start_reconnect()

    # -- attach ------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        super().register_mem_pool_host(mem_pool_host)
        nbytes = page_bytes(mem_pool_host)
        ns = namespace(self.storage_config, mem_pool_host, self.opts["kvtier_namespace_salt"])
        c = self._client
        if c is not None:
            self._check_geometry(c, nbytes, ns)
        self._page_bytes, self.ns, self._nsfp = nbytes, ns, ns_fingerprint(ns)
        log.info("kvtier: %s pages of %d bytes in namespace %s (layout %s)",
                 type(mem_pool_host).__name__, nbytes, ns, mem_pool_host.layout)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        if str(host_pool_name) in ("kv", "PoolName.KV") and host_pool is self.mem_pool_host:
            return super().register_mem_host_pool_v2(host_pool, host_pool_name)
        raise KvtierConfigError(
            f"kvtier's SGLang backend stores the KV pool only; this model also has a "
            f"{host_pool_name!r} host pool (a hybrid model: Mamba/SWA/DSA state), whose "
            "_v2 transfers it does not implement (docs/SGLANG.md, \"Hybrid models\")")

    def _check_geometry(self, c: Client, nbytes: int, ns: str) -> None:
        if nbytes > c.hello.block_bytes:
            raise KvtierConfigError(
                f"an SGLang page is {nbytes} bytes, more than kvtierd's {c.hello.block_bytes}-byte "
                f"slot at {self.address}: start kvtierd with --block-bytes {nbytes} or more, "
                "or give SGLang a smaller --page-size")
        if c.hello.namespace and c.hello.namespace != ns:
            raise KvtierConfigError(
                f"kvtierd at {self.address} serves only namespace {c.hello.namespace!r}, and "
                f"this engine's pages are in {ns!r}: give kvtierd this namespace, or none")

    # -- the connection ------------------------------------------------------

    def _connect(self) -> None:
        # NB: the page's bytes, once SGLang registered its host pool, are
        # declared: a kvtierd started with no block size sizes its slots
        # from them (answering SIZING until then; the reconnect says hello
        # again).
        c = Client(self.address, name=f"sglang-{self._tag}", timeout=self.opts["kvtier_timeout_s"],
                   poll_us=self.opts["kvtier_poll_us"], block_bytes=self._page_bytes)
        try:
            if self.mem_pool_host is not None and self.ns is not None:
                self._check_geometry(c, self._page_bytes, self.ns)
            pool = _PoolMap(c.hello.pool_path, c.hello.block_bytes, c.hello.slots)
        except Exception:
            c.close()
            raise
        index = None
        if c.hello.index_path:
            try:
                index = Residency(c.hello.index_path)
            except (OSError, ValueError) as e:
                log.warning("kvtier: residency index unusable (%s); batch_exists asks kvtierd", e)
        with self._lock:
            self._client, self._pool, self._index = c, pool, index
            self._epoch += 1
            self._leases.clear()
            self._leased.clear()
            self._up.notify_all()

    def _link(self) -> Optional[Tuple[Client, _PoolMap, Optional[Residency], int]]:
        with self._lock:
            if self._client is None or self._pool is None:
                return None
            return self._client, self._pool, self._index, self._epoch

    def _lost(self, epoch: int, err: Exception) -> None:
        """The session of epoch is gone: drop it, reconnect in the background."""
        with self._lock:
            if epoch != self._epoch or self._client is None:
                return
            c, pool, index = self._client, self._pool, self._index
            self._client = self._pool = self._index = None
            self._leases.clear()
            self._leased.clear()
            self.stats_counters["link_lost"] += 1
        log.warning("kvtier: lost %s (%s); SGLang recomputes until it is back", self.address, err)
        try:
            c.close(bye=False)
        except Exception:
            pass
        if pool is not None:
            pool.close()
        if index is not None:
            index.close()
        self._start_reconnect()

    def _start_reconnect(self) -> None:
        with self._lock:
            if self._reconnecting is not None and self._reconnecting.is_alive():
                return
            t = self._reconnecting = threading.Thread(
                target=self._reconnect, name="kvtier-sglang-reconnect", daemon=True)
        t.start()

    def _reconnect(self) -> None:
        while not self._stop.wait(self.opts["kvtier_reconnect_s"]):
            try:
                self._connect()
            except Exception as e:
                log.debug("kvtier: reconnect to %s failed: %s", self.address, e)
                continue
            self.stats_counters["reconnects"] += 1
            log.warning("kvtier: reconnected to %s", self.address)
            return

    def _failed(self, epoch: int, e: Exception, what: str) -> None:
        if isinstance(e, KvtierError) and (e.code in _LINK_ERRORS or e.code == "TIMEOUT"
                                           and "no reply within" in e.msg):
            self._lost(epoch, e)
        else:
            log.warning("kvtier: %s failed: %s", what, e)

    def connected(self) -> bool:
        """Whether a session is up (tests, tools)."""
        return self._link() is not None

    def wait_connected(self, timeout: float) -> bool:
        """Tests and tools only: waits (on the reconnect's notification,
        no polling) until a session is up; False after timeout."""
        with self._up:
            return self._up.wait_for(lambda: self._client is not None, timeout)

    # -- keys ----------------------------------------------------------------

    def _keys(self, keys: Sequence[str]) -> List[Tuple[str, bytes, int]]:
        ns = self.ns
        if ns is None:
            raise KvtierConfigError("no host pool registered yet: no namespace to key pages in")
        return [(ns, page_hash(k), 0) for k in keys]

    def _rid(self, what: str) -> str:
        return f"{self._tag}-{what}-{next(self._ids)}"

    def _request(self, rid: str, extra_info: Optional[HiCacheStorageExtraInfo] = None) -> Request:
        """A request context: the page size for events, and the parent page
        (the last of extra_info.prefix_keys) so kvtierd's BlockStored events
        chain; SGLang passes its backends no token ids (docs/SGLANG.md)."""
        parent = None
        if extra_info is not None and extra_info.prefix_keys:
            parent = page_hash(extra_info.prefix_keys[-1])
        size = int(getattr(self.mem_pool_host, "page_size", 0) or 0)
        return Request(rid, parent=parent, block_size=size)

    # -- leases ----------------------------------------------------------------

    def _expire(self, c: Client, now: float) -> None:
        """Ends the leases batch_exists took whose get never came."""
        with self._lock:
            old = [r for r in self._leases.values() if r.deadline <= now]
            for lease in old:
                self._drop(lease)
        for lease in old:
            try:
                c.send("request_finished", keep=False, noreply=True, req={"id": lease.rid})
            except KvtierError:
                pass

    def _drop(self, lease: _Lease) -> None:
        """REQUIRES: self._lock."""
        self._leases.pop(lease.rid, None)
        for k in lease.keys:
            if self._leased.get(k, (None,))[0] == lease.rid:
                del self._leased[k]

    # -- batch_exists --------------------------------------------------------

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        self.stats_counters["exists_calls"] += 1
        link = self._link()
        if link is None or not keys or self.ns is None:
            return 0
        c, _, index, epoch = link
        try:
            return self._exists(c, index, epoch, keys)
        except Exception as e:  # never into SGLang's prefetch thread
            self._failed(epoch, e, "batch_exists")
            return 0

    def _exists(self, c: Client, index: Optional[Residency], epoch: int, keys: List[str]) -> int:
        now = time.monotonic()
        self._expire(c, now)
        wire = self._keys(keys)
        ask, secondary = wire, False
        if index is not None and c.hello.index_complete:
            # Only the consecutive prefix the index holds is worth a lookup;
            # a first page it lacks is a miss with no round trip.
            n = 0
            for _, h, g in wire:
                st = index.state(fingerprint(self._nsfp, h, g))
                if st == STATE_NONE:
                    break
                secondary |= st == STATE_SECONDARY  # NB: not a page being written (3)
                n += 1
            if n == 0:
                return 0
            ask = wire[:n]
        rid = self._rid("x")
        req = Request(rid)
        # NB: prefix=False when a page is in a secondary tier: every such page
        # starts its promotion in this one call (a prefix scan stops at the
        # first pending page and would promote one page per call).
        prefix = not secondary
        self.stats_counters["exists_round_trips"] += 1
        reply = c._call("lookup", req=req.wire(), prefix=prefix, want_slots=True, **c._key_field(ask))
        status, slots = list(reply["status"]), list(reply.get("slots") or [0] * len(ask))
        hit = _prefix(status)
        pending = hit < len(ask) and status[hit] in (HIT_PENDING, RETRY)
        wait = self.opts["kvtier_pending_wait_s"]
        if pending and wait > 0:
            hit, status, slots = self._await_pending(c, req, ask, status, slots, now + wait)
        if hit:
            lease = _Lease(rid, list(keys[:hit]), slots[:hit], epoch,
                           time.monotonic() + self.opts["kvtier_lease_s"])
            with self._lock:
                if epoch == self._epoch:
                    self._leases[rid] = lease
                    for k, s in zip(lease.keys, lease.slots):
                        self._leased[k] = (rid, s)
        else:
            c.send("request_finished", keep=False, noreply=True, req=req.wire())
        self.stats_counters["exists_hits"] += hit
        return hit

    def _await_pending(self, c: Client, req: Request, ask, status, slots, deadline: float):
        """Pages being promoted from a secondary tier (HIT_PENDING) become
        HITs within a bounded wait: re-asked with a doubling back-off, never
        past deadline (kvtier_pending_wait_s). There is no message that says
        a promotion landed, so this is the one place the backend polls."""
        hit, pause = _prefix(status), 0.002
        while hit < len(ask) and status[hit] in (HIT_PENDING, RETRY):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(pause, left))  # NB: polls the daemon for a promotion; see above
            pause *= 2
            rest = ask[hit:]
            self.stats_counters["exists_round_trips"] += 1
            r = c._call("lookup", req=req.wire(), prefix=True, want_slots=True, **c._key_field(rest))
            st, sl = list(r["status"]), list(r.get("slots") or [0] * len(rest))
            status = status[:hit] + st
            slots = slots[:hit] + sl
            hit = _prefix(status)
        return hit, status, slots

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # -- batch_get_v1 --------------------------------------------------------

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        out = [False] * len(keys)
        link = self._link()
        if link is None or not keys or self.mem_pool_host is None:
            return out
        c, pool, _, epoch = link

        def get() -> List[bool]:
            self._get(c, pool, epoch, keys, self._page_starts(host_indices, len(keys)), out)
            return out

        return self._batch("get", epoch, len(keys), get)

    def _batch(self, op: str, epoch: int, pages: int, run: Callable[[], List[bool]]) -> List[bool]:
        """One batch_{op}_v1 of pages: what run says of each page, or, when it
        raises, every page failed (the failure recorded against epoch); the
        pages and the failed ones counted either way."""
        try:
            out = run()
        except Exception as e:
            self._failed(epoch, e, f"batch_{op}_v1")
            out = [False] * pages
        self.stats_counters[f"{op}_pages"] += pages
        self.stats_counters[f"{op}_failed"] += out.count(False)
        return out

    def _page_starts(self, host_indices: torch.Tensor, n: int) -> List[int]:
        ps = self.mem_pool_host.page_size
        if host_indices.numel() < n * ps:
            raise ValueError(f"{host_indices.numel()} host indices for {n} pages of {ps}")
        return host_indices[: n * ps: ps].tolist()

    def _get(self, c: Client, pool: _PoolMap, epoch: int, keys, starts, out) -> None:
        # The consecutive prefix leased by batch_exists, by one request id.
        with self._lock:
            first = self._leased.get(keys[0])
            rid = first[0] if first is not None else None
            lease = self._leases.get(rid) if rid is not None else None
            n = 0
            if lease is not None and lease.epoch == epoch:
                for k in keys:
                    held = self._leased.get(k)
                    if held is None or held[0] != rid:
                        break
                    n += 1
                self._drop(lease)  # this get consumes the lease (released below)
        if n == 0:
            # Not asked first (or the lease ran out): one leasing lookup.
            rid = self._rid("g")
            self.stats_counters["get_round_trips"] += 1
            r = c._call("lookup", req={"id": rid}, prefix=True, **c._key_field(self._keys(keys)))
            n = _prefix(list(r["status"]))
        try:
            if n == 0:
                return
            load = self._keys(keys[:n])
            assert rid is not None  # NB: a leased prefix (n > 0) came with its request id
            req = Request(rid)
            self.stats_counters["get_round_trips"] += 1
            job = c.prepare_load(req, load)
            try:
                for i, slot in enumerate(job.slots):
                    self._copy_in(pool, slot, starts[i])
                    out[i] = True
            finally:
                c.send("complete_load", keep=False, noreply=True, req=req.wire(), **c._key_field(load))
        finally:
            c.send("request_finished", keep=False, noreply=True, req={"id": rid})

    def _copy_in(self, pool: _PoolMap, slot: int, start: int) -> None:
        page = self.mem_pool_host.get_data_page(start, flat=False)
        src = pool.slot(slot, self._page_bytes).view(page.dtype).view(page.shape)
        page.copy_(src)  # NB: page is a view of the host pool: this writes it

    def _copy_out(self, pool: _PoolMap, slot: int, start: int) -> None:
        page = self.mem_pool_host.get_data_page(start, flat=False)
        pool.slot(slot, self._page_bytes).view(page.dtype).view(page.shape).copy_(page)

    # -- batch_set_v1 --------------------------------------------------------

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        link = self._link()
        if link is None or not keys or self.mem_pool_host is None:
            self.stats_counters["set_failed"] += len(keys)
            return [False] * len(keys)
        c, pool, _, epoch = link
        return self._batch("set", epoch, len(keys),
                           lambda: self._set(c, pool, keys, self._page_starts(host_indices, len(keys)), extra_info))

    def _set(self, c: Client, pool: _PoolMap, keys, starts, extra_info) -> List[bool]:
        req = self._request(self._rid("s"), extra_info)
        wire = self._keys(keys)
        try:
            try:
                self.stats_counters["set_round_trips"] += 1
                plan = c.prepare_store(req, wire)
            except KvtierError as e:
                if e.code in ("FULL", "PAUSED"):  # refused, session fine: SGLang retries later
                    log.debug("kvtier: store of %d page(s) refused: %s", len(keys), e)
                    return [False] * len(keys)
                raise
            at = {h: i for i, (_, h, _) in enumerate(wire)}
            ok = True
            try:
                for (_, h, _), slot in zip(plan.to_store, plan.slots):
                    self._copy_out(pool, slot, starts[at[bytes(h)]])
            except Exception:
                ok = False
                raise
            finally:
                if plan.to_store:
                    # NB: waited for (a second round trip): once batch_set_v1
                    # returns, every engine's batch_exists finds the pages.
                    # A quiet commit would save it, but another engine's
                    # residency index shows a page only once its commit
                    # landed, and SGLang's backup thread is off the
                    # request path anyway.
                    self.stats_counters["set_round_trips"] += 1
                    c.complete_store(req, plan.to_store, ok=ok)
            self.stats_counters["set_stored"] += len(plan.to_store)
            return [True] * len(keys)  # a page kvtier held already is stored too
        finally:
            c.send("request_finished", keep=False, noreply=True, req=req.wire())

    # -- the generic (copying) interface -----------------------------------
    #
    # SGLang uses these when extra_config lacks "interface_v1": 1: a page is
    # a flat tensor (get_data_page(flat=True)) given or filled by SGLang.

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[torch.Tensor]:
        got = self.batch_get([key], [target_location] if target_location is not None else None)
        return got[0] if got else None

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        out: List[Optional[torch.Tensor]] = [None] * len(keys)
        link = self._link()
        if link is None or not keys or self.mem_pool_host is None:
            return out
        c, pool, _, epoch = link
        rid = self._rid("G")
        try:
            wire = self._keys(keys)
            r = c._call("lookup", req={"id": rid}, prefix=False, **c._key_field(wire))
            hits = [i for i, st in enumerate(r["status"]) if st == HIT]
            if hits:
                load = [wire[i] for i in hits]
                job = c.prepare_load(Request(rid), load)
                try:
                    for i, slot in zip(hits, job.slots):
                        dst = target_locations[i] if target_locations else None
                        if dst is None:
                            dst = self.mem_pool_host.get_dummy_flat_data_page()
                        n = dst.numel() * dst.element_size()
                        if n != self._page_bytes:
                            continue
                        dst.view(torch.uint8).view(-1).copy_(pool.slot(slot, n))
                        out[i] = dst
                finally:
                    c.send("complete_load", keep=False, noreply=True, req={"id": rid}, **c._key_field(load))
        except Exception as e:
            self._failed(epoch, e, "batch_get")
            return [None] * len(keys)
        finally:
            try:
                c.send("request_finished", keep=False, noreply=True, req={"id": rid})
            except KvtierError:
                pass
        return out

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None) -> bool:
        link = self._link()
        if link is None or not keys or values is None or self.ns is None:
            return False
        c, pool, _, epoch = link
        req = Request(self._rid("S"))
        try:
            wire = self._keys(keys)
            flat = [v.contiguous().view(-1).view(torch.uint8) for v in values]
            if any(f.numel() > c.hello.block_bytes for f in flat):
                return False
            plan = c.prepare_store(req, wire)
            at = {h: i for i, (_, h, _) in enumerate(wire)}
            ok = True
            try:
                for (_, h, _), slot in zip(plan.to_store, plan.slots):
                    f = flat[at[bytes(h)]]
                    pool.slot(slot, f.numel()).copy_(f)
            except Exception:
                ok = False
                raise
            finally:
                if plan.to_store:
                    c.complete_store(req, plan.to_store, ok=ok)
            return True
        except Exception as e:
            if not (isinstance(e, KvtierError) and e.code in ("FULL", "PAUSED")):
                self._failed(epoch, e, "batch_set")
            return False
        finally:
            try:
                c.send("request_finished", keep=False, noreply=True, req=req.wire())
            except KvtierError:
                pass

    # -- the rest ----------------------------------------------------------

    def clear(self) -> bool:
        """kvtierd's primary tier is the node's, shared by every engine on
        it: clearing it here would drop other engines' pages too. It drops
        only this backend's leases (docs/SGLANG.md, "Differences")."""
        link = self._link()
        with self._lock:
            old = list(self._leases.values())
            self._leases.clear()
            self._leased.clear()
        if link is not None:
            for lease in old:
                try:
                    link[0].send("request_finished", keep=False, noreply=True, req={"id": lease.rid})
                except KvtierError:
                    pass
        return True

    def get_stats(self):
        out = dict(self.stats_counters)
        with self._lock:
            out["leases_held"] = len(self._leases)
        out["connected"] = self.connected()
        return out

    def close(self) -> None:
        self._stop.set()
        t = self._reconnecting
        if t is not None:
            t.join()
        with self._lock:
            c, pool, index = self._client, self._pool, self._index
            self._client = self._pool = self._index = None
            self._leases.clear()
            self._leased.clear()
        if c is not None:
            c.close()
        if pool is not None:
            pool.close()
        if index is not None:
            index.close()


def _prefix(status: Sequence[int]) -> int:
    """How many statuses from the first are HIT."""
    for i, st in enumerate(status):
        if st != HIT:
            return i
    return len(status)

"""Stores in flight: from ``prepare_store`` (keys bound to credited slots,
one ``store`` message sent without waiting) to their commit.

A store settles in two halves that come in either order: the workers'
completions (``complete_store``, per key) and kvtierd's answer to the
``store`` (which keys it bound: a key another engine stored meanwhile is
not, and its slot returns to the credit). Once both are in, the bound keys
are committed (or freed, on failure). Meanwhile a lookup of a key being
written answers HIT_PENDING.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Dict, Iterable, List, Tuple

from vllm.v1.kv_offload.base import OffloadKey

from .calls import StoreBatch, StoreCall
from .credit import Credit

log = logging.getLogger("kvtier_vllm")

# commit(batch, keys, ok): queues the completion of a batch's bound keys.
Commit = Callable[[StoreBatch, List[OffloadKey], bool], None]


class Stores:
    def __init__(self) -> None:
        self.batches: Dict[OffloadKey, StoreBatch] = {}  # keys this manager is writing
        # Batches completed (some keys) whose store the daemon has not
        # answered yet: their keys stay HIT_PENDING meanwhile, so an answer
        # that does not come within the link's timeout means the link is gone.
        self.awaiting: Dict[int, StoreBatch] = {}
        self.refused = 0  # store messages the daemon refused

    def bind(self, keys: List[OffloadKey], slots: List[int], req: dict, epoch: int,
             bound: bool = False) -> StoreBatch:
        """A batch of keys this engine writes into slots. bound: the
        daemon already bound them (a synchronous prepare_store)."""
        b = StoreBatch(keys, slots, req, epoch, open=len(keys), queued=time.monotonic(),
                       bound=[True] * len(keys) if bound else None)
        for k in keys:
            self.batches[k] = b
        return b

    def answered(self, call: StoreCall, reply: dict) -> None:
        """The daemon's answer to a store: which keys it bound."""
        b, err = call.batch, reply.get("err")
        if err:
            self.refused += 1
            b.failed = True
            b.bound = [False] * len(b.keys)
            log.warning("kvtier: store of %d block(s) refused: %s", len(b.keys), err)
        else:
            b.bound = [bool(x) for x in reply["bound"]]

    def complete(self, keys: Iterable[OffloadKey], success: bool) -> List[StoreBatch]:
        """The workers' completions: the batches they settle now (their
        answer is in); the others wait for it."""
        by_batch: Dict[int, Tuple[StoreBatch, List[OffloadKey]]] = {}
        for k in keys:
            b = self.batches.get(k)
            if b is not None and k not in b.completed:
                b.completed[k] = None
                by_batch.setdefault(id(b), (b, []))[1].append(k)
        ready = []
        for b, ks in by_batch.values():
            b.open -= len(ks)
            b.deferred.append((ks, bool(success)))
            if b.bound is not None:
                ready.append(b)
            else:
                self.awaiting[id(b)] = b
        return ready

    def settle(self, b: StoreBatch, epoch: int, credit: Credit, commit: Commit) -> None:
        """Completions of a batch whose bound keys are known: bound keys are
        committed (or freed); a duplicate's slot returns to the credit (its
        copy is over). A refused batch's slots are not ours: dropped.

        NB: a completed key stays in batches (a lookup answers HIT_PENDING)
        until this settles it: dropped at its completion, before the daemon
        had even bound it (its answer comes later than the worker's
        completion on a loaded box), it was neither this engine's write nor
        in the index, and a lookup answered MISS and recomputed a prefix the
        engine had just stored. Once bound, the index holds it as being
        written until its commit lands."""
        if b.bound is None and b.epoch == epoch:
            return
        self.awaiting.pop(id(b), None)
        if b.epoch != epoch:
            for ks, _ in b.deferred:
                self._forget(b, ks)
            b.deferred.clear()
            return
        assert b.bound is not None
        pos = {k: i for i, k in enumerate(b.keys)}
        for ks, ok in b.deferred:
            self._forget(b, ks)
            bound = [k for k in ks if b.bound[pos[k]]]
            if bound:
                commit(b, bound, ok)
            if not b.failed:
                credit.give(b.slots[pos[k]] for k in ks if not b.bound[pos[k]])
        b.deferred.clear()

    def _forget(self, b: StoreBatch, keys: Iterable[OffloadKey]) -> None:
        """keys of b are settled: no longer this engine's writes (a later
        batch of the same key, once vLLM stores it again, is left alone)."""
        batches = self.batches
        for k in keys:
            if batches.get(k) is b:
                del batches[k]

    def overdue(self, timeout: float) -> bool:
        """A completed store's answer is older than timeout (its keys would
        otherwise stay HIT_PENDING, and the engine stepping, for as long as
        a dead daemon stays silent — over ZeroMQ a dead peer is silence)."""
        oldest = min(b.queued for b in self.awaiting.values())
        return time.monotonic() - oldest > timeout

    def drop_writes(self) -> None:
        """vLLM dropped its store jobs (reset_cache, stale jobs): their keys
        are no longer being written. NB: their credited slots are not
        reused (a worker may still copy into them)."""
        self.batches.clear()

    def void(self) -> None:
        """The session is gone: no store in flight settles."""
        self.batches.clear()
        self.awaiting.clear()

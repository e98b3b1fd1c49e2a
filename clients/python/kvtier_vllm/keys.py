"""vLLM's offload keys on kvtier's wire: the engine's namespace, learnt at
its first key, and the two key encodings a call can carry."""

from __future__ import annotations

import logging
from typing import Callable, Iterable, List, Optional

from vllm.v1.kv_offload.base import OffloadKey, make_offload_key

from kvtier_client.residency import ns_fingerprint

from .layout import KvtierConfigError

log = logging.getLogger("kvtier_vllm")


class Keys:
    """The engine's namespace and its keys' encodings.

    The namespace digests vLLM's root hash, which vLLM seeds after it builds
    the connector: it is fixed at the first key, not before."""

    def __init__(self, spec, address: str, served: Callable[[], str]):
        self._spec = spec
        self._address = address  # kvtierd's, for the errors
        self._served = served    # the namespace the session's kvtierd serves only ("": any)
        self.ns: Optional[str] = None
        self.fp = 0              # the namespace's fingerprint in the residency index

    def namespace(self) -> str:
        if self.ns is None:
            ns = self._spec.namespace()
            served = self._served()
            if served and served != ns:
                # NB: where the root hash could not be predicted at the
                # engine's start (check_served), the first key is the
                # earliest this is known. Every key would be refused (BAD_KEY).
                raise self.mismatch(served, repr(ns))
            self.ns, self.fp = ns, ns_fingerprint(ns)
            log.info("kvtier: layout namespace %s", self.ns)
        return self.ns

    def check_served(self, served: str) -> None:
        """A kvtierd that serves one namespace only: refused at the engine's
        start when none of the namespaces this engine can have is it."""
        if not served:
            return
        # NB: the namespaces it can have are known now by vLLM's own seed
        # rule; the one it has, at the first key (namespace).
        possible = self._spec.possible_namespaces()
        if possible is not None and served not in possible:
            raise self.mismatch(served, " or ".join(map(repr, possible)) or
                                "one of its own (vLLM seeds its root hash at random)")
        log.info("kvtier: kvtierd serves only namespace %r (checked at the first key)", served)

    def mismatch(self, served: str, ns: str) -> KvtierConfigError:
        return KvtierConfigError(
            f"kvtierd at {self._address} serves only namespace {served!r}, and this "
            f"engine's keys are in namespace {ns} (its model, KV layout and vLLM's root "
            f"hash): give kvtierd this namespace, or none")

    def wire(self, keys: Iterable[OffloadKey]) -> list:
        """Keys as the "keys" field: one [namespace, hash, group] each."""
        ns = self.namespace()
        return [[ns, bytes(k[:-4]), int.from_bytes(k[-4:], "big")] for k in keys]

    def fields(self, keys: List[OffloadKey]) -> dict:
        """Keys as the "pkeys" field: the hashes in one join, the groups in
        another (an OffloadKey ends with its group as 4 big-endian bytes,
        the wire's own encoding) — no Python object per key."""
        if not keys:
            return {"keys": []}
        n, hash_len = len(keys), len(keys[0]) - 4
        hashes = b"".join([k[:-4] for k in keys])
        if not 0 < hash_len <= 64 or len(hashes) != n * hash_len:
            return {"keys": self.wire(keys)}
        groups = b"".join([k[-4:] for k in keys])
        pk = {"ns": self.namespace(), "hash_len": hash_len, "hashes": hashes}
        if groups.count(groups[:4]) == n:
            pk["group"] = int.from_bytes(groups[:4], "big")
        else:
            pk["groups"] = groups
        return {"pkeys": pk}

    def unwire(self, keys) -> List[OffloadKey]:
        """The keys of this engine's namespace among wire keys (e.g. evicted)."""
        ns = self.namespace()
        return [make_offload_key(h, g) for n, h, g in keys if n == ns]

"""The OffloadingSpec vLLM loads (``spec_name: KvtierOffloadingSpec``,
``spec_module_path: kvtier_vllm``). vLLM builds it in the engine-core process
(which asks for the manager) and in every worker process (which asks for the
worker); both derive the same namespace and slot geometry from the same
``OffloadingConfig``, so they agree without talking."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional

from vllm.v1.kv_offload.base import OffloadingManager, OffloadingSpec, OffloadingWorker

from kvtier_client import default_address

from .layout import (KvtierConfigError, SlotGeometry, layout_namespace, none_hash_digest,
                     possible_none_hash_digests)

log = logging.getLogger("kvtier_vllm")

# kv_connector_extra_config keys this spec reads (README "Run vLLM with kvtier").
DEFAULTS: Dict[str, Any] = {
    "kvtier_address": None,         # kvtierd's engine address (default: $KVTIER_ADDRESS, else kvtierd's default socket)
    "kvtier_timeout_s": 2.0,        # bound on one synchronous call to kvtierd
    "kvtier_reconnect_s": 1.0,      # retry period while kvtierd is unreachable
    "kvtier_namespace_salt": "",    # tenant salt: engines with different salts never share
    "kvtier_model_id": None,        # model identity for the namespace (default: the model name/path)
    "kvtier_lookup_ttl_s": 10.0,    # re-ask kvtier for a request's HITs older than this (< lease_ttl)
    "kvtier_poll_us": 100,          # unix://: poll for a reply this long before blocking (0: off)
    "kvtier_store_credit": 64,      # slots kvtierd reserves ahead for this engine's stores (at least)
    "kvtier_events_topic": None,    # this engine's KV-events topic, told to kvtierd (kv@<pod>@<model>)
}


def _extra(config) -> Dict[str, Any]:
    extra = dict(DEFAULTS)
    extra.update({k: v for k, v in dict(config.extra_config).items() if k in DEFAULTS})
    if not extra["kvtier_address"]:
        # NB: the rule kvtierd follows when started with no --engine-listen.
        extra["kvtier_address"] = default_address()
    return extra


class KvtierOffloadingSpec(OffloadingSpec):
    """kvtier as vLLM's offloading tier: blocks go to (and come back from)
    a kvtierd's CPU pool, and cascade from there to its secondary tiers."""

    def __init__(self, config):
        super().__init__(config)
        self.kvtier = _extra(config)
        if getattr(config, "canonical_layout", False):
            raise KvtierConfigError(
                "kvtier stores each worker's pages as the engine lays them out "
                "(vLLM's direct layout); canonical_layout is not supported")
        par = config.parallel
        self.geometry = SlotGeometry(
            world_size=par.world_size,
            blocks_per_chunk=self.blocks_per_chunk,
            shard_bytes=config.worker_kv_bytes_per_block * self.blocks_per_chunk,
        )
        self.rank = par.rank
        self._manager = None
        self._worker = None

    def layout_facts(self) -> Dict[str, Any]:
        """Everything that makes equal block hashes incompatible."""
        c, par = self.config, self.config.parallel
        return {
            "model": self.kvtier["kvtier_model_id"] or c.model.name,
            "dtype": str(c.model.dtype),
            "kv_layout": getattr(c, "kv_cache_layout", None),
            "canonical": bool(getattr(c, "canonical_layout", False)),
            "worker_page_bytes": c.worker_kv_bytes_per_block,
            "tokens_per_block": list(self.tokens_per_block),
            "tokens_per_hash": self.tokens_per_hash,
            "blocks_per_chunk": self.blocks_per_chunk,
            "world": [par.world_size, par.tp_size, par.pp_size, par.pcp_size, par.dcp_size],
            "groups": [[g.group_id, len(g.layer_names)] for g in c.groups],
            "salt": self.kvtier["kvtier_namespace_salt"],
        }

    def events_topic(self) -> str:
        """The topic of this engine's own KV events (``kvtier_events_topic``),
        told to kvtierd so that it announces the blocks this engine can load
        under it too: a router that credits pods by topic then credits this
        one. "" when not given. NB: vLLM hands the spec no kv_events_config;
        a kvtierd that learns from the engine's events (--events-learn-from)
        takes the topic from the engine's stream instead."""
        return str(self.kvtier["kvtier_events_topic"] or "")

    def namespace(self) -> str:
        """The namespace of this engine's keys. Reads vLLM's root hash, so
        call it once the engine hashed its first request (vLLM seeds it after
        building the connector)."""
        digest, reproducible = none_hash_digest()
        if not reproducible:
            log.warning(
                "kvtier: vLLM's block hashes are seeded at random in this process "
                "(a non-cryptographic prefix_caching_hash_algo without "
                "PYTHONHASHSEED); its blocks can only be reused by this process. "
                "Set PYTHONHASHSEED to the same value on every engine, or use sha256.")
        return layout_namespace({**self.layout_facts(), "root_hash": digest})

    def possible_namespaces(self) -> Optional[List[str]]:
        """Every namespace() this engine can have once vLLM seeded its root
        hash, known before it (at the engine's start):
        layout.possible_none_hash_digests. None where unknowable."""
        digests = possible_none_hash_digests()
        if digests is None:
            return None
        return [layout_namespace({**self.layout_facts(), "root_hash": d}) for d in digests]

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            from .manager import KvtierManager

            self._manager = KvtierManager(self)
        return self._manager

    def get_worker(self, kv_caches) -> OffloadingWorker:
        if self._worker is None:
            from .worker import KvtierWorker

            self._worker = KvtierWorker(self, kv_caches)
        return self._worker

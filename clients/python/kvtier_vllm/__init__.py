"""kvtier as vLLM's KV offloading tier.

vLLM's ``OffloadingConnector`` loads this package's spec out of tree::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector",
      "kv_role": "kv_both",
      "kv_connector_extra_config": {
        "spec_name": "KvtierOffloadingSpec",
        "spec_module_path": "kvtier_vllm",
        "kvtier_address": "ipc:///run/kvtier/engine.sock"}}'

The scheduler side (:mod:`.manager`, on :mod:`.session`, :mod:`.lookups`,
:mod:`.stores`, :mod:`.credit`) answers vLLM's per-key lookups from one
batched, leasing Lookup per request; the worker side (:mod:`.worker`) copies
engine blocks to and from kvtier's shared-memory pool. :mod:`.layout` holds
the pure parts both sides share (namespace, slot geometry, copy plans).
"""

from .spec import KvtierOffloadingSpec  # noqa: F401

__all__ = ["KvtierOffloadingSpec"]

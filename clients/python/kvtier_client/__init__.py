"""Python client of kvtierd's engine endpoint (standalone mode).

The wire format is docs/PROTOCOL.md ("Engine protocol"). This module is the
minimal layer an inference-engine connector (e.g. a vLLM KV connector) builds
on: a DEALER socket speaking msgpack, the shared CPU pool mapped read-write
with ``mmap``, and one method per manager call. Dependencies: pyzmq, msgpack.
"""

from .address import default_address  # noqa: F401
from .client import (  # noqa: F401
    HIT,
    HIT_PENDING,
    MISS,
    RETRY,
    Client,
    Hello,
    KvtierError,
    LoadJob,
    StorePlan,
    Request,
)

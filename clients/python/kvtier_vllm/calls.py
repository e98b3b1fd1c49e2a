"""The manager's calls in flight: what each one's reply settles, and the
outbox that sends a step's calls in one write and reads replies without
blocking.

A call is queued in one of three ways:

- **awaited**: its reply settles a record kept here (a leasing lookup, a
  store, a grant);
- **quiet**: kvtierd answers only if it fails, the error naming its op (a
  load's pin, a store's commit);
- **noreply**: kvtierd sends nothing (touch, complete_load, request_finished).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

from vllm.v1.kv_offload.base import OffloadKey

from kvtier_client import Client


@dataclass
class StoreBatch:
    """One ``store`` message: keys bound to credited slots. Lives until every
    key was completed (and the daemon said which keys it bound)."""

    keys: List[OffloadKey]
    slots: List[int]
    req: dict                           # the request's wire context
    epoch: int                          # the link's session it was sent in
    bound: Optional[List[bool]] = None  # the daemon's answer; None until it came
    failed: bool = False                # the daemon refused the store: no slot is ours to reuse
    open: int = 0                       # keys not completed yet
    completed: Dict[OffloadKey, None] = field(default_factory=dict)  # keys completed (each once)
    queued: float = 0.0                 # when the store was queued (monotonic): its answer is due
    deferred: List[Tuple[List[OffloadKey], bool]] = field(default_factory=list)  # completions awaiting `bound`


@dataclass
class LookupCall:
    """A request's leasing Lookup: its answer counts only in the lookup
    generation it was asked in (a lost session or reset_cache ends one)."""

    req_id: str
    keys: List[OffloadKey]
    generation: int


@dataclass
class StoreCall:
    """A ``store``: its answer says which of the batch's keys were bound."""

    batch: StoreBatch


@dataclass
class GrantCall:
    """Credit asked for ahead of need: n slots, void in a later session."""

    n: int
    epoch: int


Call = Union[LookupCall, StoreCall, GrantCall]


class Outbox:
    """Calls queued for the next flush, and the records of those awaited."""

    def __init__(self) -> None:
        self.frames: List[dict] = []        # queued, sent at the next flush
        self._keep: List[int] = []          # ids among them whose replies are read
        self.awaited: Dict[int, Call] = {}  # id → the record its reply settles

    def queue(self, client: Client, op: str, call: Optional[Call] = None, quiet: bool = False,
              **fields) -> int:
        """Queues op; awaited when call is given, else quiet or noreply."""
        if quiet:
            call, fields["quiet"] = None, True
        elif call is None:
            fields["noreply"] = True
        rid, frame = client.call(op, **fields)
        self.frames.append(frame)
        if call is not None:
            self._keep.append(rid)
            self.awaited[rid] = call
        return rid

    def exchange(self, client: Client, send: bool, wait_ms: int) -> List[Tuple[int, dict]]:
        """Sends what is queued (one frame for the lot, when send) and takes
        the replies that came, waiting up to wait_ms for one. Raises
        KvtierError when the link fails."""
        if send and self.frames:
            frames, keep = self.frames, self._keep
            self.frames, self._keep = [], []
            client.send_calls(frames, keep)
        return client.take_replies(wait_ms)

    def settled(self, rid: int) -> Optional[Call]:
        """The record rid's reply settles (None: a quiet call's refusal)."""
        return self.awaited.pop(rid, None)

    def void(self) -> None:
        """The session is gone: nothing queued goes out, no reply counts."""
        self.frames, self._keep = [], []
        self.awaited.clear()

"""Store credit: pool slots kvtierd reserved for this engine's stores ahead
of need, so that ``prepare_store`` binds keys to slots without a round trip.

Credit is sized by what the next step will store: the keys past the hits of
the requests a step scanned and did not defer (their prefill's blocks,
stored at the next step's ``build_connector_meta``). It is asked for without
waiting before the forward pass; when it runs short anyway, one synchronous
grant a step. Credited slots sit empty out of the cache every engine shares,
so once a step's stores took theirs, a refill asks only for the next
step's: the credit held is about one step's stores, not two.
"""

from __future__ import annotations

from typing import Callable, Iterable, List, Optional

from vllm.v1.kv_offload.base import OffloadKey

from kvtier_client import Client

from .calls import GrantCall, Outbox


class Credit:
    def __init__(self, minimum: int):
        self.minimum = minimum        # kvtier_store_credit; 0 turns credit off
        self.slots: List[int] = []    # reserved for our stores
        self.granting = 0             # asked for and not yet granted
        self.target = minimum         # what a refill asks up to
        self._floor = minimum         # ... once this step's stores took theirs
        self._need_now = 0            # stores predicted for this step's meta
        self._need_next = 0           # ... for the next step's
        self._granted_now_step = -1   # the step credit was granted synchronously in
        self.evicted: List[OffloadKey] = []  # evictions granting made, for the next store's output

    def on(self, client: Optional[Client]) -> bool:
        """Stores go through credit: the link is up and credit is not
        turned off (kvtier_store_credit: 0)."""
        return self.minimum > 0 and client is not None

    def take(self, n: int) -> List[int]:
        """n slots off the credit (the caller checked there are n). The
        step's own stores are then covered: a refill asks only for the
        next step's (credited slots sit empty, out of the cache)."""
        slots = self.slots[-n:]
        del self.slots[-n:]
        self.target = max(self._floor, self.target - n)
        return slots

    def give(self, slots: Iterable[int]) -> None:
        """Slots back to the credit (a duplicate's: its copy is over)."""
        self.slots.extend(slots)

    def take_evicted(self) -> List[OffloadKey]:
        evicted, self.evicted = self.evicted, []
        return evicted

    def refill(self, outbox: Outbox, client: Optional[Client], epoch: int, short: int = 0) -> None:
        """Asks for credit up to the target (without waiting)."""
        if client is None or not self.minimum:
            return
        want = max(self.target, short) - len(self.slots) - self.granting
        if want > 0 and (short or want >= max(8, self.target // 16)):
            self.granting += want
            outbox.queue(client, "grant", GrantCall(want, epoch), n=want)

    def granted(self, call: GrantCall, reply: dict, epoch: int,
                unwire: Callable[[list], List[OffloadKey]]) -> None:
        """A grant's reply: its slots are ours if it is of this session."""
        self.granting -= call.n
        if not reply.get("err") and call.epoch == epoch:
            self.slots.extend(reply["slots"])
            self.evicted.extend(unwire(reply.get("evicted") or []))

    def begun(self, grant: Callable[[int], Optional[dict]]) -> None:
        """A new session: its credit starts with one synchronous grant."""
        r = grant(self.target)
        if r is not None:
            self.slots.extend(r["slots"])

    def grant_now(self, need: int, step: int, grant: Callable[[int], Optional[dict]],
                  unwire: Callable[[list], List[OffloadKey]]) -> None:
        """Credit ran short in this step: one synchronous grant for the rest
        of the step (never more than one a step), so the step's other
        stores do not each wait."""
        if self._granted_now_step == step:
            return
        self._granted_now_step = step
        r = grant(max(need - len(self.slots), self.target // 2))
        if r is not None:
            self.slots.extend(r["slots"])
            self.evicted.extend(unwire(r.get("evicted") or []))

    def predict(self, need_next: int) -> None:
        """At on_schedule_end: this step's stores were predicted a step ago;
        need_next is the next step's. NB: asked for now, before this step's
        forward pass: the grant is back long before the next step's stores."""
        self._need_now, self._need_next = self._need_next, need_next
        self.target = self._with_margin(self._need_now + self._need_next)
        # NB: a quarter's margin once the step's stores are covered: the
        # prediction misses the requests deferred this step (their stores
        # come later); an eighth made the scheduler wait on a grant more
        # often (docs/PERFORMANCE.md, "Credit sized by the next step").
        self._floor = max(self.minimum, need_next + need_next // 4) if self.minimum > 0 else 0

    def _with_margin(self, need: int) -> int:
        return max(self.minimum, need + need // 8) if self.minimum > 0 else 0

    def void(self) -> None:
        """The session is gone: its reserved slots with it."""
        self.slots.clear()
        self.granting = 0

"""The manager's session with kvtierd: the link, the calls in flight on it,
and what ends it. Calls go out in one write at each flush; replies are read
without blocking and handed to the manager; an error that says the session
is gone (link.LINK_ERRORS), from any call, ends it, and everything the
session held is void (``voided``) until the link's reconnect brings a new
one (``begun``).
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from kvtier_client import Client, KvtierError

from .calls import Call, Outbox
from .link import LINK_ERRORS, Link, link_error


class Session:
    def __init__(self, link: Link, settled: Callable[[Call, dict], None],
                 refused: Callable[[dict], None], voided: Callable[[], None]):
        self.link = link
        self.out = Outbox()
        self._settled = settled  # an awaited call's reply
        self._refused = refused  # a quiet call's error, its only reply
        self._voided = voided    # the session is gone: void what it held
        self.begun: Callable[[], None] = lambda: None  # a new session was taken over
        self.blocking_calls = 0  # calls that waited on kvtierd

    def queue(self, op: str, call: Optional[Call] = None, quiet: bool = False, **fields) -> int:
        """Queues op for the next flush (outbox.Outbox.queue)."""
        client = self.link.client
        assert client is not None, "queued while the link is down"
        return self.out.queue(client, op, call, quiet, **fields)

    def up(self) -> bool:
        """Up, taking over a reconnected session (begun)."""
        link = self.link
        epoch = link.epoch
        up = link.up()
        if up and link.epoch != epoch:
            self.begun()
        return up and link.client is not None

    def flush(self, send: bool = True, wait_ms: int = 0) -> None:
        """Sends what is queued (one write) and reads the replies that came;
        without send, only reads. Waits for a reply up to wait_ms only
        (0 on vLLM's path: never)."""
        client = self.link.client if self.link.up() else None
        if client is None:
            return
        try:
            replies = self.out.exchange(client, send, wait_ms)
        except KvtierError as e:
            self.lost(e)
            return
        for rid, reply in replies:
            err = reply.get("err")
            if err is not None and link_error(err):
                # NB: whichever call it answers (a quiet one, a store, a
                # lookup): the session is gone — e.g. a restarted kvtierd
                # that ZeroMQ reconnected this socket to, which knows no
                # session of ours. Nothing it answers from now on counts.
                self.lost(KvtierError(err.get("code", ""), err.get("msg", "")))
                return
            call = self.out.settled(rid)
            if call is not None:
                self._settled(call, reply)
            elif err is not None:
                self._refused(err)

    def call(self, fn, *args, **kw):
        """A synchronous call (counted); None when the link is down or goes down."""
        if not self.up():
            return None
        self.flush()  # NB: what was queued first is processed first
        if self.link.client is None:
            return None
        self.blocking_calls += 1
        try:
            return fn(self.link.client, *args, **kw)
        except KvtierError as e:
            if e.code in LINK_ERRORS or e.code == "TIMEOUT" and "no reply within" in e.msg:
                self.lost(e)
                return None
            raise

    def grant(self, n: int) -> Optional[dict]:
        """A synchronous grant of n credit slots."""
        return self.call(Client._call, "grant", n=n)

    def lost(self, err: Exception) -> None:
        """The session is gone: what it held (leases, credit, stores) is void."""
        self.link.lost(err)
        self.out.void()
        self._voided()

    def drain(self, timeout: float) -> None:
        """Tests and tools only (it waits): sends what is queued and waits
        until every call sent has taken effect."""
        deadline = time.monotonic() + timeout
        self.flush()
        while self.out.awaited and self.link.client is not None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"kvtier: {len(self.out.awaited)} replies not in after {timeout}s")
            self.flush(wait_ms=10)  # NB: sends too what an answer queued (a deferred completion)
        # Quiet calls (pins, commits) send no reply: the session says when
        # every call sent has taken effect.
        while self.link.client is not None:
            try:
                if self.link.client.stats().get("session_calls_in_flight", 0) == 0:
                    break
            except KvtierError as e:
                self.lost(e)
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"kvtier: calls still in flight after {timeout}s")
        self.flush()  # NB: a quiet call's refusal

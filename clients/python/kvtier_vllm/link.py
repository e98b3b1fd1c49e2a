"""The scheduler's connection to kvtierd, and its replacement when kvtierd
goes away (a background thread reconnects; the manager takes the new session
over at its next call)."""

from __future__ import annotations

import logging
import threading
from typing import Optional

from kvtier_client import Client, KvtierError
from kvtier_client.residency import Residency

from .layout import KvtierConfigError, PoolRef

log = logging.getLogger("kvtier_vllm")

# Errors that mean the connection or session is gone, not that one call was
# refused. NB: not TIMEOUT: the daemon's TIMEOUT answers one slow call on a
# live session (a call this client timed out on is raised as LINK_TIMEOUT).
LINK_ERRORS = frozenset({"CLOSED", "NO_SESSION", "BAD_VERSION", "BAD_REPLY", "LINK_TIMEOUT"})


def link_error(err) -> bool:
    """An error reply that says the session is gone (not one call refused)."""
    return isinstance(err, dict) and err.get("code") in LINK_ERRORS


class Link:
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
        that answers but cannot serve this engine, or a failure of this
        side (neither a kvtier nor an OS error), is said once per cause."""
        if isinstance(e, KvtierConfigError):
            said = f"cannot serve this engine: {e}"
        elif isinstance(e, (KvtierError, OSError)):
            log.debug("kvtier: reconnect to %s failed: %s", self.address, e)
            return
        else:
            said = f"reconnect failed: {type(e).__name__}: {e}"
        if said != self._failure:
            self._failure = said
            log.warning("kvtier: %s %s", self.address, said)

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

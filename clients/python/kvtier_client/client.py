"""The kvtierd engine-protocol client. See docs/PROTOCOL.md."""

from __future__ import annotations

import ctypes
import itertools
import mmap
import os
import select
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass
from operator import itemgetter
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import msgpack
import zmq

# NB: the constants are re-exported here, where connectors and tests read them.
from .protocol import (  # noqa: F401
    HIT,
    HIT_PENDING,
    MAX_BATCH_CALLS,
    MAX_FRAME_BYTES,
    MAX_HASH_BYTES,
    MISS,
    OPS,
    PROTOCOL_VERSION,
    RETRY,
)

# A key is (namespace: str, block hash: bytes, group: int).
Key = Tuple[str, bytes, int]


class KvtierError(Exception):
    """An error reply. ``code`` is the wire code (FULL, UNKNOWN_KEY, ...)."""

    def __init__(self, code: str, msg: str):
        super().__init__(f"{code}: {msg}")
        self.code = code
        self.msg = msg


@dataclass
class Request:
    """A request context (vLLM's request + provenance for KV events)."""

    id: str
    workers: int = 0
    tiers: Sequence[str] = ()
    peers: Sequence[str] = ()  # node ids it may fetch from (vLLM remote_kv_source)
    parent: Optional[bytes] = None
    tokens: Sequence[int] = ()
    block_size: int = 0
    lora_id: int = 0
    lora_name: str = ""
    extra: Sequence[str] = ()
    kv_cache_spec_kind: str = ""  # vLLM 0.33 KVCacheSpecKind value, e.g. "full_attention"
    sliding_window: int = 0       # the group's sliding window in tokens; 0 = none
    session_id: str = ""

    # The optional fields, in wire order: each is sent only when set (a
    # parent hash even when empty), never as an empty value.
    _SCALARS = ("workers",)
    _LISTS = ("tiers", "peers")
    _PROVENANCE = ("block_size", "lora_id", "lora_name")
    _VLLM_033 = ("kv_cache_spec_kind", "sliding_window", "session_id")

    def wire(self) -> dict:
        m: dict = {"id": self.id}
        self._put(m, self._SCALARS)
        for name in self._LISTS:
            if getattr(self, name):
                m[name] = list(getattr(self, name))
        if self.parent is not None:
            m["parent"] = bytes(self.parent)
        if self.tokens:
            m["tokens"] = struct.pack(f"<{len(self.tokens)}i", *self.tokens)
        self._put(m, self._PROVENANCE)
        if self.extra:
            m["extra"] = list(self.extra)
        self._put(m, self._VLLM_033)
        return m

    def _put(self, m: dict, names: Sequence[str]) -> None:
        for name in names:
            value = getattr(self, name)
            if value:
                m[name] = value


@dataclass
class Hello:
    protocol: int
    session: int
    pool_path: str
    block_bytes: int
    slots: int
    namespace: str
    heartbeat_ms: int
    grace_ms: int
    max_keys: int
    max_frame_bytes: int
    job_workers: int
    packed_keys: bool = False  # the daemon reads "pkeys"; older daemons do not say
    index_path: str = ""       # the residency index (kvtier_client.residency); "" = none
    index_complete: bool = False  # the index covers every tier: a key it lacks is a MISS
    credit: bool = False       # the daemon serves grant / store (slot credit)
    batch: bool = False        # the daemon reads batch frames and quiet calls


@dataclass
class LoadJob:
    job: int
    slots: List[int]
    workers: int


@dataclass
class StorePlan:
    job: int
    to_store: List[Key]
    slots: List[int]
    evicted: List[Key]
    workers: int


def _key_list(keys: Sequence[Key]) -> dict:
    """keys as the "keys" field: one [namespace, hash, group] per key."""
    return {"keys": [[ns, bytes(h), int(g)] for ns, h, g in keys]}


_first, _hash, _group = itemgetter(0), itemgetter(1), itemgetter(2)


def _key_field(keys: Sequence[Key]) -> dict:
    """keys as "pkeys" (docs/PROTOCOL.md, "Common values") when they share a
    namespace and a hash length: their hashes joined in one bin, their
    group once or packed; no Python object per key. Otherwise "keys"."""
    if not keys:
        return {"keys": []}
    # NB: map/count run in C: ~45 µs for 2,000 keys, against ~400 µs for a
    # list per key (docs/PERFORMANCE.md).
    n, ns = len(keys), keys[0][0]
    hashes = list(map(_hash, keys))
    hash_len = len(hashes[0])
    if (not 0 < hash_len <= MAX_HASH_BYTES or list(map(_first, keys)).count(ns) != n
            or list(map(len, hashes)).count(hash_len) != n):
        return _key_list(keys)
    joined = b"".join(hashes)
    if len(joined) != n * hash_len:  # NB: a memoryview of wider items: len() counts items, not bytes
        return _key_list(keys)
    pk = {"ns": ns, "hash_len": hash_len, "hashes": joined}
    groups = list(map(_group, keys))
    if groups.count(groups[0]) == n:
        pk["group"] = int(groups[0])
    else:
        try:
            pk["groups"] = struct.pack(f">{n}I", *groups)
        except struct.error:  # a group outside uint32: sent as it is, refused by the daemon
            return _key_list(keys)
    return {"pkeys": pk}


def _check_op(op: str) -> None:
    if op not in OPS:  # NB: a typo, caught here rather than as the daemon's UNKNOWN_OP
        raise ValueError(f"{op!r} is not an operation of protocol {PROTOCOL_VERSION}")


def _unkeys(raw) -> List[Key]:
    return [(k[0], bytes(k[1]), int(k[2])) for k in raw or []]


_LEN = struct.Struct(">I")  # a unix:// frame's length prefix
_BATCH_CALLS = min(1024, MAX_BATCH_CALLS)  # calls per batch frame

# How long a unix:// call polls for its reply before blocking (µs): a
# 16-key Lookup's reply comes within it on a quiet node.
DEFAULT_POLL_US = 100


class _SignalMask:
    """Blocks every signal in the calling thread around a short blocking
    recv, through libc's pthread_sigmask on prebuilt sets: ~1.6 µs a pair,
    where Python's signal.pthread_sigmask, which builds Python sets, costs
    ~60 µs. One per transport; calls are serialized by the client's lock."""

    def __init__(self):
        libc = ctypes.CDLL(None, use_errno=True)
        self._set = libc.pthread_sigmask
        self._set.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        self._full, self._old = (ctypes.c_ubyte * 128)(), (ctypes.c_ubyte * 128)()  # NB: sizeof(sigset_t) is 128 in glibc and musl
        if libc.sigfillset(ctypes.byref(self._full)) != 0:
            raise OSError("sigfillset failed")
        self._pfull, self._pold = ctypes.addressof(self._full), ctypes.addressof(self._old)

    def block(self) -> None:
        if self._set(signal.SIG_BLOCK, self._pfull, self._pold) != 0:
            raise OSError(ctypes.get_errno(), "pthread_sigmask")

    def restore(self) -> None:
        self._set(signal.SIG_SETMASK, self._pold, None)


def _signal_mask():
    """A _SignalMask, or None where libc cannot be reached (the wait is then
    a select() from the start)."""
    try:
        return _SignalMask()
    except (OSError, AttributeError, TypeError):
        return None


class _ZmqTransport:
    """ipc:// and tcp://: one ZeroMQ DEALER, and a monitor of its connection.

    A DEALER whose peer died does not fail: its sends queue for a
    reconnect, and a killed kvtierd would be silence until a reply's wait
    ran out (and a restarted one would be handed the dead session's
    frames). libzmq's I/O thread does see the connection end; the monitor
    socket carries that here, so the first call after it (or a reply wait
    under way) raises CLOSED, as a unix:// stream's broken pipe does."""

    def __init__(self, addr: str, timeout: float):
        self._sock: Any = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        # A routing id of its own: kvtierd learns a connection's end by the
        # identity in its handshake and releases that session at once (a
        # libzmq DEALER sends none by default, and a killed engine's session
        # would then stay open, holding its credit, until kvtierd stops).
        self._sock.setsockopt(zmq.ROUTING_ID, b"py-" + os.urandom(12).hex().encode())
        # NB: a monitor address of its own. pyzmq's default names it after
        # the socket's file descriptor, which the next socket reuses once
        # this one is closed, while libzmq unbinds the old name later, on
        # its reaper thread: a client made right after another failed (a
        # reconnect after SIZING) could not monitor ("Address already in use").
        self._mon: Any = self._sock.get_monitor_socket(
            zmq.EVENT_DISCONNECTED, addr=f"inproc://kvtier-monitor-{os.urandom(8).hex()}")
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._mon, zmq.POLLIN)
        self._gone = False
        try:
            self._sock.connect(addr)
        except zmq.ZMQError:
            self.close()
            raise

    def _check(self) -> None:
        """Raises once the connection to kvtierd ended (and from then on)."""
        if not self._gone:
            try:
                self._mon.recv_multipart(zmq.NOBLOCK)  # only DISCONNECTED is monitored
                self._gone = True
            except zmq.Again:
                return
        raise ConnectionResetError("kvtierd closed the connection")

    def send(self, frame: bytes) -> None:
        self._check()
        self._sock.send(frame)

    def send_many(self, frames: Sequence[bytes]) -> None:
        self._check()
        for f in frames:
            self._sock.send(f)

    def poll(self, wait_ms: int) -> bool:
        self._check()
        ready = dict(self._poller.poll(wait_ms))
        # NB: the end is read first: what comes after it is a restarted
        # kvtierd's answer to the dead session's queued frames.
        self._check()
        return self._sock in ready

    def recv(self) -> bytes:
        return self._sock.recv()

    def drain(self) -> List[bytes]:
        """Every frame that has arrived, without waiting."""
        self._check()
        out = []
        try:
            while True:
                out.append(self._sock.recv(zmq.NOBLOCK))
        except zmq.Again:
            return out

    def close(self) -> None:
        self._sock.disable_monitor()
        self._mon.close()
        self._sock.close()


class _UnixTransport:
    """unix:///path: each frame preceded by its length (u32 big-endian) on a
    Unix stream socket (docs/PROTOCOL.md, "Transport"). No I/O thread: a
    call is one write and one read.

    A reply is awaited first in a blocking ``recv`` bounded by SO_RCVTIMEO
    (the first ``_FAST_MS``), not a select() followed by a recv: the kernel
    then wakes this thread straight into the read, ~20 µs sooner per call on
    a small VM (docs/PERFORMANCE.md, "Small Lookups and the floors under
    them"). Signals are blocked in this thread meanwhile: an interrupted
    recv would be restarted by Python with a fresh SO_RCVTIMEO, and a stream
    of signals (a profiler's timer) could stretch the wait without end. The
    rest of a longer wait is a select() (interruptible, its timeout
    recomputed after a signal). A wait of 0 is one non-blocking recv.

    Before any of that, a wait polls for ``poll_s`` (non-blocking recvs):
    a small call's reply usually lands within it, and this thread is then
    awake to take it instead of being woken, tens of µs on a VM whose idle
    vCPUs halt (docs/PERFORMANCE.md, issue 17 "Round 4"). It spends this
    thread's core for up to ``poll_s`` each time the thread would block
    (once for most replies; again for each further piece of a reply that
    arrives in pieces), while the caller would be waiting anyway, and a
    wait may end up to ``poll_s`` past its bound; 0 turns it off."""

    _CHUNK = 1 << 16  # bytes read per recv
    _FAST_MS = 2      # the blocking recv's bound; longer waits go on in select()

    def __init__(self, path: str, timeout: float, poll_s: float = 0.0):
        deadline = time.monotonic() + timeout
        while True:  # the daemon may still be starting
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                s.close()
                if time.monotonic() > deadline:
                    raise KvtierError("UNAVAILABLE", f"no daemon at unix://{path}")
                time.sleep(0.01)
        s.settimeout(None)  # NB: blocking, whatever socket.setdefaulttimeout says
        self._s = s
        self._rcvtimeo_ms = -1  # SO_RCVTIMEO as last set; -1 = never
        self._chunk = bytearray(self._CHUNK)
        self._view = memoryview(self._chunk)
        self._buf = bytearray()  # bytes read and not yet taken by recv()
        self._mask = _signal_mask()
        self._poll_s = poll_s

    def send(self, frame: bytes) -> None:
        self._s.sendall(struct.pack(">I", len(frame)) + frame)

    def send_many(self, frames: Sequence[bytes]) -> None:
        """Every frame in one write: one syscall for a step's batch."""
        parts = []
        for f in frames:
            parts.append(struct.pack(">I", len(f)))
            parts.append(f)
        self._s.sendall(b"".join(parts))

    def _complete(self) -> bool:
        if len(self._buf) < 4:
            return False
        n = struct.unpack_from(">I", self._buf)[0]
        if n == 0 or n > MAX_FRAME_BYTES:
            raise KvtierError("BAD_REPLY", f"frame length {n}")
        return len(self._buf) >= 4 + n

    def _set_rcvtimeo(self, ms: int) -> None:
        if ms != self._rcvtimeo_ms:  # NB: one setsockopt per change, none per call
            self._s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                               struct.pack("ll", ms // 1000, (ms % 1000) * 1000))
            self._rcvtimeo_ms = ms

    def _recv(self, flags: int = 0):
        """One recv_into; None when nothing was there (EAGAIN)."""
        try:
            n = self._s.recv_into(self._view, self._CHUNK, flags)
        except BlockingIOError:  # nothing yet (EAGAIN: SO_RCVTIMEO ran out)
            return None
        if n == 0:
            raise KvtierError("CLOSED", "the daemon closed the connection")
        self._buf += self._view[:n]
        return n

    def _fill(self, wait_ms: int) -> bool:
        """Reads what arrives within wait_ms (0: what is there); False when
        nothing did."""
        if wait_ms <= 0:
            return self._recv(socket.MSG_DONTWAIT) is not None
        if self._poll_s > 0 and self._polled(min(self._poll_s, wait_ms / 1000.0)):
            return True
        fast = 0
        if self._mask is not None:
            fast = min(wait_ms, self._FAST_MS)
            self._set_rcvtimeo(fast)
            self._mask.block()
            try:
                if self._recv() is not None:
                    return True
            finally:
                self._mask.restore()
            if wait_ms <= fast:
                return False
        ready, _, _ = select.select([self._s], [], [], (wait_ms - fast) / 1000.0)
        return bool(ready) and self._recv(socket.MSG_DONTWAIT) is not None

    def _polled(self, for_s: float) -> bool:
        """Non-blocking recvs for up to for_s; True once something came."""
        end = time.perf_counter() + for_s
        while self._recv(socket.MSG_DONTWAIT) is None:
            if time.perf_counter() >= end:
                return False
        return True

    def poll(self, wait_ms: int) -> bool:
        if wait_ms <= 0:
            while not self._complete():
                if not self._fill(0):
                    return False
            return True
        end = time.monotonic() + wait_ms / 1000.0
        while not self._complete():
            left_ms = int((end - time.monotonic()) * 1000.0 + 0.999)
            if left_ms <= 0:
                return False
            self._fill(left_ms)
        return True

    def recv(self) -> bytes:
        n = struct.unpack_from(">I", self._buf)[0]
        frame = bytes(self._buf[4:4 + n])
        del self._buf[:4 + n]
        return frame

    def drain(self) -> List[bytes]:
        """Every complete frame that has arrived, without waiting: what the
        socket holds in as few reads as it takes, then split in one pass
        (a step's replies, which the daemon writes together)."""
        while self._recv(socket.MSG_DONTWAIT) == self._CHUNK:
            pass  # NB: a short read means the socket is empty
        buf, out, at = self._buf, [], 0
        end = len(buf)
        unpack = _LEN.unpack_from
        while end - at >= 4:
            n = unpack(buf, at)[0]
            if n == 0 or n > MAX_FRAME_BYTES:
                raise KvtierError("BAD_REPLY", f"frame length {n}")
            if end - at - 4 < n:
                break
            out.append(bytes(buf[at + 4:at + 4 + n]))
            at += 4 + n
        if at:
            del buf[:at]
        return out

    def close(self) -> None:
        self._view.release()
        self._s.close()


def _transport(addr: str, timeout: float, poll_us: float):
    if addr.startswith("unix://"):
        return _UnixTransport(addr[len("unix://"):], timeout, poll_us / 1e6)
    return _ZmqTransport(addr, timeout)


class Client:
    """One engine connection. Calls are thread-safe (one lock around the
    socket); a background thread pings while the engine is idle so the
    daemon does not release the session after its grace period. Over
    unix://, a call polls for its reply for ``poll_us`` before blocking
    (_UnixTransport); ipc:// and tcp:// ignore it. ``block_bytes`` > 0 is
    declared in the hello (the bytes one block of this engine takes in a
    slot): a kvtierd started with no block size sizes its slots from the
    first engine's, answering that hello SIZING — connect again. ``topic``,
    when given, is the topic of the engine's own KV events
    (``kv@<pod>@<model>``): kvtierd then announces the blocks of this
    engine's key namespace under it too (docs/PROTOCOL.md, "KV events")."""

    def __init__(self, addr: str, name: str = "python", timeout: float = 10.0,
                 heartbeat: bool = True, poll_us: float = DEFAULT_POLL_US, block_bytes: int = 0,
                 topic: str = ""):
        if poll_us < 0:
            raise ValueError(f"poll_us {poll_us} must be >= 0")
        self._sock = _transport(addr, timeout, poll_us)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._timeout = timeout
        self._closed = False
        self._last_send = time.monotonic()
        self._awaited: set = set()  # ids of calls whose replies are kept
        self._stash: Dict[int, dict] = {}  # replies read but not yet taken
        self._batched: set = set()  # ids sent by send_frames whose replies take_replies returns
        # Error replies to calls nobody awaits (a quiet call's failure: its
        # only reply), handed out by take_replies; bounded.
        self._orphans: Deque[Tuple[int, dict]] = deque(maxlen=1024)
        self._stop = threading.Event()
        self._hb: Optional[threading.Thread] = None
        self._mm: Optional[mmap.mmap] = None
        try:
            self._open(name, block_bytes, topic)
        except BaseException:
            # NB: a failed hello (SIZING, a timeout, a bad pool) must not
            # leave its socket behind: an engine retries every second.
            self.close(bye=False)
            raise
        if heartbeat:
            self._hb = threading.Thread(target=self._heartbeat, daemon=True)
            self._hb.start()

    def _open(self, name: str, block_bytes: int, topic: str) -> None:
        """Says hello and maps the pool the answer names."""
        fields: Dict[str, Any] = {"client": name}
        if block_bytes > 0:
            fields["block_bytes"] = block_bytes
        if topic:
            fields["topic"] = topic
        h = self._call("hello", **fields)
        self.hello = Hello(**{k: h[k] for k in Hello.__dataclass_fields__ if k in h})
        self._key_field = _key_field if self.hello.packed_keys else _key_list
        if self.hello.protocol != PROTOCOL_VERSION:
            raise KvtierError("BAD_VERSION", f"daemon speaks {self.hello.protocol}")
        fd = os.open(self.hello.pool_path, os.O_RDWR)
        try:
            # NB: at least: a session of another block size than the pool's
            # first has as many slots as fit the same file, not always all of it.
            size = self.hello.slots * self.hello.block_bytes
            if os.fstat(fd).st_size < size:
                raise KvtierError("BAD_REPLY", "pool file smaller than hello says")
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.pool = memoryview(self._mm)

    # -- transport -----------------------------------------------------
    #
    # One connection (a DEALER, or a unix:// stream), one lock. A call is sent and its reply awaited (_call), or
    # sent without waiting (send: the reply is read later by ready()/wait(),
    # or dropped when nobody asked for it: fire-and-forget). Replies are
    # matched by id; a reply read while waiting for another is kept if its
    # call is still awaited, so no caller ever loses an answer.

    def _frame(self, op: str, timeout: float, fields: dict) -> Tuple[int, bytes]:
        _check_op(op)
        rid = next(self._ids)
        req = {"v": PROTOCOL_VERSION, "op": op, "id": rid,
               "timeout_ms": max(1, int(timeout * 1000))}
        req.update(fields)
        return rid, msgpack.packb(req, use_bin_type=True)

    def _send_locked(self, frame: bytes) -> None:
        if self._closed:
            raise KvtierError("CLOSED", "client closed")
        try:
            self._sock.send(frame)
        except (OSError, zmq.ZMQError) as e:  # a dead daemon: BrokenPipeError, ECONNRESET
            raise KvtierError("CLOSED", f"send: {e}") from e
        self._last_send = time.monotonic()

    # -- batches: calls queued during a scheduler step, sent in one write ----

    def frame(self, op: str, **fields) -> Tuple[int, bytes]:
        """Encodes a call for send_frames; returns (id, frame)."""
        return self._frame(op, self._timeout, fields)

    def call(self, op: str, **fields) -> Tuple[int, dict]:
        """A call for send_calls: (id, its map). Sent in a batch it has the
        daemon's default timeout. noreply=True: no reply; quiet=True: a
        reply only if it fails (read by take_replies)."""
        _check_op(op)
        rid = next(self._ids)
        fields["v"], fields["op"], fields["id"] = PROTOCOL_VERSION, op, rid
        return rid, fields

    def send_calls(self, calls: Sequence[dict], keep: Sequence[int] = ()) -> None:
        """Sends calls (from call()) as batch frames, in one write: the
        daemon serves each as if it came alone, in order (hello.batch).
        The replies of the ids in keep are kept for take_replies()."""
        frames = []
        for at in range(0, len(calls), _BATCH_CALLS):
            frames.append(msgpack.packb({"v": PROTOCOL_VERSION, "op": "batch", "id": next(self._ids),
                                         "calls": calls[at:at + _BATCH_CALLS]}, use_bin_type=True))
        self.send_frames(frames, keep)

    def send_frames(self, frames: Sequence[bytes], keep: Sequence[int] = ()) -> None:
        """Sends encoded calls in one write (unix://: one syscall); the
        replies of the ids in keep are kept for take_replies()."""
        if not frames:
            return
        with self._lock:
            if self._closed:
                raise KvtierError("CLOSED", "client closed")
            try:
                self._sock.send_many(frames)
            except (OSError, zmq.ZMQError) as e:
                raise KvtierError("CLOSED", f"send: {e}") from e
            self._last_send = time.monotonic()
            self._awaited.update(keep)
            self._batched.update(keep)

    def take_replies(self, wait_ms: int = 0) -> List[Tuple[int, dict]]:
        """Every kept reply that has arrived, as (id, reply) — errors as
        replies with "err", unchecked — and the error replies of calls
        nobody awaits (quiet calls: their "err" names the op). Waits up to
        wait_ms for one to come (0: never blocks)."""
        with self._lock:
            if wait_ms > 0 and not self._closed:
                self._read_locked(wait_ms)
            if not self._closed:
                self._drain_locked()
            out = [(rid, r) for rid, r in self._stash.items() if rid in self._batched]
            for rid, _ in out:
                self._awaited.discard(rid)
                self._batched.discard(rid)
                del self._stash[rid]
            if self._orphans:
                out.extend(self._orphans)
                self._orphans.clear()
        return out

    def _drain_locked(self) -> None:
        """Reads every reply that has arrived into the stash, without waiting."""
        try:
            frames = self._sock.drain()
        except (OSError, zmq.ZMQError) as e:  # ECONNRESET from a killed daemon
            raise KvtierError("CLOSED", f"recv: {e}") from e
        unpack, awaited, stash = msgpack.unpackb, self._awaited, self._stash
        for frame in frames:
            reply = unpack(frame, raw=False)
            rid = reply.get("id")
            if rid in awaited:
                stash[rid] = reply
            elif "err" in reply:
                self._orphans.append((rid, reply))

    def _read_locked(self, wait_ms: int) -> bool:
        """Reads at most one reply into the stash; False when none came."""
        try:
            if not self._sock.poll(wait_ms):
                return False
            frame = self._sock.recv()
        except (OSError, zmq.ZMQError) as e:  # ECONNRESET from a killed daemon
            raise KvtierError("CLOSED", f"recv: {e}") from e
        reply = msgpack.unpackb(frame, raw=False)
        rid = reply.get("id")
        if rid in self._awaited:
            self._stash[rid] = reply
        return True  # a reply nobody awaits (fire-and-forget) is dropped

    def send(self, op: str, timeout: Optional[float] = None, keep: bool = True,
             **fields) -> int:
        """Sends a call without waiting; returns its id. With keep, its reply
        is kept for ready()/wait(); without, it is dropped (fire-and-forget:
        errors are not seen, but calls of a connection are processed in the
        order sent, so a later call observes this one's effect)."""
        timeout = self._timeout if timeout is None else timeout
        rid, frame = self._frame(op, timeout, fields)
        with self._lock:
            self._send_locked(frame)
            if keep:
                self._awaited.add(rid)
        return rid

    def ready(self, rid: int):
        """The reply of a send(), or None if it has not arrived. Never blocks."""
        with self._lock:
            while rid not in self._stash and self._read_locked(0):
                pass
            if rid not in self._stash:
                return None
            self._awaited.discard(rid)
            return self._check(self._stash.pop(rid))

    def wait(self, rid: int, timeout: Optional[float] = None, op: str = "call"):
        """The reply of a send(), waiting up to timeout seconds."""
        timeout = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._lock:
            try:
                while rid not in self._stash:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise KvtierError("TIMEOUT", f"{op}: no reply within {timeout}s")
                    self._read_locked(int(left * 1000) + 1)
                return self._check(self._stash.pop(rid))
            finally:
                self._awaited.discard(rid)
                self._stash.pop(rid, None)

    def drain(self) -> None:
        """Reads every reply already here (fire-and-forget replies would
        otherwise wait in the socket until the next awaited call)."""
        with self._lock:
            while not self._closed and self._read_locked(0):
                pass

    def forget(self, rid: int) -> None:
        """Stops awaiting a send()'s reply (it is dropped when it comes)."""
        with self._lock:
            self._awaited.discard(rid)
            self._stash.pop(rid, None)

    @staticmethod
    def _check(reply: dict) -> dict:
        err = reply.get("err")
        if err:
            raise KvtierError(err.get("code", "INTERNAL"), err.get("msg", ""))
        return reply

    def _call(self, op: str, timeout: Optional[float] = None, **fields):
        timeout = self._timeout if timeout is None else timeout
        rid = self.send(op, timeout=timeout, **fields)
        return self.wait(rid, timeout, op)

    def _heartbeat(self):
        period = self.hello.heartbeat_ms / 1000.0
        while not self._stop.wait(period / 2):
            if time.monotonic() - self._last_send >= period:
                try:
                    self._call("ping", timeout=period)
                except KvtierError:
                    pass

    def close(self, bye: bool = True):
        """Say bye (the daemon releases the session at once) and unmap.
        Without bye (the daemon is known gone), close at once."""
        if self._closed:
            return
        if bye:
            try:
                self._call("bye", timeout=2.0)
            except KvtierError:
                pass
        self._stop.set()
        if self._hb is not None:
            self._hb.join()
        with self._lock:
            self._closed = True
            if self._mm is not None:  # None: the hello failed before the pool was mapped
                self.pool.release()
                self._mm.close()
            self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- slots ---------------------------------------------------------

    def slot(self, i: int) -> memoryview:
        """The bytes of slot i, aliasing the shared pool (read-write)."""
        if not 0 <= i < self.hello.slots:
            raise IndexError(f"slot {i} outside the pool of {self.hello.slots}")
        b = self.hello.block_bytes
        return self.pool[i * b:(i + 1) * b]

    def _check_slots(self, slots: List[int], n: int) -> List[int]:
        if len(slots) != n or any(not 0 <= s < self.hello.slots for s in slots):
            raise KvtierError("BAD_REPLY", f"slots {slots[:8]}... do not fit the pool")
        return slots

    def _store_plan(self, r: dict) -> StorePlan:
        to_store = _unkeys(r.get("to_store"))
        return StorePlan(r["job"], to_store, self._check_slots(r["slots"], len(to_store)),
                         _unkeys(r.get("evicted")), r["workers"])

    @staticmethod
    def _events(r: dict) -> List[dict]:
        events = r["events"]
        for e in events:
            e["keys"] = _unkeys(e.get("keys"))
        return events

    # -- the manager API (generated by `go test ./scheduler/wire -run TestGeneratedCalls -update` from the op table; do not edit) --

    def lookup(self, req: Request, keys: Sequence[Key], prefix: bool = True) -> List[int]:
        r = self._call("lookup", req=req.wire(), **self._key_field(keys), prefix=prefix)
        return list(r["status"])

    def prepare_load(self, req: Request, keys: Sequence[Key]) -> LoadJob:
        r = self._call("prepare_load", req=req.wire(), **self._key_field(keys))
        return LoadJob(r["job"], self._check_slots(r["slots"], len(keys)), r["workers"])

    def touch(self, req: Request, keys: Sequence[Key]) -> None:
        self._call("touch", req=req.wire(), **self._key_field(keys))

    def complete_load(self, req: Request, keys: Sequence[Key]) -> None:
        self._call("complete_load", req=req.wire(), **self._key_field(keys))

    def prepare_store(self, req: Request, keys: Sequence[Key]) -> StorePlan:
        r = self._call("prepare_store", req=req.wire(), **self._key_field(keys))
        return self._store_plan(r)

    def complete_store(self, req: Request, keys: Sequence[Key], ok: bool = True) -> None:
        self._call("complete_store", req=req.wire(), **self._key_field(keys), ok=ok)

    def job_done(self, job: int, worker: int = 0, ok: bool = True) -> None:
        self._call("job_done", job=job, worker=worker, ok=ok)

    def request_finished(self, req: Request) -> None:
        self._call("request_finished", req=req.wire())

    def take_events(self) -> List[dict]:
        r = self._call("take_events")
        return self._events(r)

    def has_pending_work(self) -> bool:
        r = self._call("has_pending_work")
        return bool(r["pending"])

    def pause(self, clear_cache: bool = False) -> None:
        self._call("pause", clear=clear_cache)

    def resume(self) -> None:
        self._call("resume")

    def reset_cache(self) -> None:
        self._call("reset_cache")

    def stats(self) -> Dict[str, int]:
        r = self._call("stats")
        return r["stats"]

    # -- end of the generated manager API --

    def ping(self) -> None:
        self._call("ping")

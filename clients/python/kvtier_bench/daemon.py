"""A kvtierd of a bench's own: built from the repository when none is on
PATH, started on an engine socket, stopped when the bench is done."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from contextlib import contextmanager
from typing import Iterator, Tuple

def kvtierd_binary(repo: str) -> str:
    """kvtierd on PATH, else one built from the repository at repo."""
    found = shutil.which("kvtierd")
    if found:
        return found
    out = os.path.join(tempfile.mkdtemp(prefix="kvtier-bench-"), "kvtierd")
    subprocess.run(["go", "build", "-o", out, "./cmd/kvtierd"], cwd=repo, check=True)
    return out


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def kvtierd(binary: str, block_bytes: int, slots: int, *extra: str, transport: str = "ipc") -> Iterator[str]:
    """Starts a kvtierd on an ipc (ZeroMQ) or unix (stream) engine socket;
    yields its engine address; stops it."""
    with kvtierd_process(binary, block_bytes, slots, *extra, transport=transport) as (addr, _):
        yield addr


@contextmanager
def kvtierd_process(binary: str, block_bytes: int, slots: int, *extra: str,
                    transport: str = "ipc") -> Iterator[Tuple[str, subprocess.Popen]]:
    """kvtierd, yielding its engine address and its process (whose CPU time
    a bench reads)."""
    d = tempfile.mkdtemp(prefix="kvtier-bench-")
    sock = os.path.join(d, "engine.sock")
    pool = f"/dev/shm/kvtier-bench-{os.getpid()}.pool"
    proc = subprocess.Popen(
        [binary, "--engine-listen", f"{transport}://{sock}", "--pool-path", pool,
         "--pool-bytes", str(block_bytes * slots), "--block-bytes", str(block_bytes),
         "--metrics-listen", "127.0.0.1:0", "--log-format", "json", *extra],
        stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if json.loads(line).get("message") == "kvtierd listening":
                break
        else:
            raise RuntimeError("kvtierd exited before listening")
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        yield f"{transport}://{sock}", proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(d, ignore_errors=True)

"""Where kvtierd's engine endpoint is when nobody says: the same rule as
the daemon's (Go: ``config.DefaultEngineAddress``), so a kvtierd started
with no flags and an engine given no address meet.

``$KVTIER_ADDRESS`` when set (on both sides); else ``unix:///run/kvtier/engine.sock``
for root; else ``unix://$TMPDIR/kvtier-<uid>/engine.sock`` (``/tmp`` when
``TMPDIR`` is unset, as Go's ``os.TempDir``; the path cleaned as Go's
``filepath.Join`` cleans it)."""

from __future__ import annotations

import os

ENV = "KVTIER_ADDRESS"
ROOT_ADDRESS = "unix:///run/kvtier/engine.sock"


def default_address() -> str:
    """kvtierd's default engine address for this process's user."""
    env = os.environ.get(ENV)
    if env:
        return env
    if os.geteuid() == 0:
        return ROOT_ADDRESS
    tmp = os.environ.get("TMPDIR") or "/tmp"
    # NB: normpath cleans as Go's filepath.Join does on the daemon's side.
    return "unix://" + os.path.normpath(os.path.join(tmp, f"kvtier-{os.geteuid()}", "engine.sock"))

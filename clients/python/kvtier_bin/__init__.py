"""The kvtierd daemon and the kvtier CLI, as the platform wheel that
``scripts/wheel.sh`` builds carries them: two static Go binaries under this
package's ``bin/``, and the console scripts ``kvtierd`` and ``kvtier``, which
``os.execv`` the bundled binary with the same argv, so the process that runs
is the binary itself (its own signals, exit status and pid).

A plain ``pip install ./clients/python`` bundles no binaries and installs no
console scripts; :func:`binary` then returns None, and :func:`main` (or the
scripts of a hand-built wheel) exits 127 with one line saying how to build
the wheel that has them."""

from __future__ import annotations

import os
import sys
from typing import List, Optional

__all__ = ["NAMES", "binary", "kvtier", "kvtierd", "main"]

NAMES = ("kvtierd", "kvtier")

_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")

# Exit status when the binary is missing: the shell's "command not found".
_NOT_BUNDLED = 127


def binary(name: str) -> Optional[str]:
    """The bundled binary called name ("kvtierd" or "kvtier"); None when this
    install carries none."""
    if name not in NAMES:
        raise ValueError(f"unknown kvtier binary {name!r} (one of {', '.join(NAMES)})")
    path = os.path.join(_BIN, name)
    return path if os.access(path, os.X_OK) else None


def _exec(name: str, argv: List[str]) -> int:
    path = binary(name)
    if path is None:
        sys.stderr.write(f"{name}: the kvtier binaries are not bundled in this install of the kvtier package "
                         "(a plain `pip install ./clients/python` has none); build the wheel that carries them "
                         "with `bash scripts/wheel.sh` and pip install the .whl it prints\n")
        return _NOT_BUNDLED
    # NB: execv replaces this interpreter, so the binary gets the signals
    # (SIGTERM to kvtierd's pid is kvtierd's) and the exit status is its own.
    os.execv(path, [argv[0] if argv else name, *argv[1:]])
    raise AssertionError("unreachable: execv returned")


def kvtierd() -> int:
    """Console script ``kvtierd``: execs the bundled daemon."""
    return _exec("kvtierd", sys.argv)


def kvtier() -> int:
    """Console script ``kvtier``: execs the bundled CLI."""
    return _exec("kvtier", sys.argv)


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m kvtier_bin kvtierd|kvtier [args...]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in NAMES:
        sys.stderr.write(f"usage: python -m kvtier_bin {{{'|'.join(NAMES)}}} [args...]\n")
        return 2
    return _exec(args[0], args)

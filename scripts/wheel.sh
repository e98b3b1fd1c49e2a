#!/usr/bin/env bash
# Builds the one wheel a GPU node needs: kvtier's Python packages
# (clients/python) plus the kvtierd daemon and the kvtier CLI as static
# binaries, with the console scripts kvtierd and kvtier. Then, on a node
# with no Go and no clone:
#
#	pip install kvtier-<version>-py3-none-linux_<arch>.whl
#	kvtierd --engine-listen unix:///run/kvtier/engine.sock ...
#
# Steps: reads the version from clients/python/pyproject.toml; builds
# ./cmd/kvtierd and ./cmd/kvtier with
#	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X …/internal/version.Release=v<version>"
# into a temp dir; copies clients/python (without its build/ and egg-info)
# into that temp dir and runs `pip wheel --no-deps` there with
# KVTIER_WHEEL_BINARIES naming the binaries (clients/python/setup.py bundles
# them and tags the wheel py3-none-linux_<arch> only when it is set). The
# source tree never holds a staged binary, so a later plain
# `pip install ./clients/python` stays pure (no binaries, no console scripts).
#
# Output: dist/kvtier-<version>-py3-none-linux_<arch>.whl at the repo root;
# its path is the last line of stdout, everything else goes to stderr.
# Needs Go ≥ 1.26, python3 with pip, and the package index (pip fetches
# setuptools into its isolated build environment).
#
# Usage: WHEEL=$(bash scripts/wheel.sh | tail -n1)
# Env:   GOOS/GOARCH  cross-build for linux/amd64 or linux/arm64 (default: this machine)
#        PYTHON       the python that runs pip (default python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
cd "$ROOT"

log() { printf '[wheel] %s\n' "$*" >&2; }
die() {
	printf '[wheel] FAILED: %s\n' "$*" >&2
	exit 1
}

# The [project] table's version = "…" line.
VERSION="$(awk '/^\[/ { inproj = ($0 == "[project]") } inproj && /^version *=/ { gsub(/.*= *"|".*/, ""); print; exit }' \
	clients/python/pyproject.toml)"
[ -n "$VERSION" ] || die "no version in clients/python/pyproject.toml's [project]"

GOOS_="$(go env GOOS)"
GOARCH_="$(go env GOARCH)"
case "$GOOS_/$GOARCH_" in
linux/amd64) PLAT=linux_x86_64 ;;
linux/arm64) PLAT=linux_aarch64 ;;
*) die "GOOS/GOARCH $GOOS_/$GOARCH_: the wheel is built for linux/amd64 or linux/arm64" ;;
esac

WORK="$(mktemp -d "${TMPDIR:-/tmp}/kvtier-wheel.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

LDFLAGS="-s -w -X github.com/kvtier/kvtier/internal/version.Release=v$VERSION"
for cmd in kvtierd kvtier; do
	log "go build ./cmd/$cmd ($GOOS_/$GOARCH_, static, v$VERSION)"
	CGO_ENABLED=0 go build -trimpath -ldflags "$LDFLAGS" -o "$WORK/bin/$cmd" "./cmd/$cmd" >&2 ||
		die "go build ./cmd/$cmd"
done

log "pip wheel clients/python with the binaries ($PLAT)"
mkdir -p "$WORK/src" "$WORK/out"
# NB: a copy without build/: setuptools packs whatever its build/lib holds,
# so building in the source tree could leave binaries there for the next
# plain install, and a stale build/lib could end up in this wheel.
tar -C clients/python --exclude=./build --exclude='*.egg-info' --exclude=__pycache__ \
	--exclude=.mypy_cache --exclude=.ruff_cache --exclude=.pytest_cache -cf - . | tar -C "$WORK/src" -xf -
KVTIER_WHEEL_BINARIES="$WORK/bin" KVTIER_WHEEL_PLAT="$PLAT" \
	"$PY" -m pip wheel --quiet --no-deps --wheel-dir "$WORK/out" "$WORK/src" >&2 ||
	die "pip wheel clients/python"

shopt -s nullglob
built=("$WORK"/out/kvtier-*.whl)
[ "${#built[@]}" -eq 1 ] || die "expected one wheel, pip wheel made: ${built[*]:-none}"
name="$(basename "${built[0]}")"
[ "$name" = "kvtier-$VERSION-py3-none-$PLAT.whl" ] || die "wheel $name is not kvtier-$VERSION-py3-none-$PLAT.whl"

# What makes it this wheel: both binaries, executable, and their scripts.
"$PY" - "${built[0]}" <<'PYEOF' || die "wheel contents"
import sys, zipfile
whl = zipfile.ZipFile(sys.argv[1])
names = set(whl.namelist())
for b in ("kvtierd", "kvtier"):
    info = whl.getinfo(f"kvtier_bin/bin/{b}")
    assert (info.external_attr >> 16) & 0o111, f"kvtier_bin/bin/{b} is not executable in the wheel"
ep = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
text = whl.read(ep).decode()
for b in ("kvtierd", "kvtier"):
    assert f"{b} = kvtier_bin:{b}" in text, f"no console script {b}: {text!r}"
PYEOF

mkdir -p dist
cp "${built[0]}" "dist/$name"
log "built dist/$name ($(du -h "dist/$name" | cut -f1))"
echo "$ROOT/dist/$name"

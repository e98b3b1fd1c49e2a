#!/usr/bin/env bash
# Runs rdma/nixl's tests against the real NIXL library.
#
# Installs NIXL's Python wheel (nixl-cu12 by default; only its shared
# libraries are used, no Python import, no CUDA needed for DRAM transfers)
# with pip --no-deps into a cache directory, exports KVTIER_NIXL_LIB and
# NIXL_PLUGIN_DIR, and runs
#
#	go test -tags nixl -race -count=1 ./rdma/nixl/...
#
# over UCX's TCP transport (UCX_TLS=tcp unless already set). When the wheel
# cannot be downloaded or its library cannot be loaded here, it prints
# exactly why and exits 0 without running the tests (they would skip).
# A test failure exits non-zero.
#
# Environment:
#	KVTIER_NIXL_PACKAGE  wheel to install      (default nixl-cu12)
#	KVTIER_NIXL_VERSION  its version           (default 1.5.1)
#	KVTIER_NIXL_CACHE    where to keep it      (default ~/.cache/kvtier/nixl)
#	KVTIER_NIXL_LIB      use this libnixl_capi.so instead of installing
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

pkg="${KVTIER_NIXL_PACKAGE:-nixl-cu12}"
ver="${KVTIER_NIXL_VERSION:-1.5.1}"
cache="${KVTIER_NIXL_CACHE:-${HOME:-/root}/.cache/kvtier/nixl}"
dir="$cache/$pkg-$ver"
py="${PYTHON:-python3}"

skip() {
	echo "nixl: SKIPPED, NIXL tests not run: $*"
	exit 0
}

install_wheel() {
	[ -f "$dir/.complete" ] && return 0
	command -v "$py" >/dev/null 2>&1 || skip "$py not found (needed for pip)"
	local tmp log
	tmp="$(mktemp -d)"
	log="$tmp/pip.log"
	# NB: the wheel is tagged for one CPython ABI, but the C libraries in it
	# do not use Python: ask for the cp311 manylinux build whatever the local
	# interpreter is.
	if ! "$py" -m pip download --quiet --no-deps --only-binary=:all: \
		--python-version 3.11 --implementation cp --abi cp311 \
		--platform manylinux_2_28_x86_64 -d "$tmp" "$pkg==$ver" >"$log" 2>&1; then
		echo "nixl: pip download $pkg==$ver failed:"
		tail -n 5 "$log" | sed 's/^/    /'
		rm -rf "$tmp"
		skip "the package registry did not provide $pkg==$ver"
	fi
	local whl
	whl="$(ls "$tmp"/*.whl 2>/dev/null | head -n 1)"
	[ -n "$whl" ] || { rm -rf "$tmp"; skip "pip reported success but left no wheel"; }
	rm -rf "$dir"
	mkdir -p "$dir"
	# Only the shared libraries, the plugins and the version record: the
	# wheel's PyTorch extensions are a hundred MiB we do not use.
	"$py" - "$whl" "$dir" <<'PY'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        top = n.split("/", 1)[0]
        if top.endswith((".mesonpy.libs", ".libs", ".dist-info")):
            z.extract(n, dest)
PY
	rm -rf "$tmp"
	touch "$dir/.complete"
}

command -v "$(go env CC)" >/dev/null 2>&1 || skip "no C compiler ($(go env CC)): the nixl build needs cgo"

if [ -z "${KVTIER_NIXL_LIB:-}" ]; then
	install_wheel
	lib="$(find "$dir" -name libnixl_capi.so -path '*mesonpy.libs*' | head -n 1)"
	[ -n "$lib" ] || skip "$pkg $ver ships no libnixl_capi.so under $dir"
	export KVTIER_NIXL_LIB="$lib"
	export NIXL_PLUGIN_DIR="${NIXL_PLUGIN_DIR:-$(dirname "$lib")/plugins}"
fi
export UCX_TLS="${UCX_TLS:-tcp}"

# Loading the library is the test's first step too; doing it here gives the
# loader's exact error when it fails.
if command -v "$py" >/dev/null 2>&1; then
	if ! err="$("$py" -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$KVTIER_NIXL_LIB" 2>&1)"; then
		skip "cannot load $KVTIER_NIXL_LIB: $(echo "$err" | tail -n 1)"
	fi
fi

echo "nixl: KVTIER_NIXL_LIB=$KVTIER_NIXL_LIB"
echo "nixl: NIXL_PLUGIN_DIR=${NIXL_PLUGIN_DIR:-}"
echo "nixl: UCX_TLS=$UCX_TLS"
# The probe says which library runs, or why the tests would skip.
go test -tags nixl -count=1 -run '^TestProbe$' -v ./rdma/nixl/ | grep -E 'NIXL|--- |^ok|^FAIL' || true
go test -tags nixl -race -count=1 -timeout 10m ./rdma/nixl/...
# Two kvtierd processes (built with -tags nixl) fetching from each other
# through NIXL, every byte verified.
go test -tags nixl -race -count=1 -timeout 10m -run Nixl ./tests/

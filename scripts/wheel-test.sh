#!/usr/bin/env bash
# Checks the wheel of scripts/wheel.sh the way a GPU node uses it: built
# here, pip-installed into a fresh venv, then run with a PATH that holds
# only the venv's bin and /usr/bin:/bin (no Go toolchain, no clone needed):
#
#   1. kvtierd --version and kvtier --version say v<version>; the bundled
#      binaries are static;
#   2. kvtier size --model testdata/models/llama-3.1-8b.json;
#   3. kvtierd --pool-bytes 64MiB --block-bytes 64KiB --engine-listen
#      unix://<tmp>/e.sock --metrics-listen 127.0.0.1:0 in the background,
#      awaited by its "kvtierd listening" log line (polled, 60 s deadline);
#      its pid runs the bundled binary itself (the console script execs it);
#   4. the venv's python imports kvtier_client and kvtier_bin, finds
#      kvtier_vllm, kvtier_sglang and kvtier_bench in the venv (importing
#      them needs vLLM, SGLang, numpy), and through kvtier_client: hello,
#      one block stored, a lookup of it and of an absent one (HIT, MISS);
#   5. SIGTERM: kvtierd exits 0 within 30 s and removes its pool;
#   6. a plain `pip install --no-deps ./clients/python` into a second venv,
#      still without Go: installs, bundles no binary and no console script,
#      and `python -m kvtier_bin kvtierd` says in one line how to get them.
#
# Any failure exits non-zero naming the step. The venvs and temp dirs are
# removed on exit. Needs Go and python3 (to build) and the package index
# (pyzmq and msgpack for the venv).
#
# Usage: bash scripts/wheel-test.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
cd "$ROOT"

STEP="start"
DPID=""
TMP="$(mktemp -d "${TMPDIR:-/tmp}/kvtier-wheel-test.XXXXXX")"

step() {
	STEP="$*"
	printf '[wheel-test] %s\n' "$*" >&2
}
fail() {
	printf '[wheel-test] %s\n' "$*" >&2
	exit 1
}
finish() {
	local rc=$?
	if [ -n "$DPID" ] && kill -0 "$DPID" 2>/dev/null; then
		# A failed step left kvtierd running: SIGTERM (it removes its pool),
		# SIGKILL after 10 s and remove its default pool by hand.
		kill -TERM "$DPID" 2>/dev/null || true
		local until=$((SECONDS + 10))
		while kill -0 "$DPID" 2>/dev/null && [ "$SECONDS" -lt "$until" ]; do sleep 0.05; done
		if kill -0 "$DPID" 2>/dev/null; then
			kill -KILL "$DPID" 2>/dev/null || true
			rm -f "/dev/shm/kvtier-$DPID.pool" "/dev/shm/kvtier-$DPID.pool.index"
		fi
	fi
	if [ "$rc" -ne 0 ]; then
		printf '[wheel-test] FAILED at step: %s (exit %s)\n' "$STEP" "$rc" >&2
		if [ -s "$TMP/kvtierd.log" ]; then
			printf '[wheel-test] kvtierd log (tail):\n' >&2
			tail -n 20 "$TMP/kvtierd.log" >&2
		fi
	fi
	rm -rf "$TMP"
	exit "$rc"
}
trap finish EXIT

step "build the wheel (scripts/wheel.sh)"
WHEEL="$(bash scripts/wheel.sh | tail -n1)"
[ -f "$WHEEL" ] || fail "scripts/wheel.sh printed no wheel path (got: $WHEEL)"
VERSION="$(basename "$WHEEL" | cut -d- -f2)"

step "fresh venv, pip install $(basename "$WHEEL") (pyzmq, msgpack from the package index)"
"$PY" -m venv "$TMP/venv"
VPY="$TMP/venv/bin/python"
"$VPY" -m pip install --quiet --disable-pip-version-check "$WHEEL" >&2

# From here on: what a GPU node without Go has.
export PATH="$TMP/venv/bin:/usr/bin:/bin"
unset GOROOT GOPATH GOBIN GOFLAGS
hash -r

step "no Go on PATH ($PATH)"
if command -v go >/dev/null 2>&1; then
	fail "go is on PATH: $(command -v go)"
fi
for b in kvtierd kvtier; do
	[ "$(command -v "$b")" = "$TMP/venv/bin/$b" ] || fail "$b on PATH is '$(command -v "$b" || true)', not the venv's"
done

step "kvtierd --version"
out="$(kvtierd --version)"
printf '  %s\n' "$out" >&2
case "$out" in *"v$VERSION"*) ;; *) fail "kvtierd --version does not say v$VERSION" ;; esac

step "kvtier --version"
out="$(kvtier --version)"
printf '  %s\n' "$out" >&2
case "$out" in *"v$VERSION"*) ;; *) fail "kvtier --version does not say v$VERSION" ;; esac

step "the bundled binaries are static"
BIN_DIR="$("$VPY" -c 'import os, kvtier_bin; print(os.path.dirname(kvtier_bin.binary("kvtierd")))')"
for b in kvtierd kvtier; do
	if ldd "$BIN_DIR/$b" >/dev/null 2>&1; then
		fail "$BIN_DIR/$b is dynamically linked: $(ldd "$BIN_DIR/$b" 2>&1 | head -n3)"
	fi
done

step "kvtier size --model testdata/models/llama-3.1-8b.json"
kvtier size --model testdata/models/llama-3.1-8b.json >&2

step "start kvtierd (unix://$TMP/e.sock, 64MiB pool of 64KiB blocks)"
SOCK="$TMP/e.sock"
kvtierd --pool-bytes 64MiB --block-bytes 64KiB --engine-listen "unix://$SOCK" \
	--metrics-listen 127.0.0.1:0 --log-format json >"$TMP/kvtierd.log" 2>&1 &
DPID=$!

step "wait for kvtierd to listen (its 'kvtierd listening' log line, 60 s deadline)"
deadline=$((SECONDS + 60))
until grep -q '"message":"kvtierd listening"' "$TMP/kvtierd.log" && [ -S "$SOCK" ]; do
	kill -0 "$DPID" 2>/dev/null || fail "kvtierd exited before listening"
	[ "$SECONDS" -lt "$deadline" ] || fail "kvtierd not listening after 60 s"
	sleep 0.05 # NB: a poll interval; the log line is what is awaited
done

step "kvtierd's pid runs the bundled binary (the console script execs it)"
exe="$(readlink "/proc/$DPID/exe")"
[ "$exe" = "$(readlink -f "$BIN_DIR/kvtierd")" ] || fail "pid $DPID runs $exe, not $BIN_DIR/kvtierd"

step "python: imports from the venv; kvtier_client hello, store, lookup"
POOL="$("$VPY" - "unix://$SOCK" "$TMP/venv" <<'PYEOF'
import importlib.util
import os
import sys

addr, venv = sys.argv[1], os.path.realpath(sys.argv[2])

import kvtier_bin  # noqa: E402
import kvtier_client  # noqa: E402
from kvtier_client import HIT, MISS, Client, Request  # noqa: E402

for name in ("kvtier_client", "kvtier_bin", "kvtier_vllm", "kvtier_sglang", "kvtier_bench"):
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin, f"{name} is not installed"
    assert os.path.realpath(spec.origin).startswith(venv + os.sep), f"{name} comes from {spec.origin}"
for b in kvtier_bin.NAMES:
    assert kvtier_bin.binary(b), f"no bundled {b}"

BLOCK = 64 << 10
NS = "0123456789abcdef"
stored, absent = (NS, (1).to_bytes(32, "big"), 0), (NS, (2).to_bytes(32, "big"), 0)
with Client(addr, name="wheel-test") as c:
    assert c.hello.protocol == 1, c.hello
    assert c.hello.block_bytes == BLOCK, c.hello
    assert c.hello.slots == (64 << 20) // BLOCK, c.hello
    w = Request("w", tokens=list(range(16)), block_size=16)
    plan = c.prepare_store(w, [stored])
    assert len(plan.slots) == 1, plan
    c.slot(plan.slots[0])[:] = b"\x5a" * BLOCK
    c.job_done(plan.job, 0, True)
    c.request_finished(w)
    r = Request("r")
    got = c.lookup(r, [stored, absent])
    assert got == [HIT, MISS], got
    c.request_finished(r)
    print(c.hello.pool_path)
PYEOF
)"
[ -n "$POOL" ] || fail "the python check printed no pool path"

step "SIGTERM kvtierd: exit status 0 within 30 s, pool removed"
kill -TERM "$DPID"
deadline=$((SECONDS + 30))
while kill -0 "$DPID" 2>/dev/null; do
	[ "$SECONDS" -lt "$deadline" ] || fail "kvtierd still running 30 s after SIGTERM"
	sleep 0.05 # NB: a poll interval; bash's wait has no deadline
done
rc=0
wait "$DPID" || rc=$?
DPID=""
[ "$rc" -eq 0 ] || fail "kvtierd exited $rc after SIGTERM"
[ ! -e "$POOL" ] || fail "kvtierd left its pool $POOL"

step "plain pip install --no-deps ./clients/python (second venv, no Go): pure, no binaries"
"$PY" -m venv "$TMP/plain"
"$TMP/plain/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps ./clients/python >&2
for b in kvtierd kvtier; do
	[ ! -e "$TMP/plain/bin/$b" ] || fail "the plain install has a $b console script"
done
"$TMP/plain/bin/python" - <<'PYEOF'
import kvtier_bin

assert kvtier_bin.binary("kvtierd") is None, "the plain install bundles a kvtierd"
assert kvtier_bin.binary("kvtier") is None, "the plain install bundles a kvtier"
PYEOF
rc=0
msg="$("$TMP/plain/bin/python" -m kvtier_bin kvtierd --version 2>&1)" || rc=$?
[ "$rc" -eq 127 ] || fail "python -m kvtier_bin kvtierd exited $rc without binaries (want 127)"
[ "$(printf '%s\n' "$msg" | wc -l)" -eq 1 ] || fail "not one line: $msg"
case "$msg" in *"scripts/wheel.sh"*) ;; *) fail "the message does not say how to get the binaries: $msg" ;; esac
printf '  %s\n' "$msg" >&2

STEP="done"
printf '[wheel-test] ok: %s\n' "$(basename "$WHEEL")" >&2

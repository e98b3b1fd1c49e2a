#!/usr/bin/env bash
# The README's test command. Installs what the tests need and is missing
# (versitygw, the S3 server the object tier is tested against; the Python
# client's packages), then runs: go vet, go test -race, and the Python
# client's pytest suite (which starts a real kvtierd). Exits non-zero on
# any failure. Needs Go ≥ 1.26 and python3 on PATH (.ci/run installs them
# on a bare Debian machine).
set -euo pipefail

section() { printf '\n===== %s =====\n' "$*"; }

cd "$(dirname "${BASH_SOURCE[0]}")/.."

section "versitygw (S3 server for the obj tier's tests)"
# NB: about 2-4 minutes to build cold; the binary is reused when present.
export PATH="$(go env GOPATH)/bin:$PATH"
if ! command -v versitygw >/dev/null 2>&1; then
	go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
fi
command -v versitygw

section "python packages for the Python client's tests"
PY=python3
if ! "$PY" -c 'import zmq, msgpack, pytest' >/dev/null 2>&1; then
	"$PY" -m pip install --quiet pyzmq msgpack pytest ||
		"$PY" -m pip install --quiet --break-system-packages pyzmq msgpack pytest
fi

section "go vet ./... && go test -race -count=1 -timeout 20m ./..."
# NB: set -e does not fire for a failure on the left of &&, so test it.
if ! { go vet ./... && go test -race -count=1 -timeout 20m ./...; }; then
	echo "FAILED: go vet or go test" >&2
	exit 1
fi

section "NIXL data plane (scripts/nixl.sh: installs the wheel if offered, else says why it skips)"
if ! bash scripts/nixl.sh; then
	echo "FAILED: nixl tests" >&2
	exit 1
fi

section "python3 -m pytest clients/python -q"
if ! "$PY" -m pytest clients/python -q; then
	echo "FAILED: python client tests" >&2
	exit 1
fi

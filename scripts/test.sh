#!/usr/bin/env bash
# The README's test command. Installs what the tests need and is missing
# (versitygw, the S3 server the object tier is tested against; etcd, the
# server peer discovery is tested against; the Python client's packages;
# vLLM's CPU build in a venv; promtool), then checks the
# alert rules with promtool and runs: go vet,
# go test -race, the Python client's pytest suite (which starts a real
# kvtierd), the vLLM connector's suite (real vLLM engines + kvtierd) and the
# SGLang backend's suite (SGLang's own classes + kvtierd). Exits non-zero on
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

section "staticcheck (pinned)"
STATICCHECK_VERSION=v0.8.2
if ! staticcheck -version 2>/dev/null | grep -q "${STATICCHECK_VERSION#v}"; then
	go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
fi
command -v staticcheck

section "alert rules (promtool from Debian's prometheus package)"
if ! command -v promtool >/dev/null 2>&1; then
	# NB: the package's service is not started (no init in CI containers).
	SUDO=""
	[ "$(id -u)" -eq 0 ] || SUDO="sudo"
	export DEBIAN_FRONTEND=noninteractive
	$SUDO apt-get update -qq
	$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
promtool check rules deploy/prometheus/kvtier.rules.yml
(cd deploy/prometheus && promtool test rules kvtier.rules.test.yml)

section "Helm chart (scripts/helm-check.sh: helm lint, helm template decoded strictly, the golden render)"
# NB: the first run builds the pinned helm from source (2-3 minutes).
if ! bash scripts/helm-check.sh; then
	echo "FAILED: the Helm chart's checks" >&2
	exit 1
fi

section "etcd (Debian's etcd-server: the peer discovery tests run a real one)"
if ! command -v etcd >/dev/null 2>&1 && [ ! -x /usr/bin/etcd ]; then
	# NB: the package's service is not started (no init in CI containers);
	# the tests start their own etcd on loopback (internal/testutil/testetcd).
	SUDO=""
	[ "$(id -u)" -eq 0 ] || SUDO="sudo"
	export DEBIAN_FRONTEND=noninteractive
	$SUDO apt-get update -qq
	$SUDO apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
fi
"$(command -v etcd || echo /usr/bin/etcd)" --version | sed -n 1p

section "python packages for the Python client's tests"
PY=python3
if ! "$PY" -c 'import zmq, msgpack, pytest' >/dev/null 2>&1; then
	"$PY" -m pip install --quiet pyzmq msgpack pytest ||
		"$PY" -m pip install --quiet --break-system-packages pyzmq msgpack pytest
fi

section "go vet ./... && staticcheck ./... && go test -race -count=1 -timeout 20m ./..."
# NB: set -e does not fire for a failure on the left of &&, so test it.
if ! { go vet ./... && staticcheck ./... && go test -race -count=1 -timeout 20m ./...; }; then
	echo "FAILED: go vet, staticcheck or go test" >&2
	exit 1
fi

section "NIXL data plane (scripts/nixl.sh: installs the wheel if offered, else says why it skips)"
if ! bash scripts/nixl.sh; then
	echo "FAILED: nixl tests" >&2
	exit 1
fi

section "Python lint and types (ruff check, mypy on the runtime modules: clients/python/pyproject.toml)"
if ! "$PY" -c 'import ruff, mypy' >/dev/null 2>&1; then
	"$PY" -m pip install --quiet ruff==0.8.0 mypy==2.4.1 ||
		"$PY" -m pip install --quiet --break-system-packages ruff==0.8.0 mypy==2.4.1
fi
if ! { (cd clients/python && "$PY" -m ruff check . && "$PY" -m mypy); }; then
	echo "FAILED: ruff or mypy on clients/python" >&2
	exit 1
fi

section "python3 -m pytest clients/python/tests -q"
if ! "$PY" -m pytest clients/python/tests -q; then
	echo "FAILED: python client tests" >&2
	exit 1
fi

section "vLLM connector (kvtier_vllm) against real vLLM engines (scripts/vllm-env.sh builds the venv once)"
# NB: the first run downloads vLLM's CPU build and torch (~3 GB) into
# ~/.cache/kvtier; later runs reuse it and reinstall only kvtier's packages.
VENV="$(bash scripts/vllm-env.sh)"
if ! "$VENV/bin/python" -m pytest clients/python/tests_vllm -q; then
	echo "FAILED: vLLM connector tests" >&2
	exit 1
fi

section "vLLM connector's manager against vLLM 0.33 (its newest API; scheduler side only, no engine)"
VENV33="$(bash scripts/vllm-env.sh 0.33)"
if ! VLLM_TARGET_DEVICE=cpu "$VENV33/bin/python" -m pytest \
	clients/python/tests_vllm/test_manager.py clients/python/tests_vllm/test_layout.py \
	clients/python/tests_vllm/test_events.py clients/python/tests_vllm/test_worker.py -q; then
	echo "FAILED: vLLM 0.33 manager tests" >&2
	exit 1
fi

section "SGLang HiCache backend (kvtier_sglang) against SGLang's own classes (scripts/sglang-env.sh builds the venv once)"
# NB: the first run downloads SGLang 0.5.23 (without its CUDA kernels) and
# torch (~3 GB) into ~/.cache/kvtier; later runs reuse it and reinstall only
# kvtier's packages. The suite itself takes ~20 s (a real kvtierd per test).
VENV_SGL="$(bash scripts/sglang-env.sh)"
if ! "$VENV_SGL/bin/python" -m pytest clients/python/tests_sglang -q -W ignore::UserWarning; then
	echo "FAILED: SGLang backend tests" >&2
	exit 1
fi

section "the wheel (scripts/wheel-test.sh: scripts/wheel.sh's wheel in a fresh venv runs kvtierd, kvtier and the client with no Go on PATH)"
if ! bash scripts/wheel-test.sh; then
	echo "FAILED: wheel tests" >&2
	exit 1
fi

section "the README's three commands from the wheel (scripts/wheel-venv.sh: kvtierd, kvtier and kvtier_vllm from the wheel, vLLM from its venv, no Go on PATH)"
WHEEL="$(ls -t dist/kvtier-*.whl | head -n1)"
WHEEL_VENV="$(KVTIER_WHEEL="$WHEEL" bash scripts/wheel-venv.sh "$VENV" | tail -n1)"
if ! KVTIER_WHEEL_VENV="$WHEEL_VENV" "$VENV/bin/python" -m pytest clients/python/tests_vllm/test_serve.py -q -k from_the_wheel; then
	echo "FAILED: the README's three commands from the wheel" >&2
	rm -rf "$WHEEL_VENV"
	exit 1
fi
rm -rf "$WHEEL_VENV"

#!/usr/bin/env bash
# The Helm chart's checks (deploy/helm/kvtier; deploy/README.md, Helm chart):
# installs the pinned helm if it is not already in the cache at that version,
# then runs the check module's tests (deploy/helm/check, its own Go module, so
# kvtier's module takes no Kubernetes dependency): helm lint, helm template
# with the default and the example values decoded strictly into the pinned
# Kubernetes types, the golden render, kvtierd accepting each render, the
# chart's copies of the alert rules and the dashboard.
#
# NB: the first run builds helm from source (go install; about 2-3 minutes on
# 2 cores, plus its modules' download); later runs reuse the binary and take
# seconds.
#
# Usage: bash scripts/helm-check.sh [go test flags, e.g. -v or -run X -update]
# Env:   KVTIER_HELM_CACHE  where helm is kept: its bin/helm (default ~/.cache/kvtier)
# Needs Go ≥ 1.26 and the Go module proxy (first run).
set -euo pipefail

HELM_VERSION=v4.3.2

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${KVTIER_HELM_CACHE:-$HOME/.cache/kvtier}"
HELM="$CACHE/bin/helm"

# The module version a Go-built helm was built from ("" if none there).
helm_version() {
	[ -x "$HELM" ] || return 0
	go version -m "$HELM" 2>/dev/null | awk '$1 == "mod" && $2 == "helm.sh/helm/v4" { print $3 }'
}

if [ "$(helm_version)" != "$HELM_VERSION" ]; then
	echo "[helm-check] installing helm $HELM_VERSION into $CACHE/bin (built from source, once)" >&2
	mkdir -p "$CACHE/bin"
	log="$(mktemp)"
	trap 'rm -f "$log"' EXIT
	# Outside any module, so go.mod's settings do not apply; the -X gives
	# `helm version` the patch release (a plain go install says v4.3).
	if ! (cd / && GOBIN="$CACHE/bin" GOFLAGS=-mod=mod go install \
		-ldflags "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
		"helm.sh/helm/v4/cmd/helm@$HELM_VERSION") >"$log" 2>&1; then
		cat "$log" >&2
		echo "[helm-check] FAILED: go install helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
		exit 1
	fi
	if [ "$(helm_version)" != "$HELM_VERSION" ]; then
		echo "[helm-check] FAILED: $HELM is not helm $HELM_VERSION after installing it" >&2
		exit 1
	fi
fi

cd "$ROOT/deploy/helm/check"
HELM="$HELM" go test -count=1 "$@" ./...

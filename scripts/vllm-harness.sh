#!/usr/bin/env bash
# vLLM's own offloading-connector harness against kvtier's spec.
#
# Runs vLLM 0.33's tests/v1/kv_connector/unit/offloading_connector/ (its
# RequestRunner: a real vLLM Scheduler and OffloadingConnector, scheduler
# and worker side), unmodified, with every RequestRunner loading
# `spec_name: KvtierOffloadingSpec, spec_module_path: kvtier_vllm` against a
# kvtierd built from this repository; plus kvtier's own scenarios on that
# RequestRunner. The seam, what is adapted and every test that cannot apply
# (with its reason) are in clients/python/tests_vllm/test_vllm_harness.py
# (NOT_APPLICABLE). Prints the pass/fail list and the deselected tests with
# their reasons; exits non-zero on any failure.
#
# vLLM's wheel has no tests/: they come from the vLLM 0.33.0 sdist on the
# package index, fetched once (~47 MB, sha256 checked against the index)
# into ~/.cache/kvtier/vllm-0.33.0-tests/ (only the test files the harness
# imports are kept). `pip download --no-binary :all: vllm==0.33.0` cannot
# fetch it here: pip builds the sdist's metadata, which needs torch==2.14.0,
# not on the index; so the sdist is fetched by the index's own file list.
#
# vLLM's test config names the model facebook/opt-125m and reads its
# config.json from the Hugging Face hub; there is no hub here, so the
# harness runs offline (HF_HUB_OFFLINE=1) over a cached config.json of
# that model (architecture only: no weights, no tokenizer; the tests are
# scheduler-side).
#
# Usage: bash scripts/vllm-harness.sh [pytest args...]
# Env:   KVTIER_VLLM_TESTS  where the test tree is cached
#                           (default ~/.cache/kvtier/vllm-0.33.0-tests)
#        KVTIER_HARNESS_STEP_TIME=0  no settle after each scheduler step (see
#                           test_vllm_harness.py)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VLLM_VERSION=0.33.0
SDIST_SHA256=f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112
TREE="${KVTIER_VLLM_TESTS:-$HOME/.cache/kvtier/vllm-$VLLM_VERSION-tests}"
HARNESS=tests/v1/kv_connector/unit/offloading_connector

log() { printf '[vllm-harness] %s\n' "$*" >&2; }

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi

VENV33="$(bash scripts/vllm-env.sh 0.33)"
PY="$VENV33/bin/python"

# -- vLLM's test tree (once) -----------------------------------------------------
if [ ! -f "$TREE/.sdist-sha256" ] || [ "$(cat "$TREE/.sdist-sha256")" != "$SDIST_SHA256" ]; then
	log "fetching vllm-$VLLM_VERSION.tar.gz from the package index (its tests/)"
	rm -rf "$TREE"
	mkdir -p "$TREE"
	"$PY" - "$TREE" "$VLLM_VERSION" "$SDIST_SHA256" <<'PYEOF'
import hashlib, io, json, os, sys, tarfile, urllib.parse, urllib.request
from pip._internal.configuration import Configuration

tree, version, want = sys.argv[1:4]
index = os.environ.get("PIP_INDEX_URL")
if not index:
    conf = Configuration(isolated=False)
    conf.load()
    index = dict(conf.items()).get("global.index-url")
if not index:
    from pip._internal.models.index import PyPI  # pip's own default index

    index = PyPI.simple_url
page = urllib.parse.urljoin(index.rstrip("/") + "/", "vllm/")
req = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
with urllib.request.urlopen(req, timeout=120) as r:
    files = json.load(r)["files"]
name = f"vllm-{version}.tar.gz"
f = next(f for f in files if f["filename"] == name)
url = urllib.parse.urljoin(page, f["url"])
if f.get("hashes", {}).get("sha256") not in (None, want):
    sys.exit(f"the index's sha256 of {name} is not the pinned one")
with urllib.request.urlopen(url, timeout=600) as r:
    data = r.read()
if hashlib.sha256(data).hexdigest() != want:
    sys.exit(f"{name}: sha256 mismatch")
keep = ("tests/__init__.py", "tests/v1/__init__.py", "tests/v1/kv_connector/__init__.py",
        "tests/v1/kv_connector/unit/__init__.py", "tests/v1/kv_connector/unit/conftest.py",
        "tests/v1/kv_connector/unit/utils.py")
harness = "tests/v1/kv_connector/unit/offloading_connector/"
n = 0
with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    for m in tar.getmembers():
        rel = m.name.split("/", 1)[1] if "/" in m.name else ""
        if m.isfile() and (rel in keep or rel.startswith(harness)):
            m.name = rel
            tar.extract(m, tree)
            n += 1
if not os.path.isdir(os.path.join(tree, harness)):
    sys.exit(f"{name} has no {harness}")
print(f"[vllm-harness] {n} files of {name}'s tests/ in {tree}", file=sys.stderr)
PYEOF
	# facebook/opt-125m's config.json (vLLM's test config's model), for an
	# offline hub cache.
	SNAP="$TREE/hf/hub/models--facebook--opt-125m/snapshots/0000000000000000000000000000000000000000"
	mkdir -p "$SNAP" "$TREE/hf/hub/models--facebook--opt-125m/refs"
	printf 0000000000000000000000000000000000000000 >"$TREE/hf/hub/models--facebook--opt-125m/refs/main"
	cat >"$SNAP/config.json" <<'EOF'
{
  "_name_or_path": "facebook/opt-125m",
  "activation_dropout": 0.0,
  "activation_function": "relu",
  "architectures": ["OPTForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 2,
  "do_layer_norm_before": true,
  "dropout": 0.1,
  "eos_token_id": 2,
  "ffn_dim": 3072,
  "hidden_size": 768,
  "init_std": 0.02,
  "layerdrop": 0.0,
  "max_position_embeddings": 2048,
  "model_type": "opt",
  "num_attention_heads": 12,
  "num_hidden_layers": 12,
  "pad_token_id": 1,
  "prefix": "</s>",
  "torch_dtype": "float16",
  "transformers_version": "4.21.0.dev0",
  "use_cache": true,
  "vocab_size": 50272,
  "word_embed_proj_dim": 768
}
EOF
	echo "$SDIST_SHA256" >"$TREE/.sdist-sha256"
fi

# -- kvtierd -----------------------------------------------------------------------
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
log "building kvtierd"
go build -o "$WORK/kvtierd" ./cmd/kvtierd

# -- the run -----------------------------------------------------------------------
# NB: --rootdir=/ so both trees' test ids keep their paths; -p test_vllm_harness
# is the plugin that puts kvtier's spec into vLLM's RequestRunner.
log "vLLM $VLLM_VERSION's $HARNESS against kvtier's spec"
HF_HOME="$TREE/hf" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_TARGET_DEVICE=cpu \
	KVTIER_HARNESS_KVTIERD="$WORK/kvtierd" \
	PYTHONPATH="$TREE:$ROOT/clients/python:$ROOT/clients/python/tests_vllm${PYTHONPATH:+:$PYTHONPATH}" \
	"$PY" -m pytest -p test_vllm_harness -p no:cacheprovider --rootdir=/ -q -rpfEsx \
	"$TREE/$HARNESS" "$ROOT/clients/python/tests_vllm/test_vllm_harness.py" "$@"

#!/usr/bin/env bash
# The GPU check, one command on a machine with one CUDA GPU (written for the
# lent H200: 16 cores, 128 GiB, 64 GiB disk, package registries only):
#
#   1. vLLM 0.33.0 (its PyPI build, CUDA) in the venv scripts/vllm-env.sh 0.33
#      builds, and Go (go.mod's version) to build kvtierd;
#   2. a random-weight model of Llama-3-8B's shape, built once (bf16
#      safetensors, ~16 GB; random weights make every KV byte matter, and
#      no model can be downloaded there);
#   3. TTFT of a 32,000-token prefix + 16 new tokens, recomputed, reloaded
#      from vLLM's native CPU offloading, reloaded from kvtier (a kvtierd
#      started here), each configuration in its own engine process, median
#      of 3; the greedy outputs of one prompt must be identical across the
#      three;
#   4. the connector's CUDA tests (clients/python/tests_vllm on the GPU);
#   5. one JSON line on stdout (also $OUT/gpu-check.json when OUT is set,
#      with log tails under $OUT/gpu-check-logs/). Exits non-zero if the
#      outputs differ, a reload did not serve the whole prefix, a
#      configuration failed, or the tests failed.
#
# Usage: bash scripts/gpu-check.sh [--dry-run] [--setup-only] [--no-bench]
#            [--no-tests] [--budget-s N] [--sglang] [KNOB VALUE ...]
#   --sglang      the SGLang section instead (kvtier as SGLang's HiCache L3,
#                 docs/SGLANG.md): see "--sglang" below
#   --dry-run     print the plan (sizes, what it would install, the commands)
#                 and what this machine has; installs and starts nothing
#   --setup-only  Go, kvtierd, the venv and the model; measures nothing
#   --budget-s N  the command is cut off after N seconds: start no engine
#                 and no test run that would end later, so that the JSON
#                 line is still printed (each configuration's result is
#                 copied under $OUT as soon as it ends)
#   KNOBS         passed to gpu_check.py (python3 clients/python/kvtier_bench/
#                 gpu_check.py plan --help): --prefix-tokens 32000,
#                 --repeats 3, --configs recompute,native,kvtier, ...
# Env: KVTIER_GPU_CACHE   caches: Go, kvtierd, the model, run logs
#                         (default ~/.cache/kvtier)
#      KVTIER_VLLM_VENV   the venv (scripts/vllm-env.sh's default:
#                         ~/.cache/kvtier/vllm-0.33.0)
#      KVTIER_GPU_TESTS   the CUDA tests' pytest arguments, one a line
#                         (default: gpu_check.py select-tests)
#      KVTIER_GPU_TESTS_TIMEOUT  seconds (default 360)
#
# Time: a cold machine spends most of its time on the venv (~5 GB from
# PyPI), the model (~1 min) and three 8B engine starts. Where one command
# may run 10 minutes (the lent device), run
#     bash scripts/gpu-check.sh --setup-only --budget-s 570
#     bash scripts/gpu-check.sh --budget-s 570
# the second while the machine is still warm: it finds everything cached.
# (Shorter still: --no-tests, then --no-bench, as two commands.)
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CHECK="$ROOT/clients/python/kvtier_bench/gpu_check.py"
CACHE="${KVTIER_GPU_CACHE:-$HOME/.cache/kvtier}"
export KVTIER_GPU_CACHE="$CACHE"
GO_VERSION=1.26.8 # go.mod's; gpu_check.py pins the proxy toolchain's hash
# Nothing but package registries is reachable: no hub, no usage reports.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

log() { printf '[gpu-check] %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 2
}

DRY_RUN=0 SETUP_ONLY=0 RUN_BENCH=1 RUN_TESTS=1 BATCH_INVARIANT=1 BUDGET_S=0 SGLANG=0
KNOBS=()
while [ $# -gt 0 ]; do
	case "$1" in
	--dry-run) DRY_RUN=1 ;;
	--sglang) SGLANG=1 ;;
	--setup-only) SETUP_ONLY=1 ;;
	--no-bench) RUN_BENCH=0 ;;
	--no-tests) RUN_TESTS=0 ;;
	--budget-s)
		[ $# -ge 2 ] && [ "$2" -ge 0 ] 2>/dev/null || die "--budget-s needs a number of seconds"
		BUDGET_S="$2"
		shift
		;;
	-h | --help)
		sed -n '2,/^set -E/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	--no-batch-invariant)
		BATCH_INVARIANT=0
		KNOBS+=("$1")
		;;
	--*=*) KNOBS+=("$1") ;;
	--*)
		[ $# -ge 2 ] || die "$1 needs a value"
		KNOBS+=("$1" "$2")
		shift
		;;
	*) die "unknown argument: $1 (--help)" ;;
	esac
	shift
done
if [ "$SETUP_ONLY" = 1 ]; then
	RUN_BENCH=0 RUN_TESTS=0
fi

# --sglang: the SGLang section instead of the vLLM one (issue 28; it has
# not run on a GPU yet). A real SGLang server (SGLang 0.5.23 as the package
# index serves it, CUDA, in its own venv) on a small random-weight Llama
# (4 layers, built here), run twice: without L3, and with kvtier as its
# HiCache storage backend (a kvtierd started here). Each time: /flush_cache,
# a request with a long prefix, /flush_cache again (L1 and L2 emptied; kvtier
# keeps the pages), a second request sharing that prefix. Fails unless the
# greedy outputs are identical with kvtier on and off and, with kvtier, the
# second request reports the prefix cached from L3
# (meta_info.cached_tokens_details.storage). One JSON line on stdout (and
# $OUT/gpu-check-sglang.json).
if [ "$SGLANG" = 1 ]; then
	SGL_VENV="${KVTIER_SGLANG_GPU_VENV:-$CACHE/sglang-gpu-0.5.23}"
	SGL_WORK="$(mktemp -d "${TMPDIR:-/tmp}/kvtier-gpu-sglang.XXXXXX")"
	if [ "$DRY_RUN" = 1 ]; then
		log "would build $SGL_VENV (pip install sglang==0.5.23 + ./clients/python), kvtierd, a 4-layer random Llama,"
		log "then run two SGLang servers (kvtier off, on) with --enable-hierarchical-cache"
		exit 0
	fi
	command -v go >/dev/null || die "--sglang needs go on PATH (run the vLLM section's --setup-only first)"
	if [ ! -x "$SGL_VENV/bin/python" ] || ! "$SGL_VENV/bin/python" -c 'import sglang' 2>/dev/null; then
		python3 -m venv "$SGL_VENV"
		"$SGL_VENV/bin/python" -m pip install --quiet "sglang==0.5.23" >&2
	fi
	"$SGL_VENV/bin/python" -m pip install --quiet --no-deps --force-reinstall "$ROOT/clients/python" >&2
	[ "$SETUP_ONLY" = 1 ] && exit 0
	go build -o "$SGL_WORK/kvtierd" ./cmd/kvtierd
	"$SGL_VENV/bin/python" - "$SGL_WORK" "$SGL_WORK/kvtierd" "${OUT:-}" <<'PYEOF'
import json, os, signal, subprocess, sys, time, urllib.request

work, kvtierd, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
model = os.path.join(work, "model")
import torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=8192)
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(model)
tok_cfg = {"model_max_length": 8192}
json.dump(tok_cfg, open(os.path.join(model, "tokenizer_config.json"), "w"))
PAGE, PORT = 64, 30111
page_bytes = PAGE * 4 * 2 * 8 * 128 * 2
sock = os.path.join(work, "engine.sock")
d = subprocess.Popen([kvtierd, "--engine-listen", "unix://" + sock, "--pool-bytes", "4GiB",
                      "--block-bytes", str(page_bytes), "--metrics-listen", "127.0.0.1:0"])
prefix = [(i * 7919) % 31000 + 100 for i in range(4096)]
a, b = prefix + [11, 12, 13], prefix + [21, 22, 23]

def post(path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body or {}).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=600).read() or b"{}")

def gen(ids):
    return post("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 16, "temperature": 0}})

def serve(kvtier):
    args = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--skip-tokenizer-init",
            "--port", str(PORT), "--page-size", str(PAGE), "--enable-hierarchical-cache",
            "--hicache-mem-layout", "page_first", "--enable-cache-report", "--random-seed", "0"]
    if kvtier:
        args += ["--hicache-storage-backend", "dynamic", "--hicache-storage-backend-extra-config",
                 json.dumps({"backend_name": "kvtier", "module_path": "kvtier_sglang.backend",
                             "class_name": "KvtierHiCacheStorage", "interface_v1": 1,
                             "kvtier_address": "unix://" + sock})]
    p = subprocess.Popen(args, stdout=open(os.path.join(work, f"sglang-{kvtier}.log"), "w"),
                         stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 900
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=5)
            break
        except Exception:
            assert p.poll() is None and time.monotonic() < deadline, "SGLang did not start"
            time.sleep(2)
    try:
        post("/flush_cache")
        first = gen(a)
        post("/flush_cache")
        second = gen(b)
        return first, second
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=120)

res = {}
try:
    off = serve(False)
    on = serve(True)
    details = on[1]["meta_info"].get("cached_tokens_details") or {}
    res = {"outputs_identical": [o["output_ids"] for o in off] == [o["output_ids"] for o in on],
           "l3_cached_tokens": details.get("storage", 0), "prefix_tokens": len(prefix),
           "cached_tokens_details": details}
    res["ok"] = res["outputs_identical"] and res["l3_cached_tokens"] >= (len(prefix) // PAGE - 1) * PAGE
finally:
    d.send_signal(signal.SIGTERM)
    d.wait(timeout=60)
line = json.dumps({"sglang": res})
print(line)
if out_dir:
    open(os.path.join(out_dir, "gpu-check-sglang.json"), "w").write(line + "\n")
sys.exit(0 if res.get("ok") else 1)
PYEOF
	exit $?
fi

# The plan first, on the bare python3: a bad knob fails here, before
# anything is installed; the sizes below come from the same arithmetic the
# bench uses.
command -v python3 >/dev/null || die "python3 is not on PATH"
plan() { python3 "$CHECK" plan ${KNOBS[@]+"${KNOBS[@]}"} --cache "$CACHE" "$@"; }
PLAN="$(plan)" || die "gpu_check.py plan refused the arguments"
SHM_NEED="$(plan --field shm_bytes_needed)"
MODEL_BYTES="$(plan --field model_bytes)"
MODEL_DIR="$(plan --field model_dir)"
VENV_DIR="${KVTIER_VLLM_VENV:-$HOME/.cache/kvtier/vllm-0.33.0}"
MIN_DRIVER="$(plan --field nvidia_driver_major)"
KVTIERD="$CACHE/gpu-check/bin/kvtierd"
VENV_BYTES=$((12 << 30)) # vllm 0.33.0 + torch 2.14.0 (CUDA 13.0) installed: ~10 GB

gib() { awk -v b="$1" 'BEGIN { printf "%.1f GiB", b / 1073741824 }'; }
free_bytes() { df -P -B1 "$1" 2>/dev/null | awk 'NR == 2 { print $4 }'; }
# version_ge A B: A >= B (dotted versions)
version_ge() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$2" ]; }

# A go binary that is go.mod's version or newer. GOTOOLCHAIN=local: an
# older go must not try to switch toolchains by itself (that asks
# sum.golang.org, which the device cannot reach); run outside the
# repository so go.mod does not refuse it.
go_usable() {
	local v
	v="$(cd / && GOTOOLCHAIN=local "$1" env GOVERSION 2>/dev/null)" || return 1
	version_ge "${v#go}" "$GO_VERSION"
}
go_candidates() {
	command -v go 2>/dev/null || true
	echo /usr/local/go/bin/go
	echo "$CACHE/go/go$GO_VERSION/bin/go"
}
find_go() {
	local g
	while read -r g; do
		if [ -x "$g" ] && go_usable "$g"; then
			echo "$g"
			return 0
		fi
	done < <(go_candidates)
	return 1
}

gpu_facts() { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n1; }

# -- --dry-run: the plan and this machine's facts; nothing installed ---------

if [ "$DRY_RUN" = 1 ]; then
	echo "$PLAN"
	echo
	echo "# this machine"
	facts="$(gpu_facts || true)"
	echo "gpu: ${facts:-none (nvidia-smi absent or no GPU): the run would stop at preflight}"
	echo "driver needed: >= $MIN_DRIVER (torch 2.14.0 + CUDA 13.0, which vllm==0.33.0 pins)"
	echo "/dev/shm free: $(gib "$(free_bytes /dev/shm || echo 0)"), needed $(gib "$SHM_NEED")"
	mkdir_parent="$CACHE"
	while [ ! -d "$mkdir_parent" ]; do mkdir_parent="$(dirname "$mkdir_parent")"; done
	echo "disk free under $CACHE: $(gib "$(free_bytes "$mkdir_parent")"), needed ~$(gib "$((MODEL_BYTES + VENV_BYTES))") when neither the model nor the venv is there yet"
	if g="$(find_go)"; then
		echo "go: $g ($(cd / && GOTOOLCHAIN=local "$g" env GOVERSION))"
	else
		echo "go: none >= $GO_VERSION; would fetch golang.org/toolchain@v0.0.1-go$GO_VERSION.linux-<arch> from the Go module proxy into $CACHE/go (hash pinned)"
	fi
	echo "c compiler (Triton's launchers): $(command -v cc || command -v gcc || echo 'none: would apt-get install gcc')"
	if [ -f "$VENV_DIR/.kvtier-recipe" ]; then
		echo "venv: $VENV_DIR (present; vllm-env.sh reuses it)"
	else
		echo "venv: $VENV_DIR (absent: vllm-env.sh 0.33 would pip install vllm==0.33.0 pytest msgpack xxhash, ~5 GB)"
	fi
	if [ -f "$MODEL_DIR/.kvtier-model.json" ]; then
		echo "model: $MODEL_DIR (present)"
	else
		echo "model: $MODEL_DIR (absent: built on the GPU, ~$(gib "$(plan --field model_bytes)"))"
	fi
	echo
	echo "# commands"
	echo "bash scripts/vllm-env.sh 0.33                                  # the venv (in parallel with Go)"
	echo "go build -o $KVTIERD ./cmd/kvtierd"
	echo "\$VENV/bin/python $CHECK build-model --cache $CACHE ${KNOBS[*]:-}"
	[ "$RUN_BENCH" = 1 ] && echo "\$VENV/bin/python $CHECK bench --model $MODEL_DIR --kvtierd $KVTIERD --work <run dir> --out <run dir>/bench.json ${KNOBS[*]:-}"
	if [ "$RUN_TESTS" = 1 ]; then
		if [ -n "${KVTIER_GPU_TESTS:-}" ]; then
			mapfile -t SEL < <(printf '%s\n' "$KVTIER_GPU_TESTS" | sed '/^$/d')
		else
			mapfile -t SEL < <(python3 "$CHECK" select-tests --repo "$ROOT")
		fi
		echo "$([ "$BATCH_INVARIANT" = 1 ] && echo 'VLLM_BATCH_INVARIANT=1 ')\$VENV/bin/python -m pytest $(printf '%q ' "${SEL[@]}")-q -rs --junitxml=<run dir>/cuda-tests.xml"
	fi
	echo "python3 $CHECK verdict ...                                   # the JSON line; \$OUT/gpu-check.json"
	exit 0
fi

# -- the run --------------------------------------------------------------------

WORK="$CACHE/gpu-check/runs/$(date +%Y%m%d-%H%M%S)-$$"
mkdir -p "$WORK" "$(dirname "$KVTIERD")"
PHASES="" PHASE="start" PHASE_T0=$SECONDS
phase() {
	PHASE="$1" PHASE_T0=$SECONDS
	log "== $1"
}
phase_done() {
	PHASES="${PHASES:+$PHASES,}\"$PHASE\":$((SECONDS - PHASE_T0))"
	save_logs
}
# time_left RESERVE: seconds of --budget-s left, less RESERVE (0: no budget;
# at least 1 otherwise, so that a spent budget is not read as none).
time_left() {
	if [ "$BUDGET_S" = 0 ]; then
		echo 0
	else
		local left=$((BUDGET_S - SECONDS - $1))
		echo $((left > 1 ? left : 1))
	fi
}

# Logs come back with $OUT: the tails only (an engine's log can be long).
save_logs() {
	[ -n "${OUT:-}" ] || return 0
	mkdir -p "$OUT/gpu-check-logs"
	local f
	for f in "$WORK"/*.log "$WORK"/*.json "$WORK"/*.xml; do
		[ -f "$f" ] || continue
		tail -c 200000 "$f" >"$OUT/gpu-check-logs/$(basename "$f")" || true
	done
}

# Any failure still ends in the one JSON line (and $OUT/gpu-check.json),
# naming the phase it happened in.
fail() {
	trap - ERR
	log "FAILED in $PHASE: $*"
	if [ -n "${GO_PID:-}" ]; then kill "$GO_PID" 2>/dev/null || true; fi
	save_logs
	python3 "$CHECK" verdict --failed-phase "$PHASE" --error "$*" --phases "{$PHASES}" \
		--out-dir "${OUT:-}" || true
	exit 1
}
trap 'fail "command failed at line $LINENO (exit $?)"' ERR

# -- preflight: what would make the run fail minutes later --------------------
phase preflight
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: no NVIDIA driver on this machine"
FACTS="$(gpu_facts)" || fail "nvidia-smi sees no GPU"
log "gpu: $FACTS"
DRIVER="$(printf '%s' "$FACTS" | awk -F', ' '{ print $2 }')"
if [ "${DRIVER%%.*}" -lt "$MIN_DRIVER" ] 2>/dev/null; then
	fail "NVIDIA driver $DRIVER: vllm==0.33.0 from PyPI runs on torch 2.14.0 built for CUDA 13.0, which needs driver >= $MIN_DRIVER"
fi
if [ "$RUN_BENCH" = 1 ]; then
	SHM_FREE="$(free_bytes /dev/shm || echo 0)"
	[ "${SHM_FREE:-0}" -ge "$SHM_NEED" ] ||
		fail "/dev/shm has $(gib "${SHM_FREE:-0}") free; kvtierd's pool and vLLM's CPU region need $(gib "$SHM_NEED") (fewer --repeats need less)"
fi
mkdir -p "$CACHE"
NEED_MODEL=0
if [ "$RUN_BENCH" = 1 ] || [ "$SETUP_ONLY" = 1 ]; then NEED_MODEL=1; fi
DISK_NEED=$((1 << 30))
if [ "$NEED_MODEL" = 1 ] && [ ! -f "$MODEL_DIR/.kvtier-model.json" ]; then DISK_NEED=$((DISK_NEED + MODEL_BYTES)); fi
[ -f "$VENV_DIR/.kvtier-recipe" ] || DISK_NEED=$((DISK_NEED + VENV_BYTES))
DISK_FREE="$(free_bytes "$CACHE")"
[ "${DISK_FREE:-0}" -ge "$DISK_NEED" ] ||
	fail "$(gib "${DISK_FREE:-0}") free under $CACHE; what is still to be built (model, venv) needs ~$(gib "$DISK_NEED")"
# Triton (vLLM's kernels, the batch-invariant ops) compiles its launchers
# with the system's C compiler at first use.
if ! command -v cc >/dev/null && ! command -v gcc >/dev/null; then
	log "no C compiler: apt-get install gcc (Triton compiles its launchers with it)"
	SUDO=""
	[ "$(id -u)" -eq 0 ] || SUDO="sudo"
	{ $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null; } ||
		log "warning: could not install gcc; the engines may fail compiling Triton kernels"
fi
phase_done

# -- Go and kvtierd, in the background while pip installs the venv ---------------
# NB: a subshell: its PATH does not come back, so it writes the go it used
# to a file; and ERR is not trapped there (the parent reports its failure).
go_setup() {
	trap - ERR
	set +e
	local g root
	if ! g="$(find_go)"; then
		echo "no go >= $GO_VERSION on PATH, in /usr/local/go or $CACHE/go: fetching go$GO_VERSION from the Go module proxy"
		if root="$(python3 "$CHECK" go-toolchain --version "$GO_VERSION" --dest "$CACHE/go")" &&
			go_usable "$root/bin/go"; then
			g="$root/bin/go"
		else
			# Last resort: the distribution's Go, if it is new enough (Debian 12's
			# golang-go is 1.19: too old even to switch toolchains).
			echo "the module proxy's toolchain failed; trying apt-get install golang-go"
			local sudo=""
			[ "$(id -u)" -eq 0 ] || sudo="sudo"
			$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq golang-go >/dev/null
			if [ -x /usr/bin/go ] && go_usable /usr/bin/go; then
				g=/usr/bin/go
			else
				echo "FATAL: apt's Go is $( (cd / && /usr/bin/go env GOVERSION) 2>/dev/null || echo absent), older than go.mod's $GO_VERSION, and Go $GO_VERSION could not be fetched from the module proxy"
				return 1
			fi
		fi
	fi
	echo "go: $g ($(cd / && GOTOOLCHAIN=local "$g" env GOVERSION))"
	echo "$g" >"$WORK/go.path"
	GOTOOLCHAIN=local "$g" build -o "$KVTIERD" ./cmd/kvtierd || return 1
	echo "kvtierd: $KVTIERD"
	echo $((SECONDS - PHASE_T0)) >"$WORK/go.seconds"
}
phase go
export GOTOOLCHAIN=local
case " ${GOFLAGS:-} " in *" -buildvcs=false "*) ;; *) export GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false" ;; esac
go_setup >"$WORK/go.log" 2>&1 &
GO_PID=$!

phase venv
# NB: no pip cache: the ~5 GB of wheels are installed once into the venv;
# caching them too costs disk and time on a machine that is used once.
VENV="$(PIP_NO_CACHE_DIR="${PIP_NO_CACHE_DIR:-1}" bash scripts/vllm-env.sh 0.33)" ||
	fail "scripts/vllm-env.sh 0.33 failed"
"$VENV/bin/python" - <<'PYEOF' >&2 || fail "torch in $VENV sees no CUDA GPU (driver too old for its CUDA runtime?)"
import torch, vllm
assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
print(f"vllm {vllm.__version__}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"{torch.cuda.get_device_name(0)}")
PYEOF
phase_done

PHASE=go
if ! wait "$GO_PID"; then
	tail -n 20 "$WORK/go.log" >&2
	fail "Go or the kvtierd build failed (go.log)"
fi
cat "$WORK/go.log" >&2
PHASES="$PHASES,\"go\":$(cat "$WORK/go.seconds")" # its own time, not the wait's
GO_BIN="$(cat "$WORK/go.path")"
PATH="$(dirname "$GO_BIN"):$PATH" # the tests' fixture builds kvtierd with go too
export PATH

if [ "$NEED_MODEL" = 1 ]; then
	# On the GPU: bf16 weights made there in seconds, ~16 GB written once.
	phase model
	"$VENV/bin/python" "$CHECK" build-model ${KNOBS[@]+"${KNOBS[@]}"} --cache "$CACHE" >&2 ||
		fail "building the model failed"
	phase_done
fi

if [ "$SETUP_ONLY" = 1 ]; then
	trap - ERR
	save_logs
	python3 "$CHECK" verdict --setup-only --phases "{$PHASES}" --out-dir "${OUT:-}"
	exit $?
fi

# -- the measurement --------------------------------------------------------------
BENCH_ARGS=(--no-bench)
if [ "$RUN_BENCH" = 1 ]; then
	phase bench
	# A failed bench still leaves per-configuration errors in bench.json (or
	# nothing: the verdict says so); the tests run either way.
	"$VENV/bin/python" "$CHECK" bench ${KNOBS[@]+"${KNOBS[@]}"} --model "$MODEL_DIR" \
		--kvtierd "$KVTIERD" --work "$WORK" --out "$WORK/bench.json" --time-left-s "$(time_left 20)" ||
		log "the bench exited $? (its result says why)"
	phase_done
	BENCH_ARGS=(--bench "$WORK/bench.json")
fi

# -- the connector's CUDA tests ---------------------------------------------------
TESTS_ARGS=(--no-tests)
if [ "$RUN_TESTS" = 1 ]; then
	phase tests
	if [ -n "${KVTIER_GPU_TESTS:-}" ]; then
		mapfile -t SEL < <(printf '%s\n' "$KVTIER_GPU_TESTS" | sed '/^$/d')
	else
		mapfile -t SEL < <(python3 "$CHECK" select-tests --repo "$ROOT")
	fi
	log "pytest ${SEL[*]}"
	TESTS_RC=0 TESTS_TIMEOUT="${KVTIER_GPU_TESTS_TIMEOUT:-360}" LEFT="$(time_left 15)"
	if [ "$LEFT" != 0 ] && [ "$LEFT" -lt "$TESTS_TIMEOUT" ]; then TESTS_TIMEOUT="$LEFT"; fi
	if [ "$TESTS_TIMEOUT" -lt 90 ]; then
		log "not running the CUDA tests: ${TESTS_TIMEOUT}s of --budget-s left"
		phase_done
		TESTS_ARGS=(--tests-not-run "out of time (--budget-s $BUDGET_S)"
			--tests-selection "$(printf '%s\n' "${SEL[@]}")")
	else
		# Batch-invariant: those tests compare kvtier-on to a reference engine
		# bit for bit, with the suffix computed in a different batch shape;
		# on CUDA only vLLM's batch-invariant mode makes that a fair comparison.
		(
			trap - ERR
			[ "$BATCH_INVARIANT" = 1 ] && export VLLM_BATCH_INVARIANT=1
			exec timeout --kill-after=10 "$TESTS_TIMEOUT" "$VENV/bin/python" -m pytest \
				"${SEL[@]}" -q -rs -p no:cacheprovider --junitxml="$WORK/cuda-tests.xml"
		) >"$WORK/cuda-tests.log" 2>&1 || TESTS_RC=$?
		tail -n 30 "$WORK/cuda-tests.log" >&2
		phase_done
		TESTS_ARGS=(--junit "$WORK/cuda-tests.xml" --tests-rc "$TESTS_RC"
			--tests-selection "$(printf '%s\n' "${SEL[@]}")")
	fi
fi

trap - ERR
save_logs
RC=0
python3 "$CHECK" verdict "${BENCH_ARGS[@]}" "${TESTS_ARGS[@]}" --phases "{$PHASES}" \
	--out-dir "${OUT:-}" || RC=$?
log "run directory: $WORK"
exit "$RC"

"""The GPU check's CPU-side parts (scripts/gpu-check.sh and
kvtier_bench/gpu_check.py): the arithmetic, the arguments, the verdict, the
Go toolchain's verification, the test selection and the script's dry run.
No vLLM, torch or GPU: gpu_check.py is loaded by its path (the package's
__init__ imports vLLM), and what needs them is not called."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
import importlib.util

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
SCRIPT = os.path.join(REPO, "scripts", "gpu-check.sh")


def _load():
    path = os.path.join(REPO, "clients", "python", "kvtier_bench", "gpu_check.py")
    spec = importlib.util.spec_from_file_location("kvtier_gpu_check_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gc = _load()


def knobs(*argv):
    """The plan's arguments, parsed as the script passes them."""
    a = gc.build_parser().parse_args(["plan", *argv])
    gc.check_knobs(a)
    return a


# -- importable without the GPU stack ---------------------------------------------


def test_loading_it_imports_neither_vllm_nor_torch():
    code = ("import importlib.util, sys; "
            f"s = importlib.util.spec_from_file_location('g', {gc.__file__!r}); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "print(sorted(k for k in ('vllm', 'torch', 'transformers') if k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- arithmetic --------------------------------------------------------------------


def test_llama3_8b_kv_and_block_bytes():
    shape = gc.LLAMA3_8B
    assert gc.head_dim(shape) == 128
    # 32 layers x K,V x 8 KV heads x 128 x bf16
    assert gc.kv_bytes_per_token(shape) == 32 * 2 * 8 * 128 * 2 == 131072
    assert gc.block_bytes(shape, 32) == 32 * 131072 == 4 << 20
    assert gc.block_bytes(shape, 16) == 2 << 20


def test_llama3_8b_parameter_count():
    # Meta-Llama-3-8B: 8,030,261,248 parameters (untied lm_head)
    assert gc.param_count(gc.LLAMA3_8B) == 8_030_261_248


def test_default_sizes():
    s = gc.sizes(knobs())
    assert s["prompt_tokens"] == 32016
    assert s["cached_tokens_expected"] == 32000
    assert s["block_bytes"] == 4 << 20
    # warm-up + 3 repeats, 1001 blocks each (the last one partial), + margin
    assert s["pool_slots"] == 4 * 1001 + gc.SLOT_MARGIN
    assert s["pool_bytes"] == s["pool_slots"] * s["block_bytes"]
    assert s["native_cpu_bytes"] == s["pool_bytes"]  # 4 MiB is page-aligned: same capacity
    assert s["shm_bytes_needed"] == s["pool_bytes"] + (1 << 30)
    assert s["prefix_bytes"] == 32000 * 131072
    assert s["max_num_batched_tokens"] == 32000
    assert 32016 + 32 <= s["max_model_len"] <= gc.LLAMA3_8B["max_positions"]
    assert s["max_model_len"] % 32 == 0


def test_cached_tokens_expected_is_the_prefix_whatever_the_suffix():
    # a suffix of whole blocks is new to the tier: only the prefix is served
    assert gc.cached_tokens_expected(knobs("--prefix-tokens", "512", "--suffix-tokens", "64")) == 512
    assert gc.cached_tokens_expected(knobs("--prefix-tokens", "512", "--suffix-tokens", "1")) == 512
    assert gc.cached_tokens_expected(knobs("--prefix-tokens", "64", "--suffix-tokens", "16",
                                           "--block-tokens", "16")) == 64


def test_a_longer_prompt_widens_the_models_context():
    a = knobs("--prefix-tokens", "40000")
    assert gc.model_shape(a)["max_positions"] >= gc.max_model_len(a)
    assert gc.model_shape(knobs())["max_positions"] == 33792  # the default fits as is
    assert gc.model_dir("/c", a) != gc.model_dir("/c", knobs())  # another model


def test_prompts_are_seeded_and_in_range():
    assert gc.prompt(3, 100) == gc.prompt(3, 100)
    assert gc.prompt(3, 100) != gc.prompt(4, 100)
    assert all(1 <= t < 50 for t in gc.prompt(0, 1000, high=50))
    assert all(1 <= t < 100000 for t in gc.prompt(0, 1000))


# -- arguments -----------------------------------------------------------------------


def test_knob_defaults():
    a = knobs()
    assert (a.prefix_tokens, a.suffix_tokens, a.greedy_tokens, a.block_tokens, a.repeats) == (32000, 16, 32, 32, 3)
    assert gc.configs(a) == ["recompute", "native", "kvtier"]
    assert a.batch_invariant is True
    assert a.transport == "unix"


@pytest.mark.parametrize("argv,needle", [
    (["--configs", "recompute,bogus"], "unknown"),
    (["--repeats", "0"], "--repeats"),
    (["--prefix-tokens", "1000", "--block-tokens", "32"], "multiple"),
])
def test_bad_knobs_are_refused(argv, needle):
    with pytest.raises(SystemExit) as e:
        knobs(*argv)
    assert needle in str(e.value)


def test_configs_keep_their_order_whatever_the_order_asked():
    assert gc.configs(knobs("--configs", "kvtier,recompute")) == ["recompute", "kvtier"]


def test_the_engine_child_gets_the_same_knobs():
    a = knobs("--prefix-tokens", "4096", "--repeats", "2", "--configs", "native,kvtier",
              "--no-batch-invariant", "--settle-s", "0.5", "--transport", "ipc")
    child = gc.build_parser().parse_args(["engine", "--config", "native", "--model", "m",
                                          "--out", "o", *gc._knob_args(a)])
    for name in ("prefix_tokens", "suffix_tokens", "greedy_tokens", "block_tokens", "repeats", "seed",
                 "configs", "transport", "settle_s", "gpu_memory_utilization", "engine_timeout_s",
                 "batch_invariant"):
        assert getattr(child, name) == getattr(a, name), name


def test_kv_transfer_configs():
    assert gc.kv_transfer_config("recompute") is None
    native = gc.kv_transfer_config("native", cpu_bytes=123)
    assert native["kv_connector"] == "OffloadingConnector" and native["kv_role"] == "kv_both"
    assert native["kv_connector_extra_config"] == {"spec_name": "CPUOffloadingSpec", "cpu_bytes_to_use": 123}
    kv = gc.kv_transfer_config("kvtier", kvtier_address="unix:///s")
    assert kv["kv_connector_extra_config"] == {
        "spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier_vllm", "kvtier_address": "unix:///s"}
    with pytest.raises(ValueError):
        gc.kv_transfer_config("kvtier")
    with pytest.raises(ValueError):
        gc.kv_transfer_config("other")


def test_plan_is_json_and_names_every_configuration(capsys):
    assert gc.main(["plan", "--cache", "/nowhere"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert set(p["configs"]) == {"recompute", "native", "kvtier"}
    assert p["configs"]["recompute"] is None
    assert p["vllm"] == "0.33.0"
    assert p["kvtierd"][p["kvtierd"].index("--block-bytes") + 1] == str(4 << 20)
    assert p["model"]["dir"].startswith("/nowhere/")
    assert gc.main(["plan", "--field", "block_bytes"]) == 0
    assert capsys.readouterr().out.strip() == str(4 << 20)
    assert gc.main(["plan", "--field", "nvidia_driver_major"]) == 0
    assert capsys.readouterr().out.strip() == str(gc.MIN_DRIVER_MAJOR)


# -- the verdict --------------------------------------------------------------------


def result(config, ttft, tokens=(5, 6, 7), cached=None):
    cached = cached if cached is not None else (0 if config == "recompute" else 32000)
    return {"config": config, "engine_start_s": 40.0, "ttft_s": [ttft, ttft * 1.1, ttft * 0.9],
            "ttft_median_s": ttft, "cold_ttft_s": [] if config == "recompute" else [3.0, 3.1, 3.0],
            "cached_tokens": [cached] * 3, "greedy_tokens": list(tokens),
            "greedy_logprobs": [[[t, -0.1], [t + 1, -2.0]] for t in tokens],
            "greedy_cached_tokens": cached, "batch_invariant": True}


def bench(**over):
    res = {"recompute": result("recompute", 3.0), "native": result("native", 0.3),
           "kvtier": result("kvtier", 0.25)}
    res.update(over)
    return {"sizes": {"cached_tokens_expected": 32000}, "prefix_tokens": 32000, "results": res}


TESTS_OK = {"rc": 0, "tests": 3, "passed": 3, "failures": 0, "errors": 0, "skipped": 0}


def test_all_well_is_ok_with_every_field():
    out, rc = gc.verdict(bench(), TESTS_OK, phases={"bench": 200})
    assert rc == 0 and out["gpu_check"] == "ok" and out["problems"] == []
    assert out["recompute_ttft_s"] == 3.0 and out["native_ttft_s"] == 0.3 and out["kvtier_ttft_s"] == 0.25
    assert out["native_speedup"] == 10.0 and out["kvtier_speedup"] == 12.0
    assert out["kvtier_vs_native_ttft"] == 0.83
    assert out["outputs_identical"] is True and out["logprobs_identical"] is True
    assert out["cuda_tests"] == TESTS_OK
    assert out["phase_s"] == {"bench": 200}
    assert out["cached_tokens"]["kvtier"] == [32000] * 4
    json.dumps(out)  # one JSON line


def test_differing_outputs_fail_and_say_where():
    out, rc = gc.verdict(bench(kvtier=result("kvtier", 0.25, tokens=(5, 9, 7))), TESTS_OK)
    assert rc == 1 and out["gpu_check"] == "FAILED"
    assert out["outputs_identical"] is False
    assert out["divergence"] == {"native": None, "kvtier": 1}
    assert any("differ" in p for p in out["problems"])


def test_differing_logprobs_alone_are_reported_not_failed():
    r = result("native", 0.3)
    r["greedy_logprobs"][0][0][1] = -0.2
    out, rc = gc.verdict(bench(native=r), TESTS_OK)
    assert rc == 0 and out["logprobs_identical"] is False


def test_a_reload_that_did_not_serve_the_whole_prefix_fails():
    out, rc = gc.verdict(bench(native=result("native", 0.3, cached=16000)), TESTS_OK)
    assert rc == 1 and any("native" in p and "reloaded whole" in p for p in out["problems"])


def test_a_recompute_that_hit_a_cache_fails():
    out, rc = gc.verdict(bench(recompute=result("recompute", 0.3, cached=32000)), TESTS_OK)
    assert rc == 1 and any("not a recompute" in p for p in out["problems"])


def test_a_failed_configuration_fails_and_the_rest_is_still_reported():
    out, rc = gc.verdict(bench(kvtier={"config": "kvtier", "error": "engine exited 1"}), TESTS_OK)
    assert rc == 1 and "kvtier: engine exited 1" in out["problems"]
    assert out["kvtier_ttft_s"] is None and out["native_speedup"] == 10.0
    assert out["outputs_identical"] is False  # not across all three


def test_no_bench_result_fails():
    out, rc = gc.verdict(None, TESTS_OK)
    assert rc == 1 and out["outputs_identical"] is False


@pytest.mark.parametrize("tests,needle", [
    ({"rc": 1, "tests": 3, "passed": 2, "failures": 1, "errors": 0, "skipped": 0}, "exited 1"),
    ({"rc": 0, "tests": 3, "passed": 0, "failures": 0, "errors": 0, "skipped": 3}, "none passed"),
    ({"rc": 5}, "exited 5"),  # pytest: nothing collected
    (None, "no report"),
])
def test_cuda_tests_that_did_not_pass_fail(tests, needle):
    out, rc = gc.verdict(bench(), tests)
    assert rc == 1 and any(needle in p for p in out["problems"])


def test_what_was_not_run_on_request_does_not_count():
    out, rc = gc.verdict(None, None, bench_wanted=False, tests_wanted=False)
    assert rc == 0 and out["cuda_tests"] == "not run (on request)"
    assert "recompute_ttft_s" not in out


def test_setup_only_says_so():
    out, rc = gc.verdict(None, None, setup_only=True, phases={"venv": 120})
    assert rc == 0 and out["gpu_check"] == "setup ok" and out["setup_only"] is True
    assert "outputs_identical" not in out


def test_a_failed_setup_phase_fails():
    out, rc = gc.verdict(None, None, failed_phase="venv", error="pip failed")
    assert rc == 1 and out["failed_phase"] == "venv" and out["problems"] == ["venv: pip failed"]


def test_first_divergence():
    assert gc.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert gc.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert gc.first_divergence([1, 2], [1, 2, 3]) == 2


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="5" time="9.0">
<testcase classname="clients.python.tests_vllm.test_engine" name="test_a[unix]" time="1"/>
<testcase classname="clients.python.tests_vllm.test_engine" name="test_b[unix]" time="1"><failure message="x">x</failure></testcase>
<testcase classname="clients.python.tests_vllm.test_engine" name="test_c[unix]" time="1"><error message="y">y</error></testcase>
<testcase classname="clients.python.tests_vllm.test_engine" name="test_d[unix]" time="1"><skipped message="z">z</skipped></testcase>
<testcase classname="clients.python.tests_vllm.test_engine" name="test_e[unix]" time="1"/>
</testsuite></testsuites>"""


def test_parse_junit(tmp_path):
    p = tmp_path / "j.xml"
    p.write_text(JUNIT)
    r = gc.parse_junit(str(p))
    assert (r["tests"], r["passed"], r["failures"], r["errors"], r["skipped"]) == (5, 2, 1, 1, 1)
    assert r["failed_tests"] == ["clients.python.tests_vllm.test_engine::test_b[unix]",
                                 "clients.python.tests_vllm.test_engine::test_c[unix]"]


def test_verdict_command_writes_the_line_to_out_dir(tmp_path, capsys):
    b = tmp_path / "bench.json"
    b.write_text(json.dumps(bench()))
    j = tmp_path / "j.xml"
    j.write_text(JUNIT.replace('errors="1" failures="1"', 'errors="0" failures="0"')
                 .replace("<failure message=\"x\">x</failure>", "").replace("<error message=\"y\">y</error>", ""))
    rc = gc.main(["verdict", "--bench", str(b), "--junit", str(j), "--tests-rc", "0",
                  "--tests-selection", "a\nb\n", "--phases", '{"go": 3}', "--out-dir", str(tmp_path / "out")])
    line = capsys.readouterr().out.strip()
    assert rc == 0, line
    written = (tmp_path / "out" / "gpu-check.json").read_text()
    assert written.strip() == line and "\n" not in line
    out = json.loads(line)
    assert out["cuda_tests"]["selection"] == ["a", "b"] and out["cuda_tests"]["passed"] == 4
    assert out["phase_s"] == {"go": 3}
    # the same with differing outputs: non-zero
    b.write_text(json.dumps(bench(native=result("native", 0.3, tokens=(1, 2, 3)))))
    assert gc.main(["verdict", "--bench", str(b), "--junit", str(j), "--tests-rc", "0"]) == 1


# -- the connector's CUDA tests ------------------------------------------------------


def test_select_cuda_tests(tmp_path):
    d = tmp_path / "clients" / "python" / "tests_vllm"
    d.mkdir(parents=True)
    (d / "test_a.py").write_text("# runs on a GPU with CUDA too, in prose only\n")
    (d / "conftest.py").write_text("needs_cuda = 1\n")
    assert gc.select_cuda_tests(str(d), str(tmp_path)) == gc.FALLBACK_TESTS
    (d / "test_b.py").write_text("import torch\npytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason='')\n")
    (d / "test_c.py").write_text("from conftest import needs_cuda\n")
    assert gc.select_cuda_tests(str(d), str(tmp_path)) == [
        "clients/python/tests_vllm/test_b.py", "clients/python/tests_vllm/test_c.py"]


def test_the_fallback_names_tests_that_exist():
    import re

    with open(os.path.join(REPO, gc.FALLBACK_TESTS[0])) as f:
        names = re.findall(r"^def (test_\w+)\(", f.read(), re.M)
    expr = gc.FALLBACK_TESTS[gc.FALLBACK_TESTS.index("-k") + 1]
    words = re.findall(r"\w+", expr.replace(" or ", " ").replace(" and ", " "))
    for word in words:
        if word != "unix":  # the daemon fixture's transport
            assert any(word in n for n in names), word


# -- the Go toolchain --------------------------------------------------------------------


def make_module_zip(path, prefix, files):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(prefix + name, data)


def test_zip_h1_is_gos_dirhash(tmp_path):
    # h1 computed by Go's golang.org/x/mod/sumdb/dirhash.HashZip on this zip
    p = tmp_path / "m.zip"
    make_module_zip(p, "example.com/m@v1.0.0/", {"go.mod": "module example.com/m\n",
                                                 "bin/tool": b"#!/bin/sh\necho hi\n", "a/b.txt": "b\n"})
    assert gc.zip_h1(str(p)) == "h1:soFdW/vrrvvEzIUVBZumaj0pzXuGZrpW5yJzwDI69Ck="


def fake_proxy(tmp_path, version="1.99.0"):
    name = f"go{version}.linux-{gc.go_arch()}"
    d = tmp_path / "proxy" / "golang.org" / "toolchain" / "@v"
    d.mkdir(parents=True)
    z = d / f"v0.0.1-{name}.zip"
    make_module_zip(z, f"golang.org/toolchain@v0.0.1-{name}/", {
        "bin/go": b"#!/bin/sh\necho go\n", "pkg/tool/x/compile": b"\x7fELF", "src/a.go": "package a\n",
        "go.env": "GOTOOLCHAIN=local\n"})
    return "file://" + str(tmp_path / "proxy"), gc.zip_h1(str(z))


def test_fetch_go_toolchain_checks_the_hash_and_makes_tools_executable(tmp_path):
    proxy, h1 = fake_proxy(tmp_path)
    root = gc.fetch_go_toolchain("1.99.0", str(tmp_path / "go"), proxy=proxy, expected=h1)
    assert root == str(tmp_path / "go" / "go1.99.0")
    assert os.stat(os.path.join(root, "bin", "go")).st_mode & stat.S_IXUSR
    assert os.stat(os.path.join(root, "pkg", "tool", "x", "compile")).st_mode & stat.S_IXUSR
    assert not os.stat(os.path.join(root, "src", "a.go")).st_mode & stat.S_IXUSR
    assert subprocess.run([os.path.join(root, "bin", "go")], capture_output=True, text=True).stdout == "go\n"
    # cached: not fetched again (the proxy could be gone)
    shutil.rmtree(tmp_path / "proxy")
    assert gc.fetch_go_toolchain("1.99.0", str(tmp_path / "go"), proxy=proxy, expected=h1) == root


def test_fetch_go_toolchain_refuses_a_wrong_hash(tmp_path):
    proxy, _ = fake_proxy(tmp_path)
    with pytest.raises(SystemExit) as e:
        gc.fetch_go_toolchain("1.99.0", str(tmp_path / "go"), proxy=proxy,
                              expected="h1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
    assert "refusing" in str(e.value)
    assert not os.path.exists(tmp_path / "go" / "go1.99.0")
    assert os.listdir(tmp_path / "go") == []  # no download left behind


def test_an_unpinned_toolchain_is_refused_without_a_hash(tmp_path, monkeypatch):
    monkeypatch.delenv("KVTIER_GO_TOOLCHAIN_SUM", raising=False)
    with pytest.raises(SystemExit) as e:
        gc.fetch_go_toolchain("1.99.0", str(tmp_path / "go"), proxy="file:///nowhere")
    assert "no pinned hash" in str(e.value)


def test_unpack_refuses_paths_out_of_the_root(tmp_path):
    z = tmp_path / "evil.zip"
    make_module_zip(z, "p/", {"../escape": "x"})
    with pytest.raises(SystemExit):
        gc.unpack_toolchain(str(z), "p/", str(tmp_path / "root"))


def test_the_pinned_toolchain_is_go_mods_version():
    with open(os.path.join(REPO, "go.mod")) as f:
        go_line = next(line for line in f if line.startswith("go "))
    assert go_line.split()[1] == gc.GO_VERSION
    assert f"go{gc.GO_VERSION}.linux-amd64" in gc.GO_TOOLCHAIN_SUMS
    with open(SCRIPT) as f:
        assert f"GO_VERSION={gc.GO_VERSION} " in f.read()


# -- the script ----------------------------------------------------------------------------


def test_script_parses():
    subprocess.run(["bash", "-n", SCRIPT], check=True)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_script_passes_shellcheck():
    subprocess.run(["shellcheck", "-x", SCRIPT], check=True)


def run_script(tmp_path, *args):
    env = dict(os.environ, KVTIER_GPU_CACHE=str(tmp_path / "cache"),
               KVTIER_VLLM_VENV=str(tmp_path / "venv"))
    env.pop("OUT", None)
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120)


def test_dry_run_prints_the_plan_and_installs_nothing(tmp_path):
    r = run_script(tmp_path, "--dry-run")
    assert r.returncode == 0, r.stderr
    plan_text, rest = r.stdout.split("\n# this machine\n", 1)
    p = json.loads(plan_text)
    assert p["sizes"]["block_bytes"] == 4 << 20
    assert "# commands" in rest and "vllm-env.sh 0.33" in rest and "-m pytest" in rest
    assert "venv:" in rest and "absent" in rest  # it looked, and says what it would do
    assert not os.path.exists(tmp_path / "cache") and not os.path.exists(tmp_path / "venv")


def test_dry_run_passes_knobs_through(tmp_path):
    r = run_script(tmp_path, "--dry-run", "--prefix-tokens", "8192", "--repeats=1", "--no-tests")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout.split("\n# this machine\n", 1)[0])
    assert p["sizes"]["prompt_tokens"] == 8192 + 16
    assert p["sizes"]["pool_slots"] == 2 * 257 + gc.SLOT_MARGIN
    assert "-m pytest" not in r.stdout.split("# commands", 1)[1]


def test_a_bad_knob_stops_before_anything_runs(tmp_path):
    r = run_script(tmp_path, "--dry-run", "--repeats", "0")
    assert r.returncode == 2 and "--repeats" in r.stderr
    r = run_script(tmp_path, "stray")
    assert r.returncode == 2 and "unknown argument" in r.stderr
    assert not os.path.exists(tmp_path / "cache")


# -- the bench's orchestration (engines stubbed) -------------------------------------


def bench_args(tmp_path, *extra):
    return gc.build_parser().parse_args([
        "bench", "--model", "m", "--kvtierd", "/bin/kvtierd", "--work", str(tmp_path / "work"),
        "--out", str(tmp_path / "bench.json"), "--mirror", str(tmp_path / "mirror"), *extra])


def test_the_daemon_module_loads_by_its_path_alone():
    """gpu_check runs where the packages may not be installed: the kvtierd
    launcher it loads by path must need nothing but the standard library."""
    d = gc._load_daemon_module()
    assert callable(d.kvtierd) and callable(d.kvtierd_binary)


def test_run_bench_runs_each_configuration_and_kvtier_under_its_own_kvtierd(tmp_path, monkeypatch):
    from contextlib import contextmanager

    calls, daemons = [], []

    def child(a, config, address, timeout):
        calls.append((config, address, timeout))
        with open(os.path.join(a.work, f"{config}.json"), "w") as f:
            f.write("{}")
        return result(config, 1.0)

    class FakeDaemon:
        @staticmethod
        @contextmanager
        def kvtierd(binary, block_bytes, slots, transport):
            daemons.append((binary, block_bytes, slots, transport))
            yield "unix:///tmp/k.sock"

    monkeypatch.setattr(gc, "_engine_child", child)
    monkeypatch.setattr(gc, "wait_gpu_idle", lambda: None)
    monkeypatch.setattr(gc, "_load_daemon_module", lambda: FakeDaemon)
    a = bench_args(tmp_path)
    out = gc.run_bench(a)
    assert [c for c, _, _ in calls] == ["recompute", "native", "kvtier"]
    assert calls[2][1] == "unix:///tmp/k.sock" and calls[0][1] is None
    assert all(t == a.engine_timeout_s for _, _, t in calls)
    s = gc.sizes(a)
    assert daemons == [("/bin/kvtierd", s["block_bytes"], s["pool_slots"], "unix")]
    assert set(out["results"]) == {"recompute", "native", "kvtier"}
    assert sorted(os.listdir(tmp_path / "mirror")) == ["kvtier.json", "native.json", "recompute.json"]
    assert gc.verdict(out, TESTS_OK)[1] == 0


def test_run_bench_starts_no_engine_it_has_no_time_for(tmp_path, monkeypatch):
    monkeypatch.setattr(gc, "_engine_child", lambda *a: pytest.fail("started an engine"))
    monkeypatch.setattr(gc, "wait_gpu_idle", lambda: None)
    out = gc.run_bench(bench_args(tmp_path, "--time-left-s", "30"))
    assert all("out of time" in r["error"] for r in out["results"].values())
    v, rc = gc.verdict(out, TESTS_OK)
    assert rc == 1 and v["outputs_identical"] is False


def test_tests_not_run_for_time_fail(tmp_path, capsys):
    rc = gc.main(["verdict", "--no-bench", "--tests-not-run", "out of time (--budget-s 570)"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["cuda_tests"]["not_run"].startswith("out of time")

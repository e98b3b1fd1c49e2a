"""The runtime packages stand apart from the benchmarks: no module of
kvtier_client, kvtier_vllm or kvtier_sglang imports kvtier_bench (an engine
never loads benchmark or harness code)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
RUNTIME = ("kvtier_client", "kvtier_vllm", "kvtier_sglang")


def imported_modules(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_runtime_never_imports_the_benchmarks():
    checked = 0
    for pkg in RUNTIME:
        for path in sorted((ROOT / pkg).glob("*.py")):
            checked += 1
            for mod in imported_modules(path):
                assert not mod.startswith("kvtier_bench"), f"{path.relative_to(ROOT)} imports {mod}"
            assert "bench" not in path.stem and "harness" not in path.stem, f"{path.name} belongs in kvtier_bench"
    assert checked >= 10

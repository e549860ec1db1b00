"""The benchmark scripts still import what they use from headscope.

Benchmarks run by hand, not in CI, so a refactor that removes a function they import breaks
them silently (issue 15's refactor did, to `benchmarks/syntax_trust.py`). Each script's
`from headscope... import name` and `import headscope...` statements are read from its source
(the scripts themselves load real models when run) and resolved here.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[2] / "benchmarks").glob("*.py"))


def _headscope_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every headscope import in the file (name None for `import module`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "headscope":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name.split(".")[0] == "headscope"]
    return found


def test_there_are_benchmarks_that_import_headscope():
    assert sum(bool(_headscope_imports(path)) for path in BENCHMARKS) >= 5


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_benchmark_imports_resolve(path):
    for module_name, name in _headscope_imports(path):
        module = importlib.import_module(module_name)
        if name is not None and name != "*":
            assert hasattr(module, name) or importlib.util.find_spec(f"{module_name}.{name}") is not None, (
                f"{path.name}: {module_name} has no {name}")

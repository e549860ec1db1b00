"""The test suite's own rules: no test module imports another (what tests share lives in
`tests/support/` or a conftest.py), and the browser tests find Playwright and Chromium in one
place (`tests/support/browser.py`), which skips them when either is missing unless
`HEADSCOPE_REQUIRE_BROWSER=1` says they must run."""
import ast
import re
from pathlib import Path

import pytest

from tests.support import browser

ROOT = Path(__file__).resolve().parents[2]
MISSING = "no system Chromium|playwright is not installed"  # whichever this machine lacks first


def _imported_modules(path: Path, root: Path) -> set[str]:
    """Every module `path` imports by name (`from a.b import c` gives a.b and a.b.c), relative
    imports resolved against its package under `root`."""
    package = path.relative_to(root).parent.parts
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else ()
            module = ".".join([*base, *([node.module] if node.module else [])])
            names |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return names


def imports_of_test_modules(root: Path) -> dict[str, list[str]]:
    """Each module under `root/tests` that imports a test module or a conftest, and what it imports."""
    found = {}
    for path in sorted((root / "tests").rglob("*.py")):
        tests = sorted(name for name in _imported_modules(path, root) if name.split(".")[0] == "tests"
                       and any(part.startswith("test_") or part == "conftest" for part in name.split(".")))
        if tests:
            found[path.relative_to(root).as_posix()] = tests
    return found


def test_no_test_module_imports_another():
    assert imports_of_test_modules(ROOT) == {}, "move what they share into tests/support/ or a conftest.py"


def test_the_check_sees_an_import_of_a_test_module(tmp_path):
    (tmp_path / "tests" / "kv").mkdir(parents=True)
    (tmp_path / "tests" / "kv" / "test_a.py").write_text(
        "from tests.kv.test_b import helper\nfrom . import test_c\nfrom .test_d import x\n"
        "import tests.support.tiny\nfrom tests.support import planted\n")
    assert imports_of_test_modules(tmp_path) == {"tests/kv/test_a.py": [
        "tests.kv.test_b", "tests.kv.test_b.helper", "tests.kv.test_c", "tests.kv.test_d", "tests.kv.test_d.x"]}


def _without_chromium(monkeypatch, required: str | None):
    monkeypatch.setattr(browser, "CHROMIUM", None)
    if required is None:
        monkeypatch.delenv(browser.REQUIRE, raising=False)
    else:
        monkeypatch.setenv(browser.REQUIRE, required)


@pytest.mark.parametrize("required", [None, "0"])
def test_a_missing_browser_skips_with_its_reason(monkeypatch, required):
    _without_chromium(monkeypatch, required)
    with pytest.raises(pytest.skip.Exception, match=MISSING):
        browser.playwright_api()
    with pytest.raises(pytest.skip.Exception, match=MISSING), browser.chromium():
        pass


def test_a_missing_browser_fails_where_it_is_required(monkeypatch):
    _without_chromium(monkeypatch, "1")
    with pytest.raises(pytest.fail.Exception, match=f"({MISSING}).*HEADSCOPE_REQUIRE_BROWSER=1"):
        browser.playwright_api()


def test_ci_requires_the_browser():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert f"export {browser.REQUIRE}=1" in ci.splitlines()


def test_the_support_modules_contributing_names_exist():
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    named = re.findall(r"^- `(\w+\.py)`: ", text.split("No test module imports another", 1)[1], re.M)
    assert named and all((ROOT / "tests" / "support" / name).is_file() for name in named), named

"""The test suite's own rules: the browser tests find Playwright and Chromium in one place
(`tests/support/browser.py`), which skips them when either is missing unless
`HEADSCOPE_REQUIRE_BROWSER=1` says they must run."""
from pathlib import Path

import pytest

from tests.support import browser

ROOT = Path(__file__).resolve().parents[2]
MISSING = "no system Chromium|playwright is not installed"  # whichever this machine lacks first


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

"""Pages in a real browser: Playwright driving the system Chromium (Debian's `chromium`; no
`playwright install`), the one place the browser tests find it.

- `CHROMIUM`: the system Chromium's path, or None; `ARGS`: the arguments it is launched with.
- `playwright_api()`: `playwright.sync_api`, once Playwright and Chromium are both found. When
  either is missing the test is skipped with the reason, unless `HEADSCOPE_REQUIRE_BROWSER=1`
  (`.ci/run` sets it), where it fails instead.
- `chromium()`: a context manager holding a launched browser, closed on the way out; the
  module-scoped fixture `browser` (tests/conftest.py) is one per test module.
- `open_page(browser, path, ready)`: a report page once `<html data-headscope>` is `ready`, and
  the list its console and page errors go to.
- `cell_position(page, fig_id, layer, head)`, `explorer_z(page)`: a heatmap cell's pixel centre
  and the head explorer's drawn pattern, for real mouse clicks on a report.
- `ARTIFACTS`: the folder the screenshots go to (`test-artifacts/`, ignored by git).
"""
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
REQUIRE = "HEADSCOPE_REQUIRE_BROWSER"


def _missing(reason: str):
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{reason}, and {REQUIRE}=1 says the browser tests must run", pytrace=False)
    pytest.skip(reason)


def playwright_api():
    """`playwright.sync_api`; skips the calling test (fails it under `HEADSCOPE_REQUIRE_BROWSER=1`)
    when Playwright or the system Chromium is missing."""
    try:
        import playwright.sync_api as api
    except ImportError:
        _missing("playwright is not installed (pip install playwright)")
    if CHROMIUM is None:
        _missing("no system Chromium (apt-get install -y chromium)")
    return api


@contextmanager
def chromium():
    """Headless Chromium launched through Playwright (skipped or failed as `playwright_api`)."""
    api = playwright_api()
    with api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser, path: Path, ready: str):
    """A page at `path` once `<html data-headscope>` is `ready`, and the list its errors go to."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
    page.on("pageerror", lambda err: errors.append(f"page error: {err}"))
    page.goto(path.as_uri())
    page.wait_for_function("(ready) => document.documentElement.dataset.headscope === ready", arg=ready, timeout=20_000)
    return page, errors


def cell_position(page, fig_id: str, layer: int, head: int) -> dict:
    """Viewport pixel centre of a heatmap cell, from the figure's own axis layout."""
    page.locator(f"#{fig_id}").scroll_into_view_if_needed()
    # Read the position once the figure has stopped moving: a click that opened a head may have
    # started a smooth scroll, and a position read mid-scroll puts the next click elsewhere.
    return page.evaluate(
        """async ([id, layer, head]) => {
            const gd = document.getElementById(id), fl = gd._fullLayout;
            const frame = () => new Promise(done => requestAnimationFrame(done));
            let top = NaN;
            for (let still = 0; still < 3; ) {
                await frame();
                const now = gd.getBoundingClientRect().top;
                still = now === top ? still + 1 : 0;
                top = now;
            }
            const box = gd.getBoundingClientRect();
            return {x: box.left + fl.xaxis._offset + fl.xaxis.l2p(head),
                    y: box.top + fl.yaxis._offset + fl.yaxis.l2p(layer)};
        }""",
        [fig_id, layer, head],
    )


def explorer_z(page) -> np.ndarray:
    """The pattern the head explorer draws, `[query, key]`."""
    return np.array(page.evaluate("document.getElementById('hs-explorer').data[0].z"), dtype=float)

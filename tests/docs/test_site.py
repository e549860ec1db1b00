"""The documentation site builds with `mkdocs build --strict` (a broken link, a missing page or a
name mkdocstrings cannot find fails it), and the built site opened from the file system in
Chromium requests nothing outside itself, logs no error, and searches offline.

Needs the docs packages (`pip install -e ".[docs]"`, also in the dev extra; skipped when missing,
except under CI) and, for the browser part, Playwright with the system Chromium (the `browser`
fixture: skipped when missing, a failure under `HEADSCOPE_REQUIRE_BROWSER=1`)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("index.html", "concepts.html", "reference/api.html", "reference/cli.html")


def _missing(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: CI must install it (.ci/run)", pytrace=False)
    pytest.skip(reason)


def build(site: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of `config` into `site`, with this checkout's headscope first on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, env=env, cwd=config.parent)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    try:
        import mkdocstrings  # noqa: F401 (the plugin the API pages need; mkdocs comes with it)
    except ImportError:
        _missing("the docs packages are not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site") / "site"
    result = build(out)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_the_site_builds_strictly_with_every_page(site):
    for page in PAGES:
        assert (site / page).is_file()
    assert (site / "search" / "search_index.js").is_file()  # the offline plugin's inlined index


def test_the_site_opened_as_files_loads_nothing_from_outside(browser, site):
    inside = site.resolve().as_uri() + "/"
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    requests, errors = [], []
    page.on("request", lambda request: requests.append(request.url))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda err: errors.append(str(err)))
    for name in PAGES:
        page.goto((site / name).as_uri())
        page.wait_for_load_state("load")
    page.click(".md-search__input")
    page.keyboard.type("control twin")
    page.wait_for_function("document.querySelectorAll('.md-search-result__item').length > 0", timeout=15_000)
    page.close()
    outside = [url for url in requests if not url.startswith(inside) and not url.startswith("data:")]
    assert outside == [] and errors == []

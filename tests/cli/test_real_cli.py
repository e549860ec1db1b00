"""`headscope analyze` end to end on the bundled SmolLM2-135M, and its report in Chromium (slow)."""
import pytest

from headscope.analysis import Analysis
from tests.support.browser import ARTIFACTS, chromium

pytestmark = pytest.mark.slow


def test_analyze_smollm2_end_to_end(golden_analyses):
    out, result = golden_analyses("smollm2-135m")  # `headscope analyze smollm2-135m` with its defaults, in a process
    assert result.returncode == 0, result.stderr[-3000:]
    analysis = Analysis.load(out)
    assert (analysis.n_layers, analysis.n_heads) == (30, 9)
    labels = set(analysis.labels.label)
    assert {"induction", "sink"} <= labels
    assert "smollm2-135m: 30 layers x 9 heads" in result.stdout
    page = out / "index.html"
    assert page.stat().st_size < 15 * 2**20
    with chromium() as browser:  # the browser half: skipped without Playwright and Chromium
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.goto(page.as_uri())
        tab.wait_for_function("document.documentElement.dataset.headscope === 'ready'", timeout=30_000)
        drawn = tab.evaluate("document.querySelectorAll('.js-plotly-plot .main-svg').length")
        ARTIFACTS.mkdir(exist_ok=True)
        tab.screenshot(path=str(ARTIFACTS / "smollm2-report.png"), full_page=True)
    assert errors == []
    assert drawn >= 8  # label map, 6 detector heatmaps, explorer

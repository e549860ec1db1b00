"""The report's geometry section in Chromium (Playwright, file://, plotly.js embedded): every
figure drawn without errors, and a real mouse click on a point of the MDS map, or on a cell of
the importance heatmap, opens that head in the explorer. Skips like `test_report_browser.py`
(a failure under `HEADSCOPE_REQUIRE_BROWSER=1`) when Playwright or Chromium is missing."""
import numpy as np
import pytest

from tests.support.geometry_fixture import fake_analysis_with_geometry
from headscope.report import figures, write_report
from headscope.report.geometry_figures import GEOMETRY_MAP_ID, IMPORTANCE_ID, PRUNING_ID
from tests.support.browser import ARTIFACTS, cell_position, explorer_z, open_page

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def geometry_browser_analysis(planted_geometry_result):
    return fake_analysis_with_geometry(planted_geometry_result[1], n_examples=2, seq_len=18)


@pytest.fixture(scope="module")
def geometry_page(browser, geometry_browser_analysis, tmp_path_factory):
    path = write_report(geometry_browser_analysis, tmp_path_factory.mktemp("geometry-browser") / "report")
    page, errors = open_page(browser, path, "ready")
    yield page, errors
    page.close()


def _point_positions(page) -> dict:
    """(layer, head) -> viewport pixel of each point of the MDS map, from the drawn figure."""
    page.locator(f"#{GEOMETRY_MAP_ID}").scroll_into_view_if_needed()
    rows = page.evaluate(
        """(id) => {
            const gd = document.getElementById(id), fl = gd._fullLayout, box = gd.getBoundingClientRect();
            return gd.data.flatMap(t => t.customdata.map((c, i) => [c[0], c[1],
                box.left + fl.xaxis._offset + fl.xaxis.l2p(t.x[i]), box.top + fl.yaxis._offset + fl.yaxis.l2p(t.y[i])]));
        }""", GEOMETRY_MAP_ID)
    return {(int(l), int(h)): (x, y) for l, h, x, y in rows}


def _wait_for_head(page, layer, head):
    page.wait_for_function("(want) => document.getElementById('hs-explorer').dataset.head === want",
                           arg=f"{layer},{head}", timeout=5_000)


def test_geometry_figures_are_drawn(geometry_page):
    page, errors = geometry_page
    ids = page.evaluate("Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => d.id)")
    assert {GEOMETRY_MAP_ID, IMPORTANCE_ID, PRUNING_ID} <= set(ids)
    drawn = page.evaluate("(ids) => ids.map(id => document.getElementById(id).querySelectorAll('svg.main-svg').length > 0)",
                          [GEOMETRY_MAP_ID, IMPORTANCE_ID, PRUNING_ID])
    assert drawn == [True, True, True]
    assert page.locator("#hs-error").inner_text() == "" and errors == []


def test_clicking_a_point_of_the_map_opens_the_head(geometry_page, geometry_browser_analysis):
    page, errors = geometry_page
    positions = _point_positions(page)
    assert sorted(positions) == [(layer, head) for layer in range(2) for head in range(4)]
    current = tuple(int(v) for v in page.evaluate("document.getElementById('hs-explorer').dataset.head").split(","))

    def clearance(h):  # pixels to the nearest other point: click one that stands alone
        return min(np.hypot(positions[h][0] - x, positions[h][1] - y) for k, (x, y) in positions.items() if k != h)

    target = max((h for h in positions if h != current), key=clearance)
    assert clearance(target) > 8
    x, y = positions[target]
    page.mouse.move(x, y)
    page.mouse.click(x, y)
    _wait_for_head(page, *target)
    assert page.inner_text("#hs-explorer-title").startswith(f"layer {target[0]} head {target[1]} ")
    np.testing.assert_allclose(explorer_z(page), geometry_browser_analysis.examples[0].pattern(*target), atol=1e-6)
    assert errors == []


def test_clicking_the_importance_heatmap_opens_the_head(geometry_page, geometry_browser_analysis):
    page, errors = geometry_page
    for layer, head in ((1, 2), (0, 3)):
        position = cell_position(page, IMPORTANCE_ID, layer, head)
        page.mouse.move(position["x"], position["y"])
        page.mouse.click(position["x"], position["y"])
        _wait_for_head(page, layer, head)
        np.testing.assert_allclose(explorer_z(page), geometry_browser_analysis.examples[0].pattern(layer, head), atol=1e-6)
    page.locator(f"#{GEOMETRY_MAP_ID}").scroll_into_view_if_needed()
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#geometry").screenshot(path=str(ARTIFACTS / "report-geometry.png"))
    assert errors == []

"""The report in a real browser (Playwright driving the system Chromium, file://, plotly.js
embedded): no errors, every figure drawn, and real mouse clicks on heatmap cells drive the head
explorer. Saves a screenshot to test-artifacts/report.png.

Needs `pip install playwright` and the Debian package `chromium` (no `playwright install`);
skipped when either is missing, a failure under `HEADSCOPE_REQUIRE_BROWSER=1` (tests/support/browser.py).
"""
import numpy as np
import pytest

from tests.support.browser import ARTIFACTS, cell_position, explorer_z, open_page
from tests.support.fake_analysis import fake_analysis
from headscope.report import write_report
from headscope.report import figures
from headscope.detectors.syntax.report import SYNTAX_ID

N_LAYERS, N_HEADS = 6, 5


@pytest.fixture(scope="module")
def browser_analysis():
    return fake_analysis(N_LAYERS, N_HEADS, seed=1, n_examples=3, seq_len=18)


@pytest.fixture(scope="module")
def browser_page(browser, browser_analysis, tmp_path_factory):
    """The report page after the explorer's first draw, and its console/page errors."""
    path = write_report(browser_analysis, tmp_path_factory.mktemp("browser") / "report")
    page, errors = open_page(browser, path, "ready")
    yield page, errors
    page.close()


def _click_cell(page, fig_id: str, layer: int, head: int) -> None:
    position = cell_position(page, fig_id, layer, head)
    page.mouse.move(position["x"], position["y"])
    page.mouse.click(position["x"], position["y"])
    page.wait_for_function(
        "(want) => document.getElementById('hs-explorer').dataset.head === want", arg=f"{layer},{head}", timeout=5_000)


def _label(analysis, layer: int, head: int) -> str:
    labels = analysis.labels
    return labels[(labels["layer"] == layer) & (labels["head"] == head)]["label"].iloc[0]


def test_page_loads_without_errors_and_draws_every_figure(browser_page, browser_analysis):
    page, errors = browser_page
    expected = 1 + len(browser_analysis.detectors) + 1 + 1  # label map, detectors, syntax, explorer
    assert page.locator(".js-plotly-plot").count() == expected
    drawn = page.evaluate("Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => d.querySelectorAll('svg.main-svg').length > 0)")
    assert drawn == [True] * expected
    ids = page.evaluate("Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => d.id)")
    assert figures.LABEL_MAP_ID in ids and figures.EXPLORER_ID in ids
    assert page.locator("#hs-error").inner_text() == ""
    assert errors == []


def test_clicking_the_label_map_opens_the_head(browser_page, browser_analysis):
    page, errors = browser_page
    before = page.inner_text("#hs-explorer-title")
    layer, head = N_LAYERS - 2, N_HEADS - 2
    assert not before.startswith(f"layer {layer} head {head} ")
    _click_cell(page, figures.LABEL_MAP_ID, layer, head)
    title = page.inner_text("#hs-explorer-title")
    assert title.startswith(f"layer {layer} head {head} — {_label(browser_analysis, layer, head)}")
    example = browser_analysis.examples[0]
    z = explorer_z(page)
    assert z.shape == (len(example.tokens),) * 2
    np.testing.assert_allclose(z, example.pattern(layer, head), atol=1e-6)
    # The tokens reach the axis as text, not markup.
    ticks = page.evaluate("document.getElementById('hs-explorer').layout.yaxis.ticktext")
    assert any("&lt;script&gt;" in t for t in ticks)
    assert page.locator("#hs-explorer text", has_text="<script>alert").count() >= 1
    assert errors == []


def test_detector_heatmap_click_and_example_select(browser_page, browser_analysis):
    page, errors = browser_page
    layer, head = 1, N_HEADS - 1
    _click_cell(page, figures.detector_id(2), layer, head)
    assert page.inner_text("#hs-explorer-title").startswith(f"layer {layer} head {head} ")
    page.locator("#hs-explorer").scroll_into_view_if_needed()
    page.select_option("#hs-example", "2")
    page.wait_for_function("document.getElementById('hs-explorer').dataset.example === '2'", timeout=5_000)
    np.testing.assert_allclose(explorer_z(page), browser_analysis.examples[2].pattern(layer, head), atol=1e-6)
    assert errors == []


def test_table_buttons_and_syntax_bars_open_heads(browser_page, browser_analysis):
    page, errors = browser_page
    top = browser_analysis.labels.sort_values("score").iloc[-1]
    button = page.locator(f'#top-heads button[data-layer="{top["layer"]}"][data-head="{top["head"]}"]')
    button.click()
    page.wait_for_function("(want) => document.getElementById('hs-explorer').dataset.head === want",
                           arg=f'{top["layer"]},{top["head"]}', timeout=5_000)
    best = browser_analysis.meta["syntax_best"][0]
    bar = page.locator(f"#{SYNTAX_ID} .trace.bars").first.locator(".point path").first
    bar.scroll_into_view_if_needed()
    box = bar.bounding_box()  # plotly's drag layer sits on top, so click the pixel, not the element
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function("(want) => document.getElementById('hs-explorer').dataset.head === want",
                           arg=f'{best["layer"]},{best["head"]}', timeout=5_000)
    assert page.inner_text("#hs-explorer-title").startswith(f'layer {best["layer"]} head {best["head"]} ')
    assert errors == []


def test_screenshot(browser_page):
    page, errors = browser_page
    _click_cell(page, figures.LABEL_MAP_ID, 2, 1)
    page.mouse.move(1, 1)  # no hover box over the label map
    page.evaluate("window.scrollTo(0, 0)")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000
    assert errors == []


def test_a_cross_attention_example_is_drawn_decoder_by_encoder(browser, tmp_path):
    """n decoder queries by m encoder keys, each axis labelled with its own tokens."""
    analysis = fake_analysis(N_LAYERS, N_HEADS, seed=1, n_examples=2, seq_len=10, key_len=40)
    page, errors = open_page(browser, write_report(analysis, tmp_path / "cross"), "ready")
    layer, head = 2, 3
    _click_cell(page, figures.LABEL_MAP_ID, layer, head)
    page.select_option("#hs-example", "1")
    page.wait_for_function("document.getElementById('hs-explorer').dataset.example === '1'", timeout=5_000)
    example = analysis.examples[1]
    np.testing.assert_allclose(explorer_z(page), example.pattern(layer, head), atol=1e-6)  # (10, 40)
    axes = page.evaluate("(() => { const l = document.getElementById('hs-explorer').layout;"
                         " return [l.xaxis.tickvals, l.xaxis.ticktext, l.yaxis.tickvals, l.yaxis.ticktext]; })()")
    assert axes[0] == list(range(0, 40, 2)) and axes[2] == list(range(10))  # at most ~32 labelled ticks per axis
    assert axes[1][2] == "Le" and axes[3][0] == "&lt;s&gt;"
    assert page.locator("#hs-explorer text", has_text="</script>").count() >= 1  # a key's nasty, as text
    page.close()
    assert errors == []


def test_compare_page_draws_every_figure(browser, tmp_path):
    from headscope.report import write_compare

    a = fake_analysis(N_LAYERS, N_HEADS, seed=1, n_examples=1)
    path = write_compare(a, fake_analysis(N_LAYERS, N_HEADS, seed=2, n_examples=1), tmp_path / "compare")
    page, errors = open_page(browser, path, "plotted")
    expected = 2 + len(a.detectors)  # two label maps, one difference map per detector
    drawn = page.evaluate("Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => d.querySelectorAll('svg.main-svg').length > 0)")
    page.close()
    assert drawn == [True] * expected and errors == []

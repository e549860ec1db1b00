"""The report's layout in Chromium: plotly's toolbar never covers a figure's title, the page
never scrolls sideways in a 1280 to 1400 pixel window, the header names no "None", and the list of
reports (`headscope report --index`) opens offline with working links both ways. Skips like
`test_report_browser.py` (a failure under `HEADSCOPE_REQUIRE_BROWSER=1`) when Playwright or Chromium
is missing."""
from pathlib import Path

import pytest

import headscope
from headscope.atomic import atomic_dir
from headscope.probes.kinds import TreebankProbe
from headscope.report import write_compare, write_report, write_report_into
from headscope.report.index import write_index
from tests.support.browser import open_page
from tests.support.fake_analysis import fake_analysis
from tests.support.treebanks import small_conllu

WIDTHS = (1280, 1340, 1400)


@pytest.fixture(scope="module")
def wide_page(browser, tmp_path_factory):
    """A 12-layer, 16-head analysis's report (a label map wider than the left column at 1280 px)."""
    analysis = fake_analysis(12, 16, seed=3, n_examples=2, seq_len=20)
    page, errors = open_page(browser, write_report(analysis, tmp_path_factory.mktemp("layout") / "report"), "ready")
    yield page, errors
    page.close()


def test_the_toolbar_never_covers_a_figures_title(wide_page):
    page, errors = wide_page
    titled = page.evaluate("Array.from(document.querySelectorAll('.js-plotly-plot')).filter(d => d.querySelector('.gtitle')"
                           " && d.querySelector('.gtitle').textContent).map(d => d.id)")
    assert len(titled) >= 7  # every detector heatmap
    for fig_id in titled:
        figure = page.locator(f"#{fig_id}")
        figure.scroll_into_view_if_needed()
        box = figure.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] - 30)  # hovering shows the toolbar
        page.wait_for_function("(id) => getComputedStyle(document.querySelector('#' + id + ' .modebar')).opacity === '1'",
                               arg=fig_id, timeout=5_000)
        title, bar = page.evaluate("""(id) => {
            const d = document.getElementById(id);
            const r = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
            return [r(d.querySelector('.gtitle')), r(d.querySelector('.modebar'))];
        }""", fig_id)
        overlap = min(title[2], bar[2]) > max(title[0], bar[0]) and min(title[3], bar[3]) > max(title[1], bar[1])
        assert not overlap, f"{fig_id}: toolbar {bar} covers title {title}"
    assert errors == []


def test_the_page_does_not_scroll_sideways(wide_page):
    page, errors = wide_page
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_function("(w) => document.documentElement.clientWidth <= w", arg=width)
        scroll, client = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert scroll <= client, f"the page is {scroll} px wide in a {client} px window"
    assert errors == []


def test_the_header_of_a_treebank_analysis_says_no_none(browser, planted, tmp_path):
    conllu = tmp_path / "small.conllu"
    conllu.write_text(small_conllu())
    analysis = headscope.analyze(planted, detectors=["syntactic"], probes=[TreebankProbe(str(conllu))],
                                 control=None, ov=False, explorer_examples=0)
    page, errors = open_page(browser, write_report(analysis, tmp_path / "report"), "ready")
    header = page.locator("header").inner_text()
    assert "None" not in header
    longest = analysis.meta["probes"]["treebank"]["max_tokens"]
    assert f"treebank: 30 examples of up to {longest} tokens" in header
    assert errors == []
    page.close()


def test_the_list_of_reports_opens_offline_and_links_both_ways(browser, tmp_path):
    root = tmp_path / "reports"
    a, b = fake_analysis(3, 4, seed=1, n_examples=1, seq_len=10), fake_analysis(3, 4, seed=2, n_examples=1, seq_len=10)
    for name, analysis in (("a", a), ("b", b)):
        with atomic_dir(root / name) as tmp:
            analysis.write_into(tmp)
            write_report_into(analysis, tmp)
    write_compare(a, b, root / "compare")
    index = write_index(root)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    requests, errors = [], []
    page.on("request", lambda request: requests.append(request.url))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(index.as_uri())
    links = page.eval_on_selector_all("table a", "els => els.map(e => e.href)")
    assert sorted(links) == sorted((root / name / "index.html").as_uri() for name in ("a", "b", "compare"))
    page.click("text=fake/tiny-3x4 vs fake/tiny-3x4")  # the comparison's title
    page.wait_for_function("document.documentElement.dataset.headscope === 'plotted'", timeout=20_000)
    assert page.url == (root / "compare" / "index.html").as_uri()
    page.click("nav.hs-index a")
    page.wait_for_url(index.as_uri())
    root_uri = root.as_uri() + "/"
    assert requests and all(url.startswith(root_uri) for url in requests), [u for u in requests if not u.startswith(root_uri)]
    assert errors == []
    page.close()

"""Notebook figures and rich display: the same numbers as the report, escaping, plotly.js once
per session, and (in Chromium, when installed) every figure drawn offline, in any output order."""
import base64
import copy
import json
import re
import sys
import zlib

import numpy as np
import pytest
import torch

from tests.support.fake_analysis import NASTY_TOKENS, fake_analysis
from headscope.report import notebook
from headscope.errors import HeadscopeError
from headscope.report.plotting import plot_head, plot_labels, plot_pattern, plot_scores, plot_syntax
from headscope.report import render_html, report_data
from headscope.report import figures
from headscope.detectors.syntax.report import syntax_figure
from headscope.detectors.syntax.standalone import SyntaxResult
from tests.support.pages import json_block

PLOTLYJS_MARK = "* plotly.js v"  # the bundle's banner comment


@pytest.fixture(scope="module")
def plotting_analysis():
    return fake_analysis(5, 4, seed=2, n_examples=3, seq_len=16)


@pytest.fixture(scope="module")
def plotting_report_data(plotting_analysis):
    return report_data(plotting_analysis)


@pytest.fixture(autouse=True)
def fresh_session():
    notebook.reset()  # every test starts as a fresh kernel: the next figure embeds plotly.js
    yield
    notebook.reset()


def _figure_blocks(page: str) -> list:
    """The figures of notebook HTML: the JSON of each `<script id="hs-nb-...-figure">`."""
    blocks = re.findall(r'<script type="application/json" id="hs-nb-[0-9a-f]+-figure">(.*?)</script>', page, re.S)
    return [json.loads(block) for block in blocks]


def _explorer_payload(analysis) -> dict:
    page = render_html(analysis)
    return json_block(page, "hs-explorer-data")


def _label_z(grid) -> list:
    count = len(grid.categories)
    return [[None if i < 0 else count - 1 - int(i) for i in row] for row in grid.index]


# --- figures: the report's numbers ------------------------------------------------------------

def test_plot_labels_is_the_report_label_map(plotting_analysis, plotting_report_data):
    fig = plotting_analysis.plot_labels()
    heatmap = fig.data[0]
    assert [list(row) for row in heatmap.z] == _label_z(plotting_report_data.label_grid)
    assert [list(row) for row in heatmap.customdata] == [list(row) for row in plotting_report_data.label_grid.hover]
    report = figures.label_map_figure(plotting_report_data.label_grid)
    assert heatmap.colorscale == report.data[0].colorscale
    assert list(heatmap.colorbar.ticktext) == list(report.data[0].colorbar.ticktext)
    assert fig.layout.title.text == plotting_analysis.meta["model"]
    assert plot_labels(plotting_analysis).to_plotly_json() == fig.to_plotly_json()


def test_plot_scores_is_the_report_detector_heatmap(plotting_analysis, plotting_report_data):
    for grid in plotting_report_data.detector_grids:
        heatmap = plotting_analysis.plot_scores(grid.detector).data[0]
        expected = [[None if np.isnan(v) else round(float(v), 4) for v in row] for row in grid.score]
        assert [list(row) for row in heatmap.z] == expected
        assert [list(row) for row in heatmap.customdata] == [list(row) for row in grid.hover]
    # and against the scores table itself
    row = plotting_analysis.scores[plotting_analysis.scores.detector == "induction"].iloc[5]
    z = plot_scores(plotting_analysis, "induction").data[0].z
    assert z[int(row.layer)][int(row["head"])] == pytest.approx(row.score, abs=1e-4)


def test_plot_scores_names_the_detectors_it_has(plotting_analysis):
    with pytest.raises(HeadscopeError, match="no scores for 'nope'.*induction"):
        plotting_analysis.plot_scores("nope")


def test_plot_head_is_the_report_explorer(plotting_analysis, plotting_report_data):
    payload = _explorer_payload(plotting_analysis)
    n_layers, n_heads = plotting_analysis.n_layers, plotting_analysis.n_heads
    for i, example in enumerate(plotting_analysis.examples):
        shown = payload["examples"][i]
        raw = np.frombuffer(zlib.decompress(base64.b64decode(shown["data"])), dtype=np.uint8)
        patterns = raw.reshape(n_layers, n_heads, shown["n"], shown["n"])  # what the page decodes
        fig = plotting_analysis.plot_head(3, 2, probe=example.probe, example=sum(e.probe == example.probe for e in plotting_analysis.examples[:i]))
        heatmap = fig.data[0]
        np.testing.assert_allclose(np.array(heatmap.z, dtype=float), patterns[3, 2] / 255.0, atol=1e-4)
        assert list(heatmap.x) == list(range(shown["n"])) == list(heatmap.y)
        assert heatmap.text[4][1] == f"query 4: {shown['tokens'][4]}<br>key 1: {shown['tokens'][1]}"
        ticks = list(fig.layout.xaxis.tickvals)
        assert list(fig.layout.xaxis.ticktext) == [shown["ticks"][t] for t in ticks] == list(fig.layout.yaxis.ticktext)
        assert fig.layout.yaxis.autorange == "reversed"  # query 0 on top, as in the explorer
    label = plotting_report_data.label_grid.labels[3][2]
    assert fig.layout.title.text.startswith(f"layer 3 head 2 — {label}")


def test_plot_head_default_is_the_first_stored_example(plotting_analysis):
    first = plotting_analysis.examples[0]
    z = np.array(plot_head(plotting_analysis, 1, 1).data[0].z, dtype=float)
    np.testing.assert_allclose(z, first.pattern(1, 1), atol=1e-4)
    assert plot_head(plotting_analysis, 1, 1).layout.title.text.endswith(f"{first.probe} #{first.index}")


def test_plot_head_errors_name_what_exists(plotting_analysis):
    with pytest.raises(HeadscopeError, match="no head 5.0"):
        plotting_analysis.plot_head(5, 0)
    with pytest.raises(HeadscopeError, match="no example 2 of probe repeated.*1 such.*repeated, text"):
        plotting_analysis.plot_head(0, 0, probe="repeated", example=2)
    with pytest.raises(HeadscopeError, match="probe syntax"):
        plotting_analysis.plot_head(0, 0, probe="syntax")


def test_tokens_are_escaped_for_plotly(plotting_analysis):
    fig = plotting_analysis.plot_head(0, 0)
    text = json.dumps(fig.to_plotly_json()["data"][0]["text"]) + json.dumps(list(fig.layout.xaxis.ticktext))
    for token in NASTY_TOKENS:
        if "<" in token:
            assert token not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_plot_syntax_from_analysis_and_from_run_syntax_result(plotting_analysis, plotting_report_data):
    import pandas as pd

    bars = plotting_analysis.plot_syntax().data
    report = syntax_figure(plotting_report_data.syntax_best)
    assert list(bars[0].y) == list(report.data[0].y) == [round(r.accuracy, 4) for r in plotting_report_data.syntax_best]
    assert list(bars[1].y) == [round(r.baseline_accuracy, 4) for r in plotting_report_data.syntax_best]
    result = SyntaxResult(table=plotting_analysis.syntax, best=pd.DataFrame(plotting_analysis.meta["syntax_best"]), head_scores=None)
    assert plot_syntax(result).to_plotly_json() == plotting_analysis.plot_syntax().to_plotly_json()
    with pytest.raises(HeadscopeError, match="no syntax scores"):
        fake_analysis(with_syntax=False).plot_syntax()


def test_plot_head_of_a_cross_attention_example_is_the_report_explorer():
    analysis = fake_analysis(n_examples=1, seq_len=9, key_len=12)
    shown = _explorer_payload(analysis)["examples"][0]
    fig = analysis.plot_head(1, 2)
    heatmap = fig.data[0]
    assert np.array(heatmap.z, dtype=float).shape == (9, 12)  # decoder queries on y, encoder keys on x
    np.testing.assert_allclose(np.array(heatmap.z, dtype=float), analysis.examples[0].pattern(1, 2), atol=1e-4)
    assert list(heatmap.y) == list(range(9)) and list(heatmap.x) == list(range(12))
    assert heatmap.text[3][7] == f"query 3: {shown['tokens'][3]}<br>key 7: {shown['keyTokens'][7]}"
    assert list(fig.layout.xaxis.ticktext) == [shown["keyTicks"][t] for t in fig.layout.xaxis.tickvals]
    assert list(fig.layout.yaxis.ticktext) == [shown["ticks"][t] for t in fig.layout.yaxis.tickvals]
    assert heatmap.text[0][3].endswith("key 3: &lt;script&gt;alert(1)&lt;/script&gt;")  # the keys' nasties, escaped
    assert fig.layout.xaxis.ticktext[3] == "&lt;script&gt;alert…"  # cut on the axis, as in the page


# --- plot_pattern: any captured map -------------------------------------------------------------

def test_plot_pattern_takes_tensors_and_arrays_of_both_shapes():
    maps = torch.softmax(torch.randn(3, 5, 5), dim=-1)  # [head, query, key]
    tokens = ["a", " b", "c\n", "<d>", ""]
    by_head = plot_pattern(maps.to(torch.bfloat16), tokens, head=1)
    from_array = plot_pattern(maps[1].numpy(), tokens)
    np.testing.assert_allclose(np.array(from_array.data[0].z, dtype=float), maps[1].numpy(), atol=1e-4)
    np.testing.assert_allclose(np.array(by_head.data[0].z, dtype=float), maps[1].numpy(), atol=1e-2)  # bfloat16
    assert list(from_array.layout.xaxis.ticktext) == ["a", "␣b", "c\\n", "&lt;d&gt;", "∅"]
    assert plot_pattern(maps[0], tokens, title="<b>mine</b>").layout.title.text == "&lt;b&gt;mine&lt;/b&gt;"


def test_plot_pattern_of_a_cross_attention_map_labels_each_axis_with_its_tokens():
    cross = torch.softmax(torch.randn(2, 3, 4), dim=-1)  # [head, decoder query, encoder key]
    fig = plot_pattern(cross, ["<s>", "a", "b"], head=1, key_tokens=["a", "b", "<c>", "</s>"])
    np.testing.assert_allclose(np.array(fig.data[0].z, dtype=float), cross[1].numpy(), atol=1e-4)
    assert list(fig.layout.yaxis.ticktext) == ["&lt;s&gt;", "a", "b"]
    assert list(fig.layout.xaxis.ticktext) == ["a", "b", "&lt;c&gt;", "&lt;/s&gt;"]
    with pytest.raises(HeadscopeError, match=r"shape \(3, 4\) does not fit 3 query and 3 key tokens"):
        plot_pattern(cross[0], ["<s>", "a", "b"], key_tokens=["a", "b", "c"])


@pytest.mark.parametrize("args, kwargs, message", [
    ((torch.rand(3, 5, 5), list("abcde")), {}, r"\[head, query, key\]: pass head="),
    ((torch.rand(3, 5, 5), list("abcde")), {"head": 3}, "head 3 is out of range"),
    ((torch.rand(2, 3, 5, 5), list("abcde")), {}, r"index the batch first"),
    ((torch.rand(5, 5), list("abcd")), {}, "does not fit 4 tokens"),
    ((torch.rand(5, 5), list("abcde")), {"head": 0}, "head= needs"),
])
def test_plot_pattern_rejects_what_does_not_fit(args, kwargs, message):
    with pytest.raises(HeadscopeError, match=message):
        plot_pattern(*args, **kwargs)


def test_plot_pattern_of_a_captured_planted_head(planted):
    """Ground truth: the planted previous-token head 0.0 puts each row's peak one key back."""
    import headscope

    model, tokenizer = planted.model, planted.tokenizer
    text = "heads attend"
    ids = tokenizer(text, return_tensors="pt").input_ids
    with headscope.capture(model, layers=[0]) as cap, torch.no_grad():
        model(input_ids=ids)
    tokens = [tokenizer.decode([t]) for t in ids[0].tolist()]
    z = np.array(plot_pattern(cap.patterns[0][0], tokens, head=0).data[0].z, dtype=float)
    assert list(z.argmax(axis=1)[1:]) == list(range(len(tokens) - 1))
    assert list(plot_pattern(cap.patterns[0][0], tokens, head=0).layout.xaxis.ticktext) == [
        "␣" if c == " " else c for c in text]


# --- rich display -------------------------------------------------------------------------------

def test_repr_html_holds_summary_and_label_map(plotting_analysis, plotting_report_data):
    page = plotting_analysis._repr_html_()
    blocks = _figure_blocks(page)
    assert len(blocks) == 1
    label_map = blocks[0]["data"][0]
    assert label_map["z"] == _label_z(plotting_report_data.label_grid)
    assert label_map["customdata"][1][2] == plotting_report_data.label_grid.hover[1][2]
    assert "layer 1 head 2" in label_map["customdata"][1][2]
    assert f"<code>{plotting_analysis.meta['model']}</code>" in page
    assert f"{plotting_analysis.n_layers} layers × {plotting_analysis.n_heads} heads" in page
    for label in plotting_report_data.label_grid.categories:
        count = sum(row.count(label) for row in plotting_report_data.label_grid.labels)
        assert re.search(rf"</span>{re.escape(label)}</td><td class=\"num\">{count}</td>", page), label
    top = plotting_report_data.top_heads[0]
    assert f"<td>{top.quantity}</td><td>L{top.layer} H{top.head} {top.score:.3f} (control {top.control:.3f})" in page
    assert "<b>Warning:</b>" not in page
    warned = fake_analysis(control=False)._repr_html_()
    assert "<b>Warning:</b> No control model (none was asked for)" in warned and "(control " not in warned


def test_plotlyjs_is_embedded_once_per_session(plotting_analysis, monkeypatch):
    first, second = plotting_analysis._repr_html_(), plotting_analysis._repr_html_()
    assert first.count(PLOTLYJS_MARK) == 1 and PLOTLYJS_MARK not in second
    assert "<script src" not in first + second  # offline: nothing loaded from elsewhere
    ids = re.findall(r'<div id="(hs-nb-[0-9a-f]+)"', first + second)
    assert len(set(ids)) == 2  # two displays of one analysis never share a div id
    notebook.reset()
    assert PLOTLYJS_MARK in plotting_analysis._repr_html_()
    monkeypatch.setitem(sys.modules, "google.colab", object())  # Colab: one frame per output
    assert PLOTLYJS_MARK in plotting_analysis._repr_html_() and PLOTLYJS_MARK in plotting_analysis._repr_html_()


def test_display_escapes_text_from_the_analysis(plotting_analysis):
    nasty = copy.copy(plotting_analysis)
    nasty.meta = dict(plotting_analysis.meta, model="</script><script>alert(1)</script>", family="<b>&")
    page = nasty._repr_html_()
    assert "<script>alert(1)" not in page and "<b>&" not in page
    assert "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert _figure_blocks(page)[0]["layout"]["title"]["text"] == "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;"


def test_repr_is_one_line(plotting_analysis):
    text = repr(plotting_analysis)
    assert "\n" not in text and text.startswith(f"Analysis(model={plotting_analysis.meta['model']!r}, 5 layers x 4 heads")
    counts = plotting_analysis.labels["label"].value_counts()
    assert f"{counts.index[0]}: {counts.iloc[0]}" in text


# --- in a browser -------------------------------------------------------------------------------

def test_figures_draw_offline_in_any_output_order(browser, plotting_analysis, tmp_path):
    """Outputs as nbconvert lays them out, with the output that carries plotly.js last."""
    first, second = plotting_analysis._repr_html_(), plotting_analysis._repr_html_()  # first embeds plotly.js
    page_file = tmp_path / "outputs.html"
    page_file.write_text(f"<!DOCTYPE html><html><body><div>{second}</div><div>{first}</div></body></html>", encoding="utf-8")
    page = browser.new_page()
    errors, requests = [], []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("request", lambda req: requests.append(req.url) if not req.url.startswith(("file:", "data:")) else None)
    page.goto(page_file.as_uri())
    page.wait_for_function("document.querySelectorAll('div.headscope-figure.js-plotly-plot').length === 2", timeout=20_000)
    cells = page.evaluate("Array.from(document.querySelectorAll('div.headscope-figure')).map("
                          "d => d._fullData[0].z.flat().filter(v => v !== null).length)")
    page.close()
    assert errors == [] and requests == []
    assert cells == [plotting_analysis.n_layers * plotting_analysis.n_heads] * 2

"""A new detector defined in this file alone reaches every part of headscope.

`two_back` ("attends two tokens back") is a template detector: `headscope.detector(name,
template=fn, ...)`, where `fn(tokens) -> [query, key]` is the ideal pattern. Nothing outside
this file names it, yet it is scored by `analyze`, labels heads, shows in the HTML report, the
notebook display and `headscope detectors`, runs from `headscope analyze --detectors
tests.detectors.test_custom_detector:two_back` and is checked by `validate`. The planted
one-layer model (tests/support/planted_positions.py) has one head that attends two tokens back (0.0) and a
previous-token head (0.2).
"""
import pytest
import torch
from typer.testing import CliRunner

import headscope
from headscope.cli import app
from headscope.probes.kinds import TextProbe
from headscope.report import render_html, report_data


def two_tokens_back(tokens: torch.Tensor) -> torch.Tensor:
    """`[query, key]`: query i should attend to key i - 2."""
    n = tokens.shape[0]
    return torch.ones(n, n, dtype=torch.bool).tril(-2) & ~torch.ones(n, n, dtype=torch.bool).tril(-3)


two_back = headscope.detector("two_back", template=two_tokens_back, probe="text", threshold=0.5,
                              source="this test (two tokens back)", opt_in=True)
PROBES = [TextProbe(n_examples=6, seq_len=40)]


@pytest.fixture(scope="module")
def planted_positions_path(planted_positions_dir):
    return str(planted_positions_dir)


@pytest.fixture(scope="module")
def planted_positions_copy(planted_positions_path):
    return headscope.load(planted_positions_path, device="cpu")


@pytest.fixture(scope="module")
def two_back_analysis(planted_positions_copy):
    return headscope.analyze(planted_positions_copy, detectors=["previous_token", "two_back"], probes=PROBES, explorer_examples=1)


def test_template_score_is_the_mass_on_the_template():
    # One head puts 0.7 two back and 0.3 on itself; queries 0 and 1 have no key two back.
    t = 6
    pattern = torch.zeros(1, 1, t, t)
    pattern[0, 0, 0, 0] = pattern[0, 0, 1, 1] = 1.0
    for i in range(2, t):
        pattern[0, 0, i, i - 2], pattern[0, 0, i, i] = 0.7, 0.3
    batch = headscope.probes.base.ProbeBatch(torch.arange(t)[None], torch.ones(1, t, dtype=torch.bool), True)
    assert two_back(pattern, batch).item() == pytest.approx(0.7)
    assert two_back.lazy and two_back.probe == "text" and "template" in two_back.formula


def test_analyze_scores_and_labels_it(two_back_analysis):
    scores = two_back_analysis.scores.set_index(["layer", "head", "detector"]).score
    assert scores[(0, 0, "two_back")] > 0.99 and scores[(0, 2, "two_back")] < 0.1
    labels = two_back_analysis.labels.set_index("head").label
    assert labels[0] == "two_back" and labels[2] == "previous_token"
    assert two_back_analysis.meta["detectors"]["two_back"]["source"] == "this test (two tokens back)"
    assert two_back_analysis.meta["probes"]["text"]["patterns"] == "lazy"  # the template reads entries only


def test_report_and_notebook_show_it(two_back_analysis):
    data = report_data(two_back_analysis)
    assert "two_back" in data.label_grid.categories
    assert [m.formula for m in data.methods if m.detector == "two_back"] == [two_back.formula]
    assert [(t.layer, t.head) for t in data.top_heads if t.label == "two_back"] == [(0, 0)]
    assert "two_back" in render_html(two_back_analysis, plotlyjs="cdn")
    notebook = two_back_analysis._repr_html_()
    assert "two_back" in notebook and "L0 H0" in notebook


def test_cli_lists_it_and_analyze_finds_it_by_module(planted_positions_path, tmp_path):
    listed = CliRunner().invoke(app, ["detectors"])
    assert listed.exit_code == 0 and "two_back" in listed.output and two_back.formula in listed.output
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["analyze", planted_positions_path, "--out", str(out), "--device", "cpu", "--control", "none",
                                      "--detectors", "tests.detectors.test_custom_detector:two_back,previous_token",
                                      "--n-examples", "4", "--seq-len", "40"])
    assert result.exit_code == 0, result.output
    labels = headscope.Analysis.load(out).labels.set_index("head").label
    assert labels[0] == "two_back"
    bad = CliRunner().invoke(app, ["analyze", planted_positions_path, "--out", str(tmp_path / "bad"), "--detectors",
                                   "tests.detectors.test_custom_detector:two_tokens_back"])
    assert bad.exit_code == 1 and "is not a detector" in bad.output


def test_validate_checks_it_on_its_probe(planted_positions_copy, two_back_analysis):
    frame = headscope.validate(planted_positions_copy, two_back_analysis, labels=["two_back"], n_examples=2, n_random=2, probes=PROBES)
    rows = frame[frame.label == "two_back"]
    assert set(rows["mode"]) == {"zero", "mean"} and set(rows["probe"]) == {"text"}
    assert set(rows["heads"]) == {"0.0"} and rows["baseline"].notna().all() and rows["delta"].notna().all()

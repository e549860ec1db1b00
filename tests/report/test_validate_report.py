"""The report's "What breaks when these heads are removed" section: its data, figure and table."""
import copy
import json
import math
import re

import pandas as pd
import pytest

from tests.support.fake_analysis import fake_analysis
from headscope.report import render_html, report_data
from headscope.report import figures
from headscope.causal import COLUMNS, read_csv, write_csv
from tests.support.pages import json_block

NAN = float("nan")


def _row(label, mode, primary, heads, delta, random, metric="next_token_loss", draws="2.0|2.2"):
    random_mean = sum(random) / len(random) if random else NAN
    return {
        "label": label, "mode": mode, "primary": primary, "metric": metric, "probe": "text", "heads": heads,
        "n_heads": len(heads.split(";")), "baseline": 3.0, "ablated": 3.0 + delta, "delta": delta,
        "baseline_accuracy": 0.5 if metric == "next_token_loss" else NAN,
        "ablated_accuracy": 0.25 if metric == "next_token_loss" else NAN,
        "random_deltas": ";".join(repr(d) for d in random), "random_mean": random_mean,
        "random_max": max(random) if random else NAN,
        "ratio": delta / random_mean if random else NAN,
        "hurts_more": bool(random) and delta > max(random), "random_heads": draws if random else "",
    }


def _validation() -> pd.DataFrame:
    rows = [
        _row("induction", "zero", False, "2.1;3.0", 1.5, [0.1, 0.2]),
        _row("induction", "mean", True, "2.1;3.0", 1.25, [0.05, 0.3]),
        _row("icl_score", "zero", False, "2.1;3.0", 0.4, [0.0, 0.1], metric="icl_score"),
        _row("icl_score", "mean", True, "2.1;3.0", 0.3, [0.02, 0.01], metric="icl_score"),
        _row("syntactic:<b>obj", "mean", True, "1.2", 0.01, [0.05, 0.02]),
        _row("sink", "mean", True, "0.0;0.1;0.2", 0.2, []),  # no control: a layer had no other heads
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


@pytest.fixture(scope="module")
def analysis_with_checks():
    with_checks = copy.copy(fake_analysis())
    with_checks.validation = _validation()
    return with_checks


def _figures(page):
    block = re.search(r'<script type="application/json" id="hs-figures">(.*?)</script>', page, re.S).group(1)
    return dict((fig_id, fig) for fig_id, fig in json.loads(block))


def test_validation_rows_follow_the_frame(analysis_with_checks):
    rows = report_data(analysis_with_checks).validation
    frame = analysis_with_checks.validation
    assert [r.label for r in rows] == list(frame["label"]) and [r.mode for r in rows] == list(frame["mode"])
    first = rows[0]
    assert first.heads == ((2, 1), (3, 0)) and first.random_deltas == (0.1, 0.2) and not first.primary
    assert first.delta == 1.5 and first.baseline_accuracy == 0.5 and first.hurts_more
    assert rows[1].primary and rows[5].random_deltas == () and not rows[5].hurts_more and math.isnan(rows[5].ratio)
    assert math.isnan(rows[2].baseline_accuracy)


def test_validation_rows_survive_a_csv_round_trip(analysis_with_checks, tmp_path):
    write_csv(analysis_with_checks.validation, tmp_path / "validation.csv")
    again = copy.copy(analysis_with_checks)
    again.validation = read_csv(tmp_path / "validation.csv")
    before, after = report_data(analysis_with_checks).validation, report_data(again).validation
    assert len(before) == len(after)
    for a, b in zip(before, after):
        for name, value in a._asdict().items():
            if isinstance(value, float):
                assert getattr(b, name) == pytest.approx(value, nan_ok=True), name
            else:
                assert getattr(b, name) == value, name


def test_no_validation_no_section():
    plain = fake_analysis()
    assert report_data(plain).validation is None
    page = render_html(plain, plotlyjs="cdn")
    assert '<section id="validation">' not in page and figures.VALIDATION_ID not in page
    unset = copy.copy(plain)
    unset.validation = None
    assert report_data(unset).validation is None


def test_section_figure_and_table(analysis_with_checks):
    page = render_html(analysis_with_checks, plotlyjs="cdn")
    assert page.count('<section id="validation">') == 1 and "What breaks when these heads are removed" in page
    assert page.count(f'<div id="{figures.VALIDATION_ID}" class="figure">') == 1
    figs = _figures(page)
    ids = list(figs)
    assert ids.index(figures.VALIDATION_ID) == ids.index(figures.EXPLORER_ID) - 1
    explorer = json_block(page, "hs-explorer-data")
    assert figures.VALIDATION_ID not in explorer["clickable"]
    bars, draws = figs[figures.VALIDATION_ID]["data"]
    primary = [r for r in report_data(analysis_with_checks).validation if r.primary]  # the chart shows mean ablation only
    assert bars["y"] == [r.delta for r in primary] and len(bars["x"]) == 4
    assert draws["y"] == [0.05, 0.3, 0.02, 0.01, 0.05, 0.02]
    assert "syntactic:&lt;b&gt;obj" in bars["x"] and "<b>obj" not in page
    section = page[page.index('<section id="validation">'):page.index('<section id="method">')]
    assert section.count('data-layer="2" data-head="1"') == 4  # a head button in every induction/icl row
    assert "no control" in section and "7.1×" in section and "10.0×" in section  # 1.25 / 0.175, 1.5 / 0.15
    assert "<b>mean</b>" in section and "0.500 → 0.250" in section

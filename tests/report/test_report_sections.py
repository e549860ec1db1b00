"""A detector brings its own report section (`Detector.report`) and OV qualification
(`Detector.ov_qualified`); the report code names neither.

`rare_pairs` below is defined in this file alone, with a `ReportSection` that reads its own
table: its data, figure, HTML, header line, warning and summary line reach the page, the
notebook display and `report_data` without any change to headscope/report/.
"""
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import pytest

from tests.support.fake_analysis import fake_analysis
from headscope.detectors import REGISTRY, Detector, register
from headscope.detectors.labels import ov_qualified_labels, ov_qualifier
from headscope.detectors.section import ReportSection, analysis_table, figure_style
from headscope.errors import HeadscopeError
from headscope.report import render_html, report_data
from headscope.report.notebook import analysis_html
from headscope.cli.analysis import _summary
from headscope.report.plotting import plot_section

FIGURE_ID = "hs-rare-pairs"


class PairsData(NamedTuple):
    pair_rows: tuple  # (layer, head, pair)
    pair_note: str


class PairsSection(ReportSection):
    def data(self, analysis):
        table = analysis_table(analysis, "pairs")
        rows = () if table is None else tuple((int(r.layer), int(r.head), str(r.pair)) for r in table.itertuples())
        return PairsData(rows, str(analysis.meta.get("pairs_note", "")))

    def figures(self, data):
        import plotly.graph_objects as go

        if not data.pair_rows:
            return []
        fig = go.Figure(go.Bar(x=[p for _, _, p in data.pair_rows], y=[1] * len(data.pair_rows),
                               customdata=[[l, h] for l, h, _ in data.pair_rows]))
        fig.update_layout(**figure_style())
        return [(FIGURE_ID, fig)]

    def html(self, data, kit):
        if not data.pair_rows:
            return ""
        return ("<section id=\"rare-pairs\"><h2>Rare pairs</h2>" + kit.figure_div(FIGURE_ID)
                + kit.table(["head", "pair"], [[kit.head_button(l, h), p] for l, h, p in data.pair_rows]) + "</section>")

    def header(self, meta):
        return [("Pairs", meta["pairs_note"])] if "pairs_note" in meta else []

    def warnings(self, meta):
        return ["rare pairs: too few pairs"] if meta.get("pairs_note") == "few" else []

    def summary(self, data):
        return [f"rare pairs: {len(data.pair_rows)} heads"] if data.pair_rows else []

    def plot(self, source):
        figs = self.figures(self.data(source))
        if not figs:
            raise HeadscopeError("no rare pairs in this analysis")
        return figs[0][1]


@pytest.fixture
def rare_pairs():
    detector = register(Detector(name="rare_pairs", probe="text", threshold=0.5, formula="test", source="this test",
                                 fn=lambda pattern, batch: None, opt_in=True, ov_qualified=True,
                                 report=PairsSection()))
    yield detector
    del REGISTRY["rare_pairs"]


def _with_pairs(analysis, note="few"):
    analysis.add_table("pairs", pd.DataFrame({"layer": [0, 1], "head": [2, 0], "pair": ["<b>a&b", "cd"]}))
    analysis.meta["pairs_note"] = note
    analysis.meta["detectors"]["rare_pairs"] = dict(REGISTRY["rare_pairs"].describe(), colour=None)
    return analysis


def test_a_detectors_section_reaches_data_page_notebook_and_cli_summary(rare_pairs, capsys):
    analysis = _with_pairs(fake_analysis())
    data = report_data(analysis)
    section = [s for s in data.sections if s.detector == "rare_pairs"]
    assert len(section) == 1 and data.pair_rows == ((0, 2, "<b>a&b"), (1, 0, "cd")) and data.pair_note == "few"
    assert [s.detector for s in data.sections] == ["syntactic", "rare_pairs"]  # meta["detectors"] order
    assert ("Pairs", "few") in [(f.name, f.value) for f in data.header]
    assert "rare pairs: too few pairs" in data.warnings
    page = render_html(analysis, plotlyjs="cdn")
    assert '<section id="rare-pairs">' in page and page.count(f'<div id="{FIGURE_ID}" class="figure">') == 1
    assert "&lt;b&gt;a&amp;b" in page and "<b>a&b" not in page  # token text escaped by the kit's table
    assert page.index('<section id="rare-pairs">') < page.index('<section id="method">')
    notebook = analysis_html(analysis)
    assert "rare pairs: 2 heads" in notebook and "rare pairs: too few pairs" in notebook
    _summary(analysis, Path("out"))
    printed = capsys.readouterr().out
    assert "rare pairs: 2 heads" in printed and "warning: rare pairs: too few pairs" in printed
    assert list(plot_section(analysis, "rare_pairs").data[0].customdata[0]) == [0, 2]
    with pytest.raises(HeadscopeError, match="no report section"):
        plot_section(analysis, "previous_token")


def test_a_section_without_its_table_adds_nothing(rare_pairs):
    plain = fake_analysis()
    data = report_data(plain)
    assert data.pair_rows == () and not [f for f in data.header if f.name == "Pairs"]
    assert '<section id="rare-pairs">' not in render_html(plain, plotlyjs="cdn")
    with pytest.raises(AttributeError):
        data.no_such_field


def test_ov_qualifier_follows_the_detector_attribute(rare_pairs):
    assert set(ov_qualified_labels()) == {"induction", "duplicate_token", "rare_pairs"}
    assert ov_qualifier("rare_pairs", 0.95) == "copies" and ov_qualifier("previous_token", 0.95) == ""
    # an analysis's recorded spec wins over the registered detector; older ones fall back to it
    meta = {"detectors": {"induction": {"ov_qualified": False}, "previous_token": {"ov_qualified": True}}}
    assert ov_qualified_labels(meta) == ("previous_token", "duplicate_token", "rare_pairs")
    assert ov_qualifier("induction", 0.95, qualified=ov_qualified_labels(meta)) == ""


def test_report_ov_rows_read_the_recorded_attribute():
    analysis = fake_analysis()
    rows = [{"layer": l, "head": h, "positive_eig_share": 0.95, "copy_top1": 0.5, "control_positive_eig_share": 0.3}
            for l in range(analysis.n_layers) for h in range(analysis.n_heads)]
    analysis.add_table("ov", pd.DataFrame(rows))
    analysis.meta["ov"] = {"n_tokens": 512, "fold_norms": True, "copies_share": 0.9, "skipped": None}
    before = report_data(analysis)
    assert {r.label for r in before.ov} == {"induction", "duplicate_token"}
    assert before.ov_labels == "induction and duplicate-token"
    analysis.meta["detectors"]["previous_token"]["ov_qualified"] = True
    analysis.meta["detectors"]["induction"]["ov_qualified"] = False
    after = report_data(analysis)
    assert {r.label for r in after.ov} == {"previous_token", "duplicate_token"}
    assert after.ov_labels == "previous-token and duplicate-token"
    assert all(np.isclose(r.positive_eig_share, 0.95) for r in after.ov)

"""A small hand-annotated treebank degrades instead of failing: 30 sentences give no relation
the 30 arcs per half the held-out significance rule needs, so no head is labelled syntactic,
but every head's accuracies and baselines are in `Analysis.syntax`, survive save and load, and
the report's syntax notes say why there is no label. The sentences are
`tests/support/treebanks.py`'s `small_conllu`."""
import math

import pytest

import headscope
from headscope.probes.kinds import TextProbe, TreebankProbe
from headscope.report import render_html, report_data
from headscope.report.method import report_warnings
from tests.support.treebanks import small_conllu

@pytest.fixture(scope="module")
def small_analysis(planted, tmp_path_factory):
    path = tmp_path_factory.mktemp("treebank") / "small.conllu"
    path.write_text(small_conllu())
    return headscope.analyze(planted, detectors=["previous_token", "syntactic"], probes=[TreebankProbe(str(path)), TextProbe(n_examples=4, seq_len=24)],
                             control=None, ov=False, explorer_examples=1)


def test_the_accuracies_and_baselines_are_kept(small_analysis, planted):
    table = small_analysis.syntax
    assert set(table.relation) == {"det", "nsubj", "obj"}
    assert len(table.drop_duplicates(["layer", "head"])) == planted.n_layers * planted.n_heads
    assert table.accuracy.between(0, 1).all() and table.baseline.between(0, 1).all()
    assert table.held_out_margin.isna().all() and not table.significant.any()
    assert (table.n < 60).all()  # 30 sentences: at most 30 arcs of a relation in all


def test_no_head_is_labelled_and_the_note_says_why(small_analysis):
    syntactic = small_analysis.scores[small_analysis.scores.detector == "syntactic"]
    assert len(syntactic) == len(small_analysis.labels) and syntactic.score.isna().all()
    assert not small_analysis.labels.label.str.startswith("syntactic").any()
    notes = small_analysis.meta["syntax_notes"]
    assert any("no relation has the 30 arcs in each half of the 30 sentences" in note and
               "no head is labelled syntactic" in note for note in notes), notes
    assert small_analysis.scores[small_analysis.scores.detector == "previous_token"].score.notna().all()


def test_it_survives_save_load_and_the_report(small_analysis, tmp_path):
    small_analysis.save(tmp_path / "small")
    loaded = headscope.Analysis.load(tmp_path / "small")
    assert len(loaded.syntax) == len(small_analysis.syntax)
    data = report_data(loaded)
    assert any("no head is labelled syntactic" in note for note in data.syntax_notes)
    assert "no head is labelled syntactic" in render_html(loaded)
    assert [w for w in report_warnings(loaded.meta) if "no head is labelled syntactic" in w]  # also the CLI's warning
    assert data.syntax_best and all(not row.significant and math.isnan(row.held_out_margin)
                                    for row in data.syntax_best)

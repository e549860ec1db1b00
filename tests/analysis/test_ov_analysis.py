"""OV copying inside `analyze`: the table, its qualifier of induction and duplicate-token labels,
saving, the report's data, the CLI summary, and models without an unembedding."""
import math

import pandas as pd
import pytest

from headscope.analysis import Analysis
from headscope.detectors.labels import OV_COPIES_SHARE, ov_qualifier, ov_qualifiers
from headscope.loading.loader import Loaded
from headscope.head_geometry.ov_circuit import OV_COLUMNS
from headscope.analysis.analyze import analyze
from headscope.probes.kinds import RepeatedProbe, TextProbe
from headscope.report import report_data, write_report
from tests.support.planted import char_tokenizer
from tests.support.tiny import tiny_model

SMALL = dict(detectors=["previous_token", "induction", "duplicate_token"],
             probes=[TextProbe(n_examples=4, seq_len=40), RepeatedProbe(n_examples=4, repeat_len=10, repeats=4)],
             explorer_examples=1, explorer_len=12)


@pytest.fixture(scope="module")
def planted_ov_analysis(planted):
    return analyze(planted, **SMALL)


def test_ov_qualifier_rule():
    assert ov_qualifier("induction", 0.95) == "copies"
    assert ov_qualifier("duplicate_token", OV_COPIES_SHARE) == "copies"  # the threshold itself passes
    assert ov_qualifier("induction", 0.89) == "no OV copying"
    assert ov_qualifier("induction", 0.95, control_best=0.97) == "no OV copying"  # must beat the twin's best head
    assert ov_qualifier("previous_token", 1.0) == "" and ov_qualifier("mixed", 1.0) == ""  # only these two labels
    assert ov_qualifier("induction", math.nan) == ""


def test_planted_induction_head_copies_and_duplicate_token_head_does_not(planted_ov_analysis):
    # Ground truth (tests/support/planted.py): 1.0's OV circuit writes the attended character back to its
    # own logit (eigenvalues 1 and 0); 1.1 writes into a block W_U does not read.
    labels = planted_ov_analysis.labels.set_index(["layer", "head"]).label
    assert labels[(1, 0)] == "induction" and labels[(1, 1)] == "duplicate_token"
    ov = planted_ov_analysis.ov.set_index(["layer", "head"])
    assert list(planted_ov_analysis.ov.columns) == OV_COLUMNS + ["site"] and len(ov) == 8
    assert ov.positive_eig_share[(1, 0)] == pytest.approx(1.0) and ov.copy_top1[(1, 0)] == 1.0
    assert planted_ov_analysis.ov.control_positive_eig_share.between(0.0, 0.9).all()  # the random twin does not copy
    assert ov_qualifiers(planted_ov_analysis.labels, planted_ov_analysis.ov) == {(1, 0): "copies", (1, 1): "no OV copying"}
    meta = planted_ov_analysis.meta["ov"]
    assert meta == {"n_tokens": 512, "copy_top1_of": ["induction", "duplicate_token"], "fold_norms": True,
                    "copies_share": OV_COPIES_SHARE, "skipped": None}
    # copy_top1 only of the heads the qualifier reads (its cost); the eigenvalue share of every head
    assert set(ov.copy_top1.dropna().index) == {(1, 0), (1, 1)} and ov.positive_eig_share.notna().all()
    assert planted_ov_analysis.meta["timings"]["ov"] > 0 and "notes" not in planted_ov_analysis.meta


def test_ov_leaves_scores_and_labels_as_they_were(planted, planted_ov_analysis):
    without = analyze(planted, **SMALL, ov=False)
    assert without.ov is None and without.meta["ov"]["skipped"] == "not asked for (ov=False)"
    pd.testing.assert_frame_equal(without.scores, planted_ov_analysis.scores)
    pd.testing.assert_frame_equal(without.labels, planted_ov_analysis.labels)
    assert report_data(without).ov is None and report_data(without).label_grid.qualifiers == ()


def test_ov_table_round_trips(planted_ov_analysis, tmp_path):
    planted_ov_analysis.save(tmp_path / "a")
    assert (tmp_path / "a" / "ov.csv").is_file()
    again = Analysis.load(tmp_path / "a")
    pd.testing.assert_frame_equal(again.ov, planted_ov_analysis.ov, check_dtype=False)
    assert again.meta["ov"] == planted_ov_analysis.meta["ov"]


def test_report_data_carries_the_ov_column_and_qualifier(planted_ov_analysis, tmp_path):
    data = report_data(planted_ov_analysis)
    rows = {(r.layer, r.head): r for r in data.ov}
    assert set(rows) == {(1, 0), (1, 1)}  # the heads labelled induction or duplicate-token
    induction = rows[(1, 0)]
    assert induction.qualifier == "copies" and induction.positive_eig_share == pytest.approx(1.0)
    best = planted_ov_analysis.ov.control_positive_eig_share.max()
    assert induction.control_best_share == best and not math.isnan(induction.control_share)
    assert rows[(1, 1)].qualifier == "no OV copying"
    grid = data.label_grid
    assert grid.qualifiers[1][0] == "copies" and grid.qualifiers[1][1] == "no OV copying" and grid.qualifiers[0][0] == ""
    assert grid.hover[1][0].startswith("<b>layer 1 head 0</b>: induction, copies")
    line = f"OV copying: eig share 1.000 (control {induction.control_share:.3f}, control best head {best:.3f})"
    assert line in grid.hover[1][0]
    assert "OV copying: eig share" in grid.hover[0][0] and ", copies" not in grid.hover[0][0]  # numbers, no qualifier
    assert "copy top-1" not in grid.hover[0][0]  # not computed for heads the qualifier does not read
    top = next(t for t in data.top_heads if t.label == "induction")
    assert top.qualifier == "copies" and top.ov_text().startswith(", copies (eig share 1.00, control ")
    assert next(t for t in data.top_heads if t.label == "previous_token").ov_text() == ""
    rule = [n.text for n in data.rules if n.topic == "ov"]
    assert len(rule) == 1 and f"at least {OV_COPIES_SHARE:g} and above the control's best head" in rule[0]
    write_report(planted_ov_analysis, tmp_path / "report")
    page = (tmp_path / "report" / "index.html").read_text()
    assert "<section id=\"ov\">" in page and "no OV copying" in page


def test_cli_summary_shows_the_qualifier(planted_ov_analysis, capsys, tmp_path):
    from headscope.cli.analysis import _summary

    _summary(planted_ov_analysis, tmp_path)
    lines = capsys.readouterr().out.splitlines()
    induction = next(line for line in lines if line.strip().startswith("induction"))
    duplicate = next(line for line in lines if line.strip().startswith("duplicate_token"))
    assert "1.0 " in induction and ", copies (eig share 1.00" in induction
    assert ", no OV copying (eig share 0.00" in duplicate
    assert "OV" not in next(line for line in lines if line.strip().startswith("previous_token"))


def test_notebook_display_shows_the_qualifier(planted_ov_analysis):
    from headscope.report.notebook import analysis_html

    shown = analysis_html(planted_ov_analysis)
    assert "L1 H0 1.000" in shown and ", copies (eig share 1.00" in shown and ", no OV copying (eig share 0.00" in shown


def test_a_model_without_unembedding_is_analysed_with_a_note(tmp_path):
    loaded = Loaded(tiny_model("bert"), char_tokenizer(), "tiny-bert", "bert", False)  # BertModel: no LM head
    analysis = analyze(loaded, detectors=["previous_token"], probes=[TextProbe(n_examples=4, seq_len=24)],
                       explorer_examples=0)
    assert analysis.ov is None and len(analysis.labels) == 2 * loaded.n_heads
    assert "no unembedding" in analysis.meta["ov"]["skipped"]
    assert any(note.startswith("OV copying not computed: ") for note in analysis.meta["notes"])
    data = report_data(analysis)
    assert data.ov is None and any(n.topic == "ov" and "not computed" in n.text for n in data.rules)
    analysis.save(tmp_path / "a")
    assert not (tmp_path / "a" / "ov.csv").exists() and Analysis.load(tmp_path / "a").ov is None


def test_offloaded_weights_are_a_reason_not_an_error():
    import torch

    from headscope.head_geometry.ov_circuit import ov_table

    model = tiny_model("llama")
    proj = model.model.layers[1].self_attn.v_proj
    # as accelerate leaves a disk-offloaded layer
    proj.weight = torch.nn.Parameter(torch.empty(proj.weight.shape, device="meta"))
    frame, reason = ov_table(Loaded(model, char_tokenizer(), "tiny-llama", "llama", True))
    assert frame is None and "offloaded" in reason

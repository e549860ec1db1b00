"""The retrieval detector inside `analyze` (`Detector.run` on the needle probe): planted ground
truth, agreement with `retrieval_scores`, the random-init control, save/load, CLI, report, validate."""
import pandas as pd
import pytest
from typer.testing import CliRunner

import headscope
from headscope.analysis import Analysis
from headscope.cli import app
from headscope.detectors import REGISTRY
from headscope.errors import HeadscopeError
from headscope.loading.loader import Loaded
from headscope.probes.kinds import NeedleProbe
from headscope.detectors.protocol import SCORE_COLUMNS
from headscope.report import report_data
from headscope.detectors.retrieval.scoring import THRESHOLD, retrieval_scores, run_needle
from tests.support.planted import POSITIONS, char_tokenizer
from tests.support.tiny import tiny_model

# The planted model reads 48 positions of single characters: a needle of characters the bundled
# text never holds (so the induction head's earlier occurrence is the needle's) and a short question.
NEEDLE = "|~^`#@%"
SHORT = dict(lengths=(POSITIONS,), depths=(0.2, 0.5, 0.8), needles=(NEEDLE,), question="\nRepeat:")
PROBE = NeedleProbe(**SHORT)


@pytest.fixture(scope="module")
def planted_retrieval_analysis(planted):
    return headscope.analyze(planted, detectors=["retrieval"], probes=[PROBE], explorer_examples=0)


def test_planted_induction_head_is_a_retrieval_head(planted, planted_retrieval_analysis):
    labels = planted_retrieval_analysis.labels.set_index(["layer", "head"])
    assert labels.loc[(1, 0), "label"] == "retrieval"
    assert "retrieval" not in labels.loc[(1, 1), "labels"]  # duplicate-token lands on the needle's previous token
    assert (planted_retrieval_analysis.labels.label == "retrieval").sum() == 1
    # Ground truth: the induction head copies every answer token the model predicts (it is what
    # makes the model predict them), so its score is the share predicted, over |needle|.
    expected = []
    for example in PROBE.build(planted, 0).examples:
        _, predicted, _ = run_needle(planted, example)
        expected.append(int(predicted.sum()) / len(predicted))
    score = planted_retrieval_analysis.scores.set_index(["layer", "head"]).loc[(1, 0), "score"]
    assert score == pytest.approx(sum(expected) / len(expected)) and score >= THRESHOLD
    assert list(planted_retrieval_analysis.scores.columns) == SCORE_COLUMNS + ["site"]
    assert set(planted_retrieval_analysis.retrieval.columns) == {"layer", "head", "length", "score", "n", "site"}
    assert planted_retrieval_analysis.needles.counted.all() and len(planted_retrieval_analysis.needles) == 3
    assert planted_retrieval_analysis.meta["probes"]["needle"]["lengths"] == [POSITIONS]


def test_analyze_gives_the_scores_of_retrieval_scores(planted, planted_retrieval_analysis):
    result = retrieval_scores(planted, **SHORT)
    pd.testing.assert_frame_equal(planted_retrieval_analysis.scores[SCORE_COLUMNS], result.scores[SCORE_COLUMNS])
    pd.testing.assert_frame_equal(planted_retrieval_analysis.retrieval, result.by_length)
    pd.testing.assert_frame_equal(planted_retrieval_analysis.needles, result.examples)
    labelled = planted_retrieval_analysis.labels.label == "retrieval"
    assert labelled.tolist() == result.scores.retrieval.tolist()


def test_control_max_len_is_a_probe_setting_analyze_and_retrieval_scores_share(planted):
    """The control reads only the prompts up to `control_max_len`, in analyze as in
    retrieval_scores (one core); its column is the twin's mean over those prompts alone."""
    import dataclasses

    from headscope.detectors.retrieval.scoring import _per_example
    from headscope.loading.control import resolve_control

    settings = dict(SHORT, lengths=(POSITIONS - 6, POSITIONS), control_max_len=POSITIONS - 6)
    analysis = headscope.analyze(planted, detectors=["retrieval"], probes=[NeedleProbe(**settings)], explorer_examples=0)
    result = retrieval_scores(planted, **settings)
    pd.testing.assert_frame_equal(analysis.scores[SCORE_COLUMNS], result.scores[SCORE_COLUMNS])
    assert analysis.meta["probes"]["needle"]["control_max_len"] == POSITIONS - 6
    assert result.meta["control"]["lengths"] == [POSITIONS - 6]
    twin, _ = resolve_control(planted, "random-init", 0)
    short = [e for e in NeedleProbe(**settings).build(planted, 0).examples if e.length == POSITIONS - 6]
    assert len(short) == 3
    expected = _per_example(twin, short, False, None, "test")[0].mean(-1)
    assert result.scores.control.tolist() == pytest.approx(expected.tolist(), abs=1e-12)
    assert "control_max_len" not in PROBE.build(planted, 0).meta()  # unset: meta.json as before
    assert dataclasses.replace(PROBE, control_max_len=None) == PROBE


def test_lengths_beyond_the_context_are_dropped_or_refused(planted):
    probe = NeedleProbe(**{**SHORT, "lengths": (POSITIONS, POSITIONS + 1)}).build(planted, 0)
    assert probe.lengths == [POSITIONS] and probe.seq_len == POSITIONS
    with pytest.raises(HeadscopeError, match="no needle length fits"):
        NeedleProbe(**{**SHORT, "lengths": (POSITIONS + 1,)}).build(planted, 0)
    with pytest.raises(HeadscopeError, match="no needle length fits"):
        NeedleProbe(**{**SHORT, "max_len": POSITIONS - 1}).build(planted, 0)
    assert probe.explorer_ids(2, 48) is None
    with pytest.raises(HeadscopeError, match="no pattern batches"):
        probe.batches(2, True, "cpu")


def test_retrieval_refuses_a_pattern_and_a_bidirectional_model(planted):
    import torch

    with pytest.raises(HeadscopeError, match="runs its own forward passes"):
        REGISTRY["retrieval"](torch.ones(1, 2, 3, 3) / 3)
    bert = Loaded(model=tiny_model("bert"), tokenizer=char_tokenizer(), name="tiny bert", family="bert", causal=False)
    with pytest.raises(HeadscopeError, match="needs a causal model"):
        headscope.analyze(bert, detectors=["retrieval"], probes=[PROBE], control=None)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_random_init_model_gets_no_retrieval_label(family):
    # seed 3: not the control's seed; default needles and question, which fit 320 positions
    loaded = Loaded.from_model(tiny_model(family, seed=3, positions=320), char_tokenizer(), f"random-{family}")
    result = headscope.analyze(loaded, detectors=["retrieval"], explorer_examples=0,
                               probes=[NeedleProbe(lengths=(320,), depths=(0.2, 0.8), n_needles=2)])
    assert not (result.labels.label == "retrieval").any()
    assert result.scores.control_max.iloc[0] < THRESHOLD


def test_save_and_load_keep_the_retrieval_tables(planted_retrieval_analysis, tmp_path):
    back = Analysis.load(planted_retrieval_analysis.save(tmp_path / "a"))
    assert (tmp_path / "a" / "retrieval.csv").is_file() and (tmp_path / "a" / "needles.csv").is_file()
    pd.testing.assert_frame_equal(back.retrieval, planted_retrieval_analysis.retrieval)
    pd.testing.assert_frame_equal(back.needles, planted_retrieval_analysis.needles)
    pd.testing.assert_frame_equal(back.scores, planted_retrieval_analysis.scores, check_dtype=False)
    assert back.labels.label.tolist() == planted_retrieval_analysis.labels.label.tolist()


def test_report_and_notebook_show_retrieval(planted_retrieval_analysis):
    data = report_data(planted_retrieval_analysis)
    grid = {g.detector: g for g in data.detector_grids}["retrieval"]
    assert grid.score[1, 0] == pytest.approx(planted_retrieval_analysis.score_grid("retrieval")[1, 0])
    assert grid.threshold == THRESHOLD
    assert "retrieval" in data.label_grid.categories
    colour = data.label_grid.colours[data.label_grid.categories.index("retrieval")]
    assert colour == REGISTRY["retrieval"].colour
    assert data.label_grid.short[1][0] == REGISTRY["retrieval"].short
    assert "retrieval" in planted_retrieval_analysis._repr_html_()


def test_validate_ablates_retrieval_heads_on_the_needle_probe(planted, planted_retrieval_analysis):
    frame = headscope.validate(planted, planted_retrieval_analysis, k=1, n_random=3, n_examples=3, probes=[PROBE])
    rows = frame[frame.label == "retrieval"]
    assert set(rows.probe) == {"needle"} and set(rows.heads) == {"1.0"}
    primary = rows[rows.primary].iloc[0]
    assert primary.ablated_accuracy < primary.baseline_accuracy  # needle-copy accuracy falls
    assert primary.hurts_more  # more than ablating random heads of layer 1


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-gpt2")
    tiny_model("gpt2", seed=3, positions=320).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder


def test_cli_analyze_with_retrieval_and_induction(tiny_dir, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["analyze", str(tiny_dir), "--out", str(out), "--device", "cpu",
                                      "--detectors", "induction,retrieval", "--needle-lengths", "320,9999",
                                      "--n-examples", "2", "--seq-len", "24", "--repeat-len", "6", "--repeats", "3"])
    assert result.exit_code == 0, result.output
    saved = Analysis.load(out)
    assert saved.detectors == ["induction", "retrieval"]
    assert saved.meta["probes"]["needle"]["lengths"] == [320]  # 9999 is beyond the context
    assert saved.retrieval is not None and (out / "index.html").is_file()
    bad = CliRunner().invoke(app, ["analyze", str(tiny_dir), "--out", str(tmp_path / "never"), "--device", "cpu",
                                   "--detectors", "retrieval", "--needle-lengths", "9999"])
    assert bad.exit_code != 0 and "no needle length fits" in bad.output and "Traceback" not in bad.output
    assert not (tmp_path / "never").exists()
    listing = CliRunner().invoke(app, ["detectors"])
    assert "retrieval" in listing.output


def test_cli_refuses_retrieval_on_a_bidirectional_model(tmp_path):
    folder = tmp_path / "bert"
    tiny_model("bert").save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    result = CliRunner().invoke(app, ["analyze", str(folder), "--out", str(tmp_path / "never"), "--device", "cpu",
                                      "--detectors", "retrieval"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if "needs a causal model" in line]) == 1
    assert not (tmp_path / "never").exists()

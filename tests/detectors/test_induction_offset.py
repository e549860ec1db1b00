"""Induction, not an offset: a planted head attending at a fixed offset -(period - 1) scores like
an induction head on a repeated probe of one period, and must not on the default probe, whose
period varies across examples (`headscope.probes.base.repeat_periods`); the planted induction
head keeps its label."""
import pytest

import headscope
from headscope.analysis.analyze import analyze
from headscope.probes.base import repeat_periods
from headscope.probes.kinds import RepeatedProbe, TextProbe
from tests.support.planted_positions import save_planted_positions

REPEAT_LEN = 10  # [BOS] + 10 x 4 = 41 tokens: within the planted models' 48 positions
OFFSET_HEAD = (0, 0)


@pytest.fixture(scope="module")
def offset_model(tmp_path_factory):
    """planted_positions with head 0.0 attending REPEAT_LEN - 1 tokens back."""
    folder = save_planted_positions(tmp_path_factory.mktemp("offset"), back=REPEAT_LEN - 1)
    return headscope.load(str(folder), device="cpu")


def _induction(loaded, vary_period):
    probes = [TextProbe(8, 40), RepeatedProbe(16, REPEAT_LEN, 4, vary_period=vary_period)]
    analysis = analyze(loaded, detectors=["induction", "duplicate_token"], probes=probes, explorer_examples=0)
    scores = analysis.scores.set_index(["layer", "head", "detector"]).score
    labels = analysis.labels.set_index(["layer", "head"]).label
    return scores, labels


def test_a_fixed_period_lets_an_offset_head_pass_for_induction(offset_model):
    """The problem the varied period fixes, shown on the same model: one period, label earned."""
    scores, labels = _induction(offset_model, vary_period=False)
    assert scores[(*OFFSET_HEAD, "induction")] > 0.95
    assert labels[OFFSET_HEAD] == "induction"


def test_the_offset_head_is_not_induction_when_the_period_varies(offset_model):
    scores, labels = _induction(offset_model, vary_period=True)
    periods = repeat_periods(16, REPEAT_LEN)
    share = periods.count(REPEAT_LEN) / len(periods)  # the examples whose period the offset serves
    assert share == 4 / 16
    assert scores[(*OFFSET_HEAD, "induction")] == pytest.approx(share, abs=0.05)
    assert labels[OFFSET_HEAD] != "induction"
    assert "induction" not in set(labels)


def test_the_planted_induction_head_keeps_its_label_when_the_period_varies(planted):
    scores, labels = _induction(planted, vary_period=True)
    assert labels[(1, 0)] == "induction"
    assert scores[(1, 0, "induction")] > 0.95
    assert labels[(1, 1)] == "duplicate_token"
    assert [head for head, label in labels.items() if label == "induction"] == [(1, 0)]


def test_periods_are_spread_and_none_divides_another():
    periods = repeat_periods(16, 25)
    assert max(periods) == 25 and min(periods) == 13
    assert max(periods.count(p) for p in set(periods)) == 2
    assert all(p % q for p in set(periods) for q in set(periods) if p != q)
    assert repeat_periods(4, 25, vary_period=False) == [25] * 4


def test_every_example_repeats_its_own_unit(planted):
    probe = RepeatedProbe(8, REPEAT_LEN, 4).build(planted, seed=0)
    body = probe.input_ids[:, probe.content_start:]
    assert body.shape == (8, REPEAT_LEN * 4)
    for row, period in zip(body, repeat_periods(8, REPEAT_LEN)):
        assert len(set(row[:period].tolist())) == period  # distinct within a copy
        assert (row[period:] == row[:-period]).all()  # and nothing but the copy after it

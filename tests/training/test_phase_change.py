"""The induction-head phase change (Olsson et al. 2022), a short version of
benchmarks/phase_change.py, asserted from the timelines HeadscopeCallback writes (slow: about 60 s
on two shared cores, less on quiet ones).

A tiny Llama (2 layers x 4 heads, hidden 64, vocab 64) on 61-token sequences in which one random
segment of 8-30 tokens occurs twice at a varying distance (batch 64, AdamW lr 1e-3, seed 0; the
benchmark measured its window at steps 300-320 for this seed, 300-320 and 310-340 for seeds 1, 2):
(a) a layer-1 head goes from near chance to the induction label within a narrow window;
(b) the ICL score falls in that window much faster than before it;
(d) the 1-layer twin never earns an induction label;
and the training losses with and without the callback are identical.
"""
import pytest

from headscope.training.callback import HeadscopeCallback
from headscope.training.toy import induction_window

from tests.support.phase_change import EVERY, STEPS, held_out, train_phase

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(phase_change):
    """The session's 2-layer run (its timeline in root / "two"), the 1-layer twin and a short plain run."""
    root = phase_change.root
    train_phase(1, STEPS, root / "run1", [HeadscopeCallback(every=3 * EVERY, out=root / "one", icl_data=held_out())])
    plain, _ = train_phase(2, EVERY + 1, root / "plain", [])  # past the first records (steps 0 and 20)
    return root, phase_change.losses, plain


def test_losses_with_and_without_the_callback_are_identical(runs):
    _, tracked, plain = runs
    assert len(plain) == EVERY + 1 and tracked[:len(plain)] == plain


def test_an_induction_head_forms_in_layer_1_within_a_narrow_window(runs):
    window = induction_window(runs[0] / "two")
    assert window["induction_labelled"] and window["head"].startswith("1.")
    start, end = window["window"]
    assert end - start <= 2 * EVERY  # from near chance to the label in at most two records
    assert start >= 10 * EVERY  # after a long plateau
    low, high = window["best_induction"]
    assert low <= window["chance"] and high >= 0.4


def test_the_icl_score_improves_in_the_same_window(runs):
    window = induction_window(runs[0] / "two")
    start, end = window["window"]
    (icl_start, icl_end), icl_0 = window["icl_score"], window["icl_score_step0"]
    assert icl_end - icl_start <= -0.5  # nats, within the window
    rate_in = (icl_end - icl_start) / (end - start)
    rate_before = (icl_start - icl_0) / start
    assert rate_in <= 5 * rate_before  # both negative: at least five times as fast in the window


def test_the_one_layer_model_never_earns_an_induction_label(runs):
    window = induction_window(runs[0] / "one")
    assert window["layers"] == 1 and not window["induction_labelled"]
    assert window["best_induction_final"] < 0.2

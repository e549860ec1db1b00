"""Detectors on the real SmolLM2-135M against a random-init model of the same shape (slow)."""
import pytest

from headscope.loading.control import random_twin
from headscope.analysis.analyze import analyze
from headscope.probes.kinds import RepeatedProbe, TextProbe, TreebankProbe
from tests.support.labels import learned_labels

pytestmark = pytest.mark.slow

ARGS = dict(probes=[TextProbe(n_examples=12, seq_len=96), RepeatedProbe(n_examples=12, repeat_len=25, repeats=4)],
            detectors=["induction", "previous_token", "sink"])


@pytest.fixture(scope="module")
def smollm2_analysis(smollm2):
    return analyze(smollm2, **ARGS)


@pytest.fixture(scope="module")
def random_init_analysis(smollm2):
    # A random model under test (seed 7), analysed with its own default control (another seed).
    return analyze(random_twin(smollm2, 7), **ARGS)


@pytest.mark.parametrize("detector", ["induction", "previous_token"])
def test_real_heads_pass_and_beat_random_init(smollm2_analysis, random_init_analysis, detector):
    real = smollm2_analysis.scores.set_index(["layer", "head", "detector"])
    rand = random_init_analysis.scores.set_index(["layer", "head", "detector"])
    labelled = smollm2_analysis.labels[smollm2_analysis.labels.label == detector]
    assert len(labelled) >= 1
    threshold = smollm2_analysis.meta["detectors"][detector]["threshold"]
    for layer, head in zip(labelled["layer"], labelled["head"]):
        row = real.loc[(layer, head, detector)]
        assert row.score >= threshold
        # The 95% interval of the trained head excludes the random-init twin's score.
        assert row.ci_low > rand.loc[(layer, head, detector)].score


def test_random_init_twin_has_no_learned_label(random_init_analysis):
    assert learned_labels(random_init_analysis) == set()


def test_smollm2_keeps_its_induction_and_previous_token_heads_with_the_control(smollm2_analysis):
    # Olsson et al.'s induction heads and the previous-token heads they compose with, found
    # before controls existed (18.6, 17.3/17.4; 16.0, 11.1), must survive the control rule.
    labels = smollm2_analysis.labels.set_index(["layer", "head"]).label
    assert labels[(18, 6)] == "induction"
    assert "induction" in (labels[(17, 3)], labels[(17, 4)])
    assert labels[(16, 0)] == labels[(11, 1)] == "previous_token"
    assert smollm2_analysis.meta["control"]["kind"] == "random-init"


def test_smollm2_has_sink_heads_beyond_the_bottom_layers(smollm2_analysis):
    sinks = smollm2_analysis.labels[smollm2_analysis.labels.label == "sink"]
    assert (sinks.layer >= 2).sum() >= 10  # StreamingLLM: most heads past the bottom two layers

"""Detectors on the real SmolLM2-135M against a random-init model of the same shape (slow)."""
import pytest
import torch

from headscope.pipeline import analyze
from headscope.loading import Loaded

pytestmark = pytest.mark.slow

ARGS = dict(n_examples=12, seq_len=96, repeat_len=25, repeats=4, detectors=["induction", "previous_token", "sink"])


@pytest.fixture(scope="module")
def smollm2_analysis(smollm2):
    return analyze(smollm2, **ARGS)


@pytest.fixture(scope="module")
def random_init_analysis(smollm2):
    import transformers as tf

    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(smollm2.model.config).eval()
    twin = Loaded(model=model, tokenizer=smollm2.tokenizer, name="smollm2-random-init", family="llama", causal=True)
    return analyze(twin, **ARGS)


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


def test_random_init_twin_has_no_induction_head(random_init_analysis):
    assert "induction" not in set(random_init_analysis.labels.label)


def test_smollm2_has_sink_heads_beyond_the_bottom_layers(smollm2_analysis):
    sinks = smollm2_analysis.labels[smollm2_analysis.labels.label == "sink"]
    assert (sinks.layer >= 2).sum() >= 10  # StreamingLLM: most heads past the bottom two layers

"""`Timeline.record` on the planted model (ground truth), and what it leaves untouched."""
import random

import numpy as np
import pandas as pd
import pytest
import torch

import headscope
from headscope.errors import HeadscopeError
from headscope.training.icl import icl_positions, icl_score, token_losses
from headscope.training.timeline_probes import IdTokenizer, timeline_probes
from headscope.training.timeline import DEFAULT_DETECTORS, TIMELINE_COLUMNS, Timeline, unwrap, untouched
from tests.support.planted import PLANTED


@pytest.fixture(scope="module")
def planted_timeline(planted):
    timeline = Timeline(tokenizer=planted.tokenizer, control="random-init")
    timeline.record(planted.model, 0)
    return timeline


def test_the_planted_heads_get_their_labels_on_the_timeline(planted_timeline):
    labels = planted_timeline.labels.set_index(["layer", "head"]).label
    for head, label in PLANTED.items():
        if label in DEFAULT_DETECTORS:
            assert labels[head] == label, head
    scores = planted_timeline.scores
    assert list(scores.columns) == TIMELINE_COLUMNS
    assert set(scores.detector) == set(DEFAULT_DETECTORS)
    assert len(scores) == len(DEFAULT_DETECTORS) * 8


def test_the_summary_names_the_best_head_and_the_icl_score(planted_timeline, planted):
    summary = planted_timeline.summary(0)
    assert summary["headscope/induction_max"] > 0.95  # the planted 1.0
    assert summary["headscope/induction_heads"] == 1
    text = {p.name: p for p in planted_timeline.probes}["text"]  # the default ICL data with a text tokenizer
    assert summary["headscope/icl_score"] == pytest.approx(icl_score(planted.model, text.input_ids)[0], abs=1e-6)


def test_on_repeats_the_planted_model_learns_in_context(planted):
    repeated = headscope.RepeatedProbe(8, 11, 4).build(planted, 0)
    timeline = Timeline(tokenizer=planted.tokenizer, control=None, icl_data=repeated.input_ids)
    # token 4 of 45 is in the first copy (unpredictable), token 44 in the last (copied by 1.0)
    assert timeline.record(planted.model, 0)["headscope/icl_score"] < -5


def test_probes_from_token_ids_find_the_same_heads(planted):
    """No tokenizer: the text probe is random ids, the repeated probe drawn from ids alone."""
    timeline = Timeline(control="random-init")
    timeline.record(planted.model, 3)
    labels = timeline.labels.set_index(["layer", "head"]).label
    assert labels[(0, 0)] == "previous_token" and labels[(1, 0)] == "induction" and labels[(1, 1)] == "duplicate_token"
    built = {p.name: p for p in timeline.probes}
    assert "random token ids" in built["text"].description
    bos = planted.model.config.bos_token_id
    assert built["repeated"].seq_len <= 48 and (built["repeated"].input_ids[:, 0] == bos).all()


def test_icl_positions_scale_olssons_50_and_500():
    assert icl_positions(512) == (50, 500)
    assert icl_positions(61) == (6, 60)
    assert icl_positions(3) == (1, 2)


class _Fixed(torch.nn.Module):
    """A 'model' whose next-token distribution is known: uniform, except that after position 4 it
    puts probability 1/2 on the true next token."""

    def __init__(self, ids, vocab):
        super().__init__()
        self.ids, self.vocab, self.w = ids, vocab, torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids):
        b, t = input_ids.shape
        probs = torch.full((b, t, self.vocab), 1.0 / self.vocab)
        for pos in range(4, t - 1):
            probs[:, pos] = 0.5 / (self.vocab - 1)
            probs[torch.arange(b), pos, input_ids[:, pos + 1]] = 0.5
        return type("Out", (), {"logits": probs.log()})()


def test_icl_score_against_hand_computed_losses():
    ids = torch.randint(0, 10, (3, 20))
    model = _Fixed(ids, 10)
    losses = token_losses(model, ids)
    assert torch.allclose(losses[:, 1:5], torch.full((3, 4), np.log(10.0)), atol=1e-5)
    assert torch.allclose(losses[:, 5:], torch.full((3, 15), np.log(2.0)), atol=1e-5)
    early, late = icl_positions(20)  # (2, 20 -> 19)
    score, mean = icl_score(model, ids)
    assert (early, late) == (2, 19)
    assert score == pytest.approx(np.log(2.0) - np.log(10.0), abs=1e-5)
    assert mean == pytest.approx((4 * np.log(10.0) + 15 * np.log(2.0)) / 19, abs=1e-5)


def test_a_record_leaves_modes_random_states_and_gradients_as_they_were(planted_dir):
    model = headscope.load(str(planted_dir), device="cpu").model
    model.train()
    model.transformer.h[1].eval()  # a mixed mode must come back mixed
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    Timeline(control="random-init").record(model, 0)
    assert model.training and model.transformer.h[0].training and not model.transformer.h[1].training
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert (np.random.get_state()[1] == before[2]).all()
    assert all(p.grad is None for p in model.parameters())
    assert torch.is_grad_enabled()


def test_untouched_restores_even_when_the_block_fails():
    model = torch.nn.Linear(2, 2).train()
    state = torch.get_rng_state()
    with pytest.raises(RuntimeError):
        with untouched(model):
            model.eval(), torch.rand(3)
            raise RuntimeError("boom")
    assert model.training and torch.equal(torch.get_rng_state(), state)


def test_fsdp_is_refused_in_one_line():
    class FullyShardedDataParallel(torch.nn.Module):
        pass

    with pytest.raises(HeadscopeError, match="FSDP") as err:
        unwrap(FullyShardedDataParallel())
    assert "\n" not in str(err.value)


def test_a_model_of_another_shape_is_refused(planted, tmp_path):
    from headscope.training.toy import tiny_llama

    timeline = Timeline(control=None)
    timeline.record(tiny_llama(1), 0)
    with pytest.raises(HeadscopeError, match="1 layers x 4 heads; got 2 x 4"):
        timeline.record(planted.model, 1)


def test_save_and_resume_drop_the_rows_after_the_checkpoint(planted, tmp_path):
    timeline = Timeline(control="random-init")
    for step in (0, 10, 20):
        timeline.record(planted.model, step)
    timeline.note_train_loss(10, 1.5)
    timeline.save(tmp_path / "tl")
    assert (tmp_path / "tl" / ".headscope").is_file()
    resumed = Timeline.resume(tmp_path / "tl", up_to=10, control="random-init")
    assert sorted(resumed.steps.step) == [0, 10] and resumed.steps.set_index("step").train_loss[10] == 1.5
    resumed.record(planted.model, 20)
    pd.testing.assert_frame_equal(resumed.scores, timeline.scores, check_dtype=False)


def test_probes_given_as_settings_are_built_once_and_the_rest_are_the_timelines(planted):
    timeline = Timeline(probes=[headscope.RepeatedProbe(8, 6, 4, vary_period=False)], control=None)
    timeline.record(planted.model, 0)
    built = {p.name: p for p in timeline.probes}
    assert built["repeated"].seq_len == 1 + 6 * 4 and "random tokens x 4" in built["repeated"].description
    assert built["text"].seq_len == 48  # the timeline's own text probe (the model's context), not TextProbe()'s 128
    first = built["repeated"].input_ids.clone()
    timeline.record(planted.model, 1)
    assert torch.equal({p.name: p for p in timeline.probes}["repeated"].input_ids, first)


def test_any_registered_detector_is_named(planted):
    timeline = Timeline(detectors=["self", "induction"], tokenizer=planted.tokenizer, control="random-init")
    summary = timeline.record(planted.model, 0)
    assert set(timeline.scores.detector) == {"self", "induction"}
    assert timeline.labels.set_index(["layer", "head"]).label[(0, 3)] == "self"  # the planted self head
    assert summary["headscope/self_heads"] == 1

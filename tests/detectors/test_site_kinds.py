"""Detectors per site kind: which detectors read causal, bidirectional and cross-attention sites
(`Detector.applies_to`, `registry.defaults_for`), the batch of a cross-attention site (its own
key mask), and sink and uniform worked by hand on cross-attention patterns."""
import math

import pytest
import torch

import headscope
from headscope import detectors
from headscope.detectors.protocol import Detector
from headscope.detectors.registry import defaults, defaults_for
from headscope.probes.base import ProbeBatch

# What `defaults(causal)` returned before site kinds existed: it must not move.
CAUSAL_DEFAULTS = ["induction", "duplicate_token", "previous_token", "self", "sink", "uniform", "syntactic"]
BIDIRECTIONAL_DEFAULTS = ["induction", "duplicate_token", "previous_token", "next_token", "self", "sink", "uniform",
                          "syntactic"]


def test_defaults_per_site_kind():
    assert defaults(causal=True) == defaults_for("causal") == CAUSAL_DEFAULTS
    assert defaults(causal=False) == defaults_for("bidirectional") == BIDIRECTIONAL_DEFAULTS
    assert defaults_for("cross") == ["sink", "uniform", "alignment"]
    with pytest.raises(headscope.HeadscopeError, match="unknown site kind 'decoder'"):
        defaults_for("decoder")


def test_applies_to_keeps_what_each_builtin_read_before():
    for name, det in detectors.REGISTRY.items():
        if name == "next_token":
            assert det.applies_to == ("bidirectional",) and det.bidirectional_only
        elif name in ("sink", "uniform"):
            assert det.applies_to == ("causal", "bidirectional", "cross") and not det.bidirectional_only
        elif name == "alignment":
            assert det.applies_to == ("cross",) and not det.bidirectional_only
        elif name == "retrieval":  # it teacher-forces the model's next-token predictions
            assert det.applies_to == ("causal",) and not det.bidirectional_only
        else:
            assert det.applies_to == ("causal", "bidirectional") and not det.bidirectional_only


@pytest.mark.parametrize("kinds", [(), ("decoder",), ["cross"], ("cross", "cross")])
def test_applies_to_is_checked_when_a_detector_is_made(kinds):
    with pytest.raises(headscope.HeadscopeError, match="applies_to must be a non-empty tuple"):
        Detector(name="bad_kinds", probe="text", threshold=0.5, formula="", source="", fn=lambda p, b: None,
                 applies_to=kinds)


def test_a_self_attention_batch_is_what_it_was():
    mask = torch.tensor([[True, True, True, False]])
    batch = ProbeBatch(torch.arange(4)[None], mask, True)
    assert batch.site_kind == "causal" and batch.for_site("causal") is batch
    expected = mask[:, None, :] & mask[:, :, None] & torch.ones(4, 4, dtype=torch.bool).tril()
    assert torch.equal(batch.key_allowed(), expected)
    assert ProbeBatch(torch.arange(4)[None], mask, False).site_kind == "bidirectional"
    with pytest.raises(headscope.HeadscopeError, match="read at causal attention sites, not at cross"):
        batch.for_site("cross")


def test_a_cross_attention_batch_has_its_own_key_mask():
    queries = torch.tensor([[True, True, True, False]])  # decoder: 3 real tokens
    keys = torch.tensor([[True, True, True, True, True, False]])  # encoder: 5 real positions
    batch = ProbeBatch(torch.arange(4)[None], queries, False, key_mask=keys)
    assert batch.site_kind == "cross"
    allowed = batch.key_allowed()
    assert allowed.shape == (1, 4, 6)
    assert torch.equal(allowed, queries[:, :, None] & keys[:, None, :])  # no causal triangle
    moved = batch.to("cpu")
    assert moved.site_kind == "cross" and torch.equal(moved.key_mask, keys)
    with pytest.raises(headscope.HeadscopeError, match="not causal"):
        ProbeBatch(torch.arange(4)[None], queries, True, key_mask=keys)
    with pytest.raises(headscope.HeadscopeError, match="needs key_mask"):
        ProbeBatch(torch.arange(4)[None], queries, False, key_ids=torch.arange(6)[None])


def _cross_batch(n_queries, n_keys, real_queries=None, real_keys=None):
    queries = torch.zeros(1, n_queries, dtype=torch.bool)
    queries[:, :real_queries or n_queries] = True
    keys = torch.zeros(1, n_keys, dtype=torch.bool)
    keys[:, :real_keys or n_keys] = True
    return ProbeBatch(torch.zeros(1, n_queries, dtype=torch.long), queries, False, key_mask=keys)


def test_sink_on_cross_attention_counts_every_real_decoder_query():
    q, k = 6, 10
    pattern = torch.zeros(1, 1, q, k)
    pattern[..., 0, 0] = 1.0  # decoder query 0 on encoder position 0
    pattern[..., 1:, 3] = 1.0  # the others elsewhere
    batch = _cross_batch(q, k)
    assert detectors.sink(pattern, batch).item() == pytest.approx(1 / 6)  # query 0 counts: it is not key 0
    padded = _cross_batch(q, k, real_queries=3)
    assert detectors.sink(pattern, padded).item() == pytest.approx(1 / 3)
    # in self-attention query 0 is key 0 itself and stays out, as before
    square = torch.zeros(1, 1, q, q)
    square[..., 0, 0] = 1.0
    square[..., 1:, 3] = 1.0
    assert detectors.sink(square, ProbeBatch(torch.zeros(1, q, dtype=torch.long), torch.ones(1, q, dtype=torch.bool),
                                             False)).item() == pytest.approx(0.0)


def test_uniform_on_cross_attention_reads_the_real_encoder_positions():
    q, k, real = 5, 16, 12
    pattern = torch.zeros(1, 1, q, k)
    pattern[..., :real] = 1 / real  # even over the real encoder positions, none on padding
    batch = _cross_batch(q, k, real_keys=real)
    assert detectors.uniform(pattern, batch).item() == pytest.approx(1.0, abs=1e-6)
    # spread over 6 of the 12: ln 6 / ln 12, whatever the query's position (no causal triangle)
    half = torch.zeros(1, 1, q, k)
    half[..., :6] = 1 / 6
    assert detectors.uniform(half, batch).item() == pytest.approx(math.log(6.0) / math.log(12.0),
                                                                  rel=1e-6)
    few = _cross_batch(q, k, real_keys=7)  # fewer than 8 real keys: nothing to say
    assert torch.isnan(detectors.uniform(pattern, few)).all()


def test_cross_attention_patterns_from_a_notebook():
    q, k = 6, 10
    pattern = torch.zeros(2, 1, q, k)
    pattern[..., 0] = 1.0
    table = detectors.sink(pattern)  # more keys than queries: read as cross-attention, every key real
    assert table.score.tolist() == [pytest.approx(1.0)]
    masked = detectors.uniform(torch.full((1, 1, q, k), 0.1), key_mask=torch.ones(1, k))
    assert masked.score.tolist() == [pytest.approx(1.0, abs=1e-6)]


def test_analyze_refuses_a_detector_for_sites_the_model_lacks(planted):
    with pytest.raises(headscope.HeadscopeError, match="needs a bidirectional model; .* is causal"):
        headscope.analyze(planted, detectors=["next_token"])
    with pytest.raises(headscope.HeadscopeError, match=r"needs an encoder-decoder model \(cross-attention\); "):
        headscope.analyze(planted, detectors=["alignment"])

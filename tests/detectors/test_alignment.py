"""The monotonic-alignment detector on planted cross-attention patterns: its per-example score
is Spearman's rho between query position and argmax key over the real queries, computed here
independently with `scipy.stats.spearmanr` (average ranks for ties, as the detector documents);
a constant argmax scores 0; in a tiny BART the planted alignment head is found against the
untrained twin, whose heads all stay far below the threshold."""
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from headscope import detectors
from headscope.detectors.labels import label_heads, passes
from headscope.detectors.patterns.alignment import MIN_QUERIES
from headscope.detectors.protocol import Collected
from headscope.probes.base import ProbeBatch
from headscope.probes.kinds import CopyProbe
from tests.support.planted import char_tokenizer
from tests.support.planted_cross import HEADS, planted_bart, random_bart

alignment = detectors.alignment


def _pattern(targets, n_keys, real_keys=None, noise=0.0, seed=0):
    """`[batch, head, query, key]` rows peaked on `targets` (`[batch, head, query]` key indices),
    with `noise` spread over the other real keys and no weight on padded keys (as a model's
    mask leaves them)."""
    targets = torch.as_tensor(targets)
    b, h, q = targets.shape
    gen = torch.Generator().manual_seed(seed)
    logits = noise * torch.randn(b, h, q, n_keys, generator=gen)
    logits.scatter_(-1, targets[..., None], 6.0)
    real = torch.ones(b, n_keys, dtype=torch.bool) if real_keys is None else real_keys
    logits = logits.masked_fill(~real[:, None, None, :], float("-inf"))
    return torch.softmax(logits, -1)


def _batch(n_queries, n_keys, real_queries=None, real_keys=None):
    b = len(real_queries) if real_queries is not None else 1
    queries = torch.ones(b, n_queries, dtype=torch.bool)
    keys = torch.ones(b, n_keys, dtype=torch.bool)
    for i in range(b):
        if real_queries is not None:
            queries[i, real_queries[i]:] = False
        if real_keys is not None:
            keys[i, real_keys[i]:] = False
    return ProbeBatch(torch.zeros(b, n_queries, dtype=torch.long), queries, False, key_mask=keys)


def _expected(pattern, batch):
    """scipy's Spearman rho of (query position, argmax key) over each example's real queries;
    0 where the argmax is constant (scipy: NaN), NaN under MIN_QUERIES queries."""
    out = np.full(pattern.shape[:2], np.nan)
    for b in range(pattern.shape[0]):
        real = batch.attention_mask[b].numpy()
        positions = np.flatnonzero(real)
        for h in range(pattern.shape[1]):
            if len(positions) < MIN_QUERIES:
                continue
            top = pattern[b, h].numpy()[positions].argmax(-1)
            out[b, h] = 0.0 if np.all(top == top[0]) else spearmanr(positions, top).statistic
    return out


Q, K = 40, 50
I = torch.arange(Q)
CASES = {
    "diagonal": I,
    "offset_plus_3": I + 3,  # decoder i on encoder i + 3
    "offset_minus_1": (I - 1).clamp(min=0),  # the copy probe's "token just read": a tie at the start
    "jittered": (I + torch.randint(-3, 4, (Q,), generator=torch.Generator().manual_seed(1))).clamp(0, K - 1),
    "frames": (I * 5 // 4).clamp(max=K - 1),  # several encoder positions per step (audio frames)
    "plateaus": I // 3,  # three decoder tokens per encoder position: tied argmaxes
    "reversed": Q - 1 - I,
    "random": torch.randint(0, K, (Q,), generator=torch.Generator().manual_seed(2)),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("noise", [0.0, 1.0])
def test_planted_cross_patterns_score_scipys_spearman(case, noise):
    targets = CASES[case].expand(2, 3, Q)  # 2 examples x 3 heads, the same alignment
    pattern = _pattern(targets, K, noise=noise, seed=3)
    batch = _batch(Q, K, real_queries=[Q, Q])
    got = alignment(pattern, batch)
    assert got.shape == (2, 3)
    np.testing.assert_allclose(got.numpy(), _expected(pattern, batch), atol=1e-6)
    if case in ("diagonal", "offset_plus_3", "frames"):  # strictly increasing: 1 whatever the rate or offset
        assert torch.allclose(got, torch.ones(2, 3))
    if case == "reversed":
        assert torch.allclose(got, -torch.ones(2, 3))
    if case in ("offset_minus_1", "jittered", "plateaus"):
        assert (got > 0.95).all()


def test_a_random_head_scores_about_zero():
    n, q, k = 64, 64, 80
    gen = torch.Generator().manual_seed(4)
    pattern = torch.softmax(torch.randn(n, 1, q, k, generator=gen), -1)
    batch = ProbeBatch(torch.zeros(n, q, dtype=torch.long), torch.ones(n, q, dtype=torch.bool), False,
                       key_mask=torch.ones(n, k, dtype=torch.bool))
    got = alignment(pattern, batch)
    np.testing.assert_allclose(got.numpy(), _expected(pattern, batch), atol=1e-6)
    assert abs(got.mean().item()) < 3 / math.sqrt((q - 1) * n)  # three standard errors of the null mean
    assert got.abs().max().item() < 0.5


def test_a_constant_argmax_scores_zero():
    sink = torch.zeros(1, 1, Q, K)
    sink[..., 0] = 1.0  # every decoder query on encoder position 0
    flat = torch.full((1, 1, Q, K), 1 / K)  # exact ties in every row: argmax is the first key
    batch = _batch(Q, K)
    assert alignment(sink, batch).item() == 0.0
    assert alignment(flat, batch).item() == 0.0
    with pytest.warns(Warning):  # scipy's rho is undefined there; the detector says "no dependence"
        assert math.isnan(spearmanr(np.arange(Q), np.zeros(Q)).statistic)


def test_padded_queries_and_keys_are_left_out():
    real_queries, real_keys = [Q, 25, 12], [K, 30, 20]
    keys = torch.ones(3, K, dtype=torch.bool)
    for b, n in enumerate(real_keys):
        keys[b, n:] = False
    # real queries follow their real keys; padded query rows are reversed, to show they are ignored
    targets = torch.stack([torch.where(I < nq, (I * nk // nq).clamp(max=nk - 1), nk - 1 - I.clamp(max=nk - 1))
                           for nq, nk in zip(real_queries, real_keys)])[:, None]
    pattern = _pattern(targets, K, real_keys=keys, noise=0.5, seed=5)
    batch = _batch(Q, K, real_queries, real_keys)
    got = alignment(pattern, batch)
    np.testing.assert_allclose(got.numpy(), _expected(pattern, batch), atol=1e-6)
    assert torch.allclose(got, torch.ones(3, 1))
    assert (pattern[1, 0, :, 30:] == 0).all()  # padded keys carry no weight, so no argmax lands there


def test_too_few_queries_leave_the_example_out():
    pattern = _pattern(I.expand(2, 1, Q), K)
    batch = _batch(Q, K, real_queries=[Q, MIN_QUERIES - 1])
    got = alignment(pattern, batch)
    assert got[0].item() == pytest.approx(1.0) and math.isnan(got[1].item())
    collected = Collected([batch], [{0: got}], n_layers=1, n_heads=1)
    rows = alignment.finalize(collected, None, probe=None, seed=0).rows
    assert rows.n.tolist() == [1] and rows.score.tolist() == [pytest.approx(1.0)]


def test_from_a_notebook_with_the_encoder_mask():
    pattern = _pattern(I.expand(1, 2, Q), K)
    table = alignment(pattern, key_mask=torch.ones(1, K))
    assert table.score.tolist() == [pytest.approx(1.0), pytest.approx(1.0)]


def test_the_label_is_learned_and_needs_the_control_beaten():
    assert alignment.learned and alignment.applies_to == ("cross",) and alignment.probe == "copy"
    assert not alignment.lazy  # it reads each row's argmax
    assert passes(alignment, score=0.95, ci_low=0.90, control_max=float("nan"))  # no control: the threshold
    assert passes(alignment, score=0.95, ci_low=0.90, control_max=0.40)
    assert not passes(alignment, score=0.95, ci_low=0.90, control_max=0.92)  # an untrained head aligns as well
    assert not passes(alignment, score=0.75, ci_low=0.70, control_max=0.10)  # under the threshold


def _cross_attention_scores(model, n_examples=8, seq_len=48) -> Collected:
    """The copy probe through a tiny BART (transformers' eager cross-attention maps), every
    cross-attention layer scored by the detector: what `analyze` will collect at those sites."""
    loaded = SimpleNamespace(tokenizer=char_tokenizer(), model=model, name="tiny-bart")
    probe = CopyProbe(n_examples=n_examples, seq_len=seq_len).build(loaded, seed=0)
    batches, values = probe.batches(4, True, "cpu"), []
    with torch.no_grad():
        for batch in batches:
            out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long(),
                        decoder_input_ids=batch.decoder_input_ids,
                        decoder_attention_mask=batch.decoder_attention_mask.long(), output_attentions=True)
            cross = batch.for_site("cross")
            for pattern in out.cross_attentions:  # (B, H, decoder, encoder)
                assert pattern.shape == (batch.input_ids.shape[0], HEADS, seq_len, seq_len)
            values.append({layer: alignment.reduce(layer, pattern, cross)
                           for layer, pattern in enumerate(out.cross_attentions)})
    return Collected(batches, values, n_layers=len(out.cross_attentions), n_heads=HEADS)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_untrained_encoder_decoder_has_no_alignment_head(seed):
    """No cross-attention head of a random-init tiny BART comes near the threshold on the copy
    probe, so the label is one only training earns (measured: |score| at most 0.114 over the 30
    heads of seeds 0-4, 16 examples)."""
    rows = alignment.finalize(_cross_attention_scores(random_bart(seed)), None, probe=None, seed=0).rows
    assert rows.score.abs().max() < 0.3 < alignment.threshold


@pytest.mark.parametrize("seed", [0, 1])
def test_the_planted_alignment_head_is_found_and_no_other(seed):
    """Inside transformers' own BART cross-attention, the head planted to attend from decoder
    position i to encoder position i is labelled `alignment` against the untrained twin, and no
    other head is (`tests/support/planted_cross.py`)."""
    model = _cross_attention_scores(planted_bart(seed))
    twin = _cross_attention_scores(random_bart(seed + 100))
    rows = alignment.finalize(model, twin, probe=None, seed=0).rows
    planted = rows[(rows["layer"] == 0) & (rows["head"] == 0)].iloc[0]
    assert planted.score > 0.99 and planted.ci_low > planted.control_max
    assert (rows.drop(planted.name).score < alignment.threshold).all()
    labels = label_heads(rows, {"alignment": alignment})
    expected = {(layer, head): "none" for layer in range(2) for head in range(HEADS)}
    assert labels.set_index(["layer", "head"]).label.to_dict() == {**expected, (0, 0): "alignment"}


def test_sink_and_uniform_read_transformers_cross_attention_maps():
    """On the planted BART's cross-attention: sink is the mean of A[i, 0] over every decoder
    query, uniform the entropy over the 48 encoder positions; the planted head is sharp, the
    untouched heads (small random weights) are nearly flat."""
    model = planted_bart(0)
    loaded = SimpleNamespace(tokenizer=char_tokenizer(), model=model, name="tiny-bart")
    batch = CopyProbe(n_examples=4, seq_len=48).build(loaded, seed=0).batches(4, True, "cpu")[0]
    with torch.no_grad():
        maps = model(input_ids=batch.input_ids, decoder_input_ids=batch.decoder_input_ids,
                     output_attentions=True).cross_attentions[0]  # (B, H, decoder, encoder)
    cross = batch.for_site("cross")
    assert torch.allclose(detectors.sink(maps, cross), maps[..., 0].mean(-1))
    entropy = -torch.special.xlogy(maps, maps).sum(-1) / math.log(48)
    uniform = detectors.uniform(maps, cross)
    assert torch.allclose(uniform, entropy.mean(-1), atol=1e-6)
    assert (uniform[:, 0] < 0.05).all() and (uniform[:, 1:] > 0.99).all()

"""Activation patching per head (`headscope.patch`) on the planted model, whose head 1.0 does
induction by reading the previous-token head 0.0: on a repeated sequence (clean) against one
whose second half is new (corrupted), only 1.0's clean activation recovers the gap (denoising)
and only 1.0's corrupted activation destroys it (noising). Against a corruption that also
changes the first half, noising finds both heads of the circuit and denoising only 1.0: the two
directions answer "necessary?" and "sufficient?" (Heimersheim & Nanda 2024)."""
import pytest
import torch

import headscope
from headscope.causal.patching import plot_patching
from tests.support.planted import PLANTED, VOCAB

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
N = 20  # length of each half


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(0)
    first, other = torch.randint(3, VOCAB, (2, 6, N), generator=g)
    clean = torch.cat([first, first], dim=1)  # (B, 2N): the second half repeats the first
    corrupted = torch.cat([first, other], dim=1)  # same first half, new second half

    def metric(logits):  # logit of the clean next token on the second half, per example
        pos = torch.arange(N, 2 * N - 1)
        return logits[:, pos].gather(-1, clean[:, pos + 1, None]).squeeze(-1).mean(-1)

    return clean, corrupted, metric


@pytest.fixture(scope="module")
def fresh_corrupted(prompts):
    """Corrupted prompts with both halves new: 0.0's output (the previous token) now differs too."""
    clean, _, _ = prompts
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, VOCAB, clean.shape, generator=g)


@pytest.mark.parametrize("hook", ["z", "pattern", "result"])
def test_only_the_induction_head_recovers_the_gap(planted, prompts, hook):
    clean, corrupted, metric = prompts
    table = headscope.patch(planted, clean, corrupted, metric, hook=hook)
    assert table.attrs["clean_metric"] - table.attrs["corrupted_metric"] > 10
    effect = {(r.layer, r.head): r.effect for r in table.itertuples()}
    assert len(effect) == 8
    induction = next(h for h, role in PLANTED.items() if role == "induction")
    assert effect.pop(induction) > 0.9
    # 0.0 feeds 1.0, but the first halves agree, so its clean output (the previous token) only
    # differs where the second half starts: it cannot make the corrupted queries find matches.
    assert max(abs(e) for e in effect.values()) < 0.1


@pytest.mark.parametrize("hook", ["z", "pattern"])
def test_noising_only_the_induction_head_loses_the_gap(planted, prompts, hook):
    clean, corrupted, metric = prompts
    table = headscope.patch(planted, clean, corrupted, metric, hook=hook, direction="noising")
    assert table.attrs["direction"] == "noising"
    assert table.attrs["clean_metric"] - table.attrs["corrupted_metric"] > 10
    effect = {(r.layer, r.head): r.effect for r in table.itertuples()}
    assert effect.pop((1, 0)) > 0.9
    assert max(abs(e) for e in effect.values()) < 0.1
    # effect = lost fraction: the patched clean run ends near the corrupted metric
    lost = table.set_index(["layer", "head"]).loc[(1, 0)]
    gap = table.attrs["clean_metric"] - table.attrs["corrupted_metric"]
    assert lost.patched_metric == pytest.approx(table.attrs["clean_metric"] - lost.effect * gap)


def test_noising_finds_both_heads_of_the_circuit_denoising_only_the_last(planted, prompts, fresh_corrupted):
    clean, _, metric = prompts
    noised = headscope.patch(planted, clean, fresh_corrupted, metric, hook="z", direction="noising")
    denoised = headscope.patch(planted, clean, fresh_corrupted, metric, hook="z", direction="denoising")
    noised = {(r.layer, r.head): r.effect for r in noised.itertuples()}
    denoised = {(r.layer, r.head): r.effect for r in denoised.itertuples()}
    # 1.0 needs 0.0's previous tokens (AND): without either the clean run loses the gap ...
    assert noised.pop((0, 0)) > 0.9 and noised.pop((1, 0)) > 0.9
    assert max(abs(e) for e in noised.values()) < 0.1
    # ... but 0.0's clean previous tokens alone cannot make corrupted queries find matches,
    # while 1.0's clean output alone carries the answer.
    assert abs(denoised.pop((0, 0))) < 0.1 and denoised.pop((1, 0)) > 0.9
    assert max(abs(e) for e in denoised.values()) < 0.1


def test_batched_heads_equal_one_head_per_pass(planted, prompts):
    clean, corrupted, metric = prompts
    batched = headscope.patch(planted, clean, corrupted, metric, hook="z")
    single = headscope.patch(planted, {"input_ids": clean}, {"input_ids": corrupted}, metric, hook="z",
                             heads_per_pass=1)
    assert list(batched.columns) == ["layer", "head", "effect", "patched_metric"]
    torch.testing.assert_close(torch.tensor(batched.effect.values), torch.tensor(single.effect.values),
                               atol=1e-4, rtol=0)
    some = headscope.patch(planted, clean, corrupted, metric, heads=[(1, 0), (0, 3)])
    assert list(zip(some["layer"], some["head"])) == [(1, 0), (0, 3)]
    fig = plot_patching(batched)
    assert fig.data[0].z.shape == (2, 4)
    assert fig.data[0].z[1][0] == pytest.approx(batched.effect[4])


def test_patch_refuses_bad_input(planted, prompts):
    clean, corrupted, metric = prompts
    with pytest.raises(headscope.HeadscopeError, match="cannot patch"):
        headscope.patch(planted, clean, corrupted, metric, hook="scores")
    with pytest.raises(headscope.HeadscopeError, match="same shape"):
        headscope.patch(planted, clean, corrupted[:, :-1], metric)
    with pytest.raises(headscope.HeadscopeError, match="unknown direction"):
        headscope.patch(planted, clean, corrupted, metric, direction="forward")
    with pytest.raises(headscope.HeadscopeError, match="no gap"):
        headscope.patch(planted, clean, clean, metric)

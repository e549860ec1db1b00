"""Sparse targets (`headscope.attention.targets`) against the dense masks they replace: the copies
and induction targets of a batch with padding and a start token, built in small query blocks,
the key counts of every site kind, and the masses of a computed map and a lazy pattern."""
import pytest
import torch

from headscope.attention.kernel import attention
from headscope.attention.lazy import lazy_attention
from headscope.attention import targets as targets_module
from headscope.attention.pattern import DensePattern
from headscope.attention.targets import Targets, pairs_in_blocks
from headscope.detectors.patterns.copying import earlier_copies, induction_targets, mass_on
from headscope.probes.base import ProbeBatch


def _batch(causal=True) -> ProbeBatch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 6, (3, 40), generator=g)  # 5 token ids: many earlier copies per query
    ids[:, 0] = 0  # a start token
    mask = torch.ones(3, 40, dtype=torch.bool)
    mask[1, 31:] = False  # padding on the right
    mask[2, 12:] = False
    return ProbeBatch(ids, mask, causal, content_start=1)


def _dense_copies(batch) -> torch.Tensor:
    """The definition written out as a full mask: j < i, same token, both real, j not a start token."""
    ids, valid = batch.input_ids, batch.attention_mask
    t = ids.shape[1]
    same = (ids[:, :, None] == ids[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    same &= torch.ones(t, t, dtype=torch.bool).tril(-1)
    same[:, :, :batch.content_start] = False
    return same


def _dense_induction(batch) -> torch.Tensor:
    copies = _dense_copies(batch)
    out = torch.zeros_like(copies)
    out[:, :, 1:] = copies[:, :, :-1]
    return out & batch.attention_mask[:, None, :]


@pytest.mark.parametrize("block_entries", [1, 97, 1 << 24])
def test_copies_and_induction_targets_equal_their_dense_masks(monkeypatch, block_entries):
    monkeypatch.setattr(targets_module, "BLOCK_ENTRIES", block_entries)
    batch = _batch()
    for built, dense in ((earlier_copies(batch), _dense_copies(batch)), (induction_targets(batch), _dense_induction(batch))):
        assert isinstance(built, Targets) and built.shape == tuple(dense.shape)
        assert torch.equal(built.dense(), dense)
        expected = Targets.of(dense)  # row-major, as nonzero orders them
        assert all(torch.equal(a, b) for a, b in zip((built.b, built.i, built.j), (expected.b, expected.i, expected.j)))
        assert torch.equal(built.queries(), dense.any(-1))
    assert len(earlier_copies(batch)) > 100  # several copies per query: the sums have more than one term


def test_key_counts_equal_the_allowed_keys_at_every_site_kind():
    for batch in (_batch(causal=True), _batch(causal=False)):
        assert torch.equal(batch.key_counts(), batch.key_allowed().sum(-1))
    keys = torch.zeros(2, 7, dtype=torch.bool)
    keys[0, :5], keys[1, :7] = True, True
    queries = torch.tensor([[True, True, True, False], [True, True, False, False]])
    cross = ProbeBatch(torch.zeros(2, 4, dtype=torch.long), queries, False, key_mask=keys)
    assert torch.equal(cross.key_counts(), cross.key_allowed().sum(-1))
    assert cross.key_counts().tolist() == [[5, 5, 5, 0], [7, 7, 0, 0]]


def test_masses_on_targets_equal_the_dense_product():
    batch = _batch()
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 4, 40, 8, generator=g) for _ in range(3))
    mask = batch.attention_mask[:, None, None, :]
    _, pattern = attention(q, k, v, mask=mask, is_causal=True, need_pattern=True)
    _, lazy = lazy_attention(q, k, v, mask=mask, is_causal=True)
    dense = _dense_induction(batch)
    reference = (pattern * dense[:, None]).sum(-1)  # (B, H, T)
    for targets in (induction_targets(batch), dense):
        torch.testing.assert_close(DensePattern(pattern).mass(targets), reference)
        torch.testing.assert_close(lazy.mass(targets), reference, rtol=1e-5, atol=1e-6)
    score = mass_on(pattern, induction_targets(batch))
    rows = dense.any(-1)  # (B, T)
    expected = torch.stack([reference[b][:, rows[b]].mean(-1) for b in range(3)])
    torch.testing.assert_close(score, expected)
    assert reference.sum() > 1.0  # the targets hold real attention


def test_an_empty_set_of_targets():
    empty = Targets.of(torch.zeros(2, 5, 5, dtype=torch.bool))
    assert len(empty) == 0 and not empty.queries().any()
    assert DensePattern(torch.rand(2, 3, 5, 5)).mass(empty).abs().sum() == 0
    none = pairs_in_blocks((2, 0, 0), lambda rows: torch.zeros(2, 0, 0, dtype=torch.bool))
    assert len(none) == 0 and none.shape == (2, 0, 0)

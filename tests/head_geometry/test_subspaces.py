"""Heads as subspaces (`headscope.head_geometry.subspaces`): overlaps of principal angles and circuit ranks,
on modules with known geometry and through `MultiHeadAttention.from_hf` on every family."""
import math

import pytest
import torch

from headscope.attention import MultiHeadAttention
from headscope.hf.adapters import adapter_for, attention_blocks
from headscope.head_geometry.subspaces import chance_overlap, effective_rank, subspace_overlap, subspace_tables
from tests.support.known_geometry import shared_heads
from tests.support.tiny import INTERFACE_FAMILIES, tiny_config, tiny_model

# Families whose adapter builds a MultiHeadAttention (MLA and t5 refuse from_hf by design).
WITH_FROM_HF = [f for f in INTERFACE_FAMILIES if not adapter_for(tiny_config(f, kind="interface")).no_from_hf]


def test_shared_projections_give_overlap_one():
    pairs, heads = subspace_tables([shared_heads()])
    assert len(pairs) == 3
    for role in "qkvo":
        assert pairs[f"overlap_{role}"].tolist() == pytest.approx([1.0] * 3, abs=1e-9)
    assert heads.qk_effective_rank.nunique() == 1


def test_random_projections_overlap_near_chance():
    torch.manual_seed(0)
    modules = [MultiHeadAttention(192, 6) for _ in range(4)]  # d_head 32 in R^192: chance 1/6
    pairs, _ = subspace_tables(modules)
    chance = chance_overlap(32, 192)
    assert pairs.chance.eq(chance).all()
    for role in "qkvo":
        # mean of 60 pairs; the spread of one pair's overlap is ~0.02 here
        assert pairs[f"overlap_{role}"].mean() == pytest.approx(chance, abs=0.02)
        assert pairs[f"overlap_{role}"].max() < 2 * chance


def test_overlap_of_nested_orthogonal_and_empty_subspaces():
    eye = torch.eye(6, dtype=torch.float64)
    assert subspace_overlap(eye[:, :2], eye[:, :4]) == pytest.approx(1.0)  # contained
    assert subspace_overlap(eye[:, :2], eye[:, 2:4]) == pytest.approx(0.0)
    rotated = torch.stack([eye[:, 0], (eye[:, 1] + eye[:, 2]) / 2 ** 0.5], dim=1)  # angles 0 and 45 deg
    assert subspace_overlap(eye[:, :2], rotated) == pytest.approx((1 + 0.5) / 2)
    assert math.isnan(subspace_overlap(eye[:, :0], eye[:, :2]))


def test_effective_rank():
    assert effective_rank(torch.tensor([3.0, 0.0, 0.0])) == pytest.approx(1.0)
    assert effective_rank(torch.ones(5)) == pytest.approx(5.0)
    assert effective_rank(torch.zeros(3)) == 0.0
    assert 1.0 < effective_rank(torch.tensor([2.0, 1.0])) < 2.0


def test_circuit_ranks_match_the_dense_product():
    torch.manual_seed(1)
    module = MultiHeadAttention(40, 4, n_kv_heads=2, d_head=6)
    _, heads = subspace_tables([module])
    d = 6
    for row in heads.itertuples():
        wq = module.W_q.weight[row.head * d:(row.head + 1) * d].T.double()  # (d_model, D)
        wk = module.W_k.weight[row.kv_head * d:(row.kv_head + 1) * d].T.double()
        wv = module.W_v.weight[row.kv_head * d:(row.kv_head + 1) * d].T.double()
        wo = module.W_o.weight[:, row.head * d:(row.head + 1) * d].T.double()  # (D, d_model)
        assert row.qk_effective_rank == pytest.approx(effective_rank(torch.linalg.svdvals(wq @ wk.T)), rel=1e-9)
        assert row.ov_effective_rank == pytest.approx(effective_rank(torch.linalg.svdvals(wv @ wo)), rel=1e-9)
    assert heads.kv_head.tolist() == [0, 0, 1, 1]


def test_gqa_heads_of_one_group_share_keys_and_values():
    torch.manual_seed(2)
    pairs, _ = subspace_tables([MultiHeadAttention(64, 4, n_kv_heads=2)])
    same = pairs[pairs.same_kv_group]
    assert len(same) == 2
    assert same.overlap_k.tolist() == pytest.approx([1.0, 1.0])
    assert same.overlap_v.tolist() == pytest.approx([1.0, 1.0])
    assert (pairs[~pairs.same_kv_group].overlap_k < 0.9).all()


@pytest.mark.parametrize("family", WITH_FROM_HF)
def test_every_family_through_from_hf(family):
    model = tiny_model(family, kind="interface")
    modules = [MultiHeadAttention.from_hf(block, model.config) for _, block in attention_blocks(model)]
    pairs, heads = subspace_tables(modules)
    n = modules[0].config.n_heads
    assert len(heads) == len(modules) * n
    assert len(pairs) == len(modules) * n * (n - 1) // 2
    assert pairs.overlap_q.between(0, 1 + 1e-9).all()
    d_head = heads.layer.map(lambda layer: modules[layer].config.d_head)  # gemma4's full-attention heads are larger
    assert (heads.qk_effective_rank >= 1).all() and (heads.qk_effective_rank <= d_head).all()

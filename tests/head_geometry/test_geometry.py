"""Pattern similarity, redundancy and clusters (`headscope.head_geometry.similarity`, `headscope.head_geometry.run`):
the thought experiment of heads with shared projections, random heads, and the planted model."""
import numpy as np
import pytest
import torch

import headscope
from headscope.attention import MultiHeadAttention
from headscope.head_geometry.run import geometry, plot_geometry, redundant_pairs
from headscope.head_geometry.similarity import DivergenceAccumulator, average_linkage_clusters, classical_mds, row_js
from headscope.head_geometry.subspaces import chance_overlap, subspace_tables
from tests.support.planted import D_HEAD, PLANTED
from tests.support.known_geometry import shared_heads

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def module_divergence(modules, x, top_k=8):
    """Mean JS between all heads of stacked modules, each fed the same input x (B, T, d_model)."""
    acc = DivergenceAccumulator(len(modules), modules[0].config.n_heads, top_k)
    t = x.shape[1]
    allowed = torch.ones(t, t, dtype=torch.bool).tril().expand(x.shape[0], t, t)  # (B, Tq, Tk)
    for layer, module in enumerate(modules):
        _, pattern = module(x, return_pattern=True)  # (B, H, Tq, Tk)
        acc.add_layer(layer, pattern, allowed)
    acc.end_batch()
    return acc


def test_shared_projections_are_all_redundant():
    modules = [shared_heads(seed=s) for s in (0, 1)]
    x = torch.randn(2, 12, 96) * 3
    acc = module_divergence(modules, x)
    js = acc.divergence().numpy()
    assert np.abs(js[:3, :3]).max() < 1e-6 and np.abs(js[3:, 3:]).max() < 1e-6  # same layer: same pattern
    pairs, _ = subspace_tables(modules)
    pairs = redundant_pairs(pairs, js, 3)
    assert pairs.overlap.tolist() == pytest.approx([1.0] * 6)
    assert pairs.redundant.all()


def test_random_projections_overlap_at_chance_and_nothing_is_redundant():
    torch.manual_seed(0)
    modules = [MultiHeadAttention(192, 6) for _ in range(3)]
    x = torch.randn(2, 16, 192)
    js = module_divergence(modules, x).divergence().numpy()
    pairs, _ = subspace_tables(modules)
    pairs = redundant_pairs(pairs, js, 6)
    assert pairs.overlap.mean() == pytest.approx(chance_overlap(32, 192), abs=0.02)
    assert not pairs.redundant.any()


def test_top_k_rows_are_exact_when_rows_have_at_most_k_keys():
    g = torch.Generator().manual_seed(0)
    pattern = torch.rand(2, 3, 6, 6, generator=g).tril()  # (B, H, Tq, Tk): at most 6 keys per row
    allowed = torch.ones(6, 6, dtype=torch.bool).tril().expand(2, 6, 6)
    acc = DivergenceAccumulator(2, 3, top_k=6)
    acc.add_layer(0, pattern, allowed)
    acc.add_layer(1, pattern.flip(1), allowed)  # layer 1 head h = layer 0 head 2 - h
    acc.end_batch()
    assert acc.approximation_error() < 1e-6
    js = acc.divergence().numpy()
    for h in range(3):
        assert js[h, 3 + 2 - h] == pytest.approx(0.0, abs=1e-6)
    p = pattern / pattern.sum(-1, keepdim=True)
    rows = torch.ones(6, dtype=torch.bool); rows[0] = False  # row 0 sees one key: not counted
    expected = row_js(p[:, 0, rows], p[:, 1, rows]).mean()
    assert js[0, 1] == pytest.approx(float(expected), abs=1e-6)
    assert js[0, 4] == pytest.approx(float(expected), abs=1e-6)  # cross-layer, exact at k = 6


def test_clusters_and_mds():
    d = np.array([[0, .1, .9, .9], [.1, 0, .9, .9], [.9, .9, 0, .05], [.9, .9, .05, 0]])
    assert average_linkage_clusters(d, 0.3).tolist() == [0, 0, 1, 1]
    assert average_linkage_clusters(d, 0.01).tolist() == [0, 1, 2, 3]
    points = np.array([[0, 0], [3, 0], [0, 4]], dtype=float)
    dist = np.linalg.norm(points[:, None] - points[None], axis=-1)
    coords = classical_mds(dist)
    assert np.linalg.norm(coords[:, None] - coords[None], axis=-1) == pytest.approx(dist, abs=1e-9)


def duplicate_head(model, layer, source, target):
    """Copy one head's q/k/v columns and W_O rows into another head of a GPT-2 block."""
    attn = model.transformer.h[layer].attn
    d_model = model.config.n_embd
    with torch.no_grad():
        for part in range(3):  # c_attn is Conv1D (d_model, 3 * d_model): q | k | v
            src = slice(part * d_model + source * D_HEAD, part * d_model + (source + 1) * D_HEAD)
            dst = slice(part * d_model + target * D_HEAD, part * d_model + (target + 1) * D_HEAD)
            attn.c_attn.weight[:, dst] = attn.c_attn.weight[:, src]
            attn.c_attn.bias[dst] = attn.c_attn.bias[src]
        attn.c_proj.weight[target * D_HEAD:(target + 1) * D_HEAD] = attn.c_proj.weight[source * D_HEAD:(source + 1) * D_HEAD]


@pytest.fixture(scope="module")
def planted_duplicate_head_geometry(planted_dir):
    loaded = headscope.load(str(planted_dir), device="cpu")  # its own copy: a head is edited
    duplicate_head(loaded.model, 1, 1, 3)  # 1.3 becomes a copy of the duplicate-token head 1.1
    return geometry(loaded, n_examples=8, seq_len=48, importance=True, pruning_steps=4, seeds=(0, 1))


@pytest.mark.slow  # planted_duplicate_head_geometry (importance, pruning curve, two seeds) takes 25-35 s
def test_planted_heads_land_in_different_clusters(planted_duplicate_head_geometry):
    heads = planted_duplicate_head_geometry.heads.set_index(["layer", "head"])
    clusters = [heads.cluster[h] for h in PLANTED if h != (1, 1)]  # 1.1's copy 1.3 shares its cluster
    assert len(set(clusters)) == len(clusters)
    assert heads.cluster[(1, 1)] == heads.cluster[(1, 3)]
    assert heads.cluster[(1, 1)] not in clusters


@pytest.mark.slow
def test_duplicated_head_is_the_only_redundant_pair(planted_duplicate_head_geometry):
    red = planted_duplicate_head_geometry.redundant
    assert [(r.layer, r.head_a, r.head_b) for r in red.itertuples()] == [(1, 1, 3)]
    assert red.js[0] < 1e-6 and red.overlap[0] == pytest.approx(1.0)


@pytest.mark.slow
def test_planted_importance_and_pruning_curve(planted_duplicate_head_geometry):
    heads = planted_duplicate_head_geometry.heads.set_index(["layer", "head"])
    # only 0.0 and 1.0 write anything (the other planted heads have W_V = 0, so their gate has no effect)
    writers = {(0, 0), (1, 0)}
    assert all(heads.importance[h] > 0 for h in writers)
    assert all(heads.importance[h] == 0 for h in heads.index if h not in writers)
    curve = planted_duplicate_head_geometry.curve
    assert set(curve.order) == {"importance", "random"}
    assert curve.groupby(["order", "seed"]).removed.max().eq(8).all()
    by_importance = curve[curve.order == "importance"].set_index("removed").loss
    assert by_importance[6] == pytest.approx(by_importance[0], abs=1e-5)  # the six silent heads go first
    assert by_importance[8] > by_importance[0]
    fig = plot_geometry(planted_duplicate_head_geometry)
    assert len(fig.data[0].x) == 8


def test_geometry_command_writes_tables_and_figure(planted_dir, tmp_path):
    from typer.testing import CliRunner

    from headscope.cli import app

    result = CliRunner().invoke(app, ["geometry", str(planted_dir), "--out", str(tmp_path / "out"), "--device", "cpu",
                                      "--seq-len", "48", "--no-importance"])
    assert result.exit_code == 0, result.output
    import pandas as pd

    heads = pd.read_csv(tmp_path / "out" / "heads.csv")
    assert len(heads) == 8 and heads.importance.isna().all()
    assert (tmp_path / "out" / "geometry.html").stat().st_size > 0
    assert not (tmp_path / "out" / "pruning.csv").exists()

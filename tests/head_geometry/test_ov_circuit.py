"""OV copying against hand-set circuits, the planted model and random-init models."""
import pytest
import torch

import headscope
from headscope.loading.loader import Loaded
from headscope.head_geometry.ov_circuit import ov_scores
from tests.support.planted import char_tokenizer
from tests.support.tiny import tiny_model

VOCAB, D, DH = 99, 36, 12


def test_identity_circuit_copies_and_a_random_one_is_at_chance():
    g = torch.Generator().manual_seed(0)
    W_E, W_V, W_O = torch.randn(VOCAB, D, generator=g), torch.eye(D)[:, :DH], torch.eye(D)[:DH]
    W_U = torch.linalg.pinv(W_E @ W_V @ W_O)  # (D, V): the circuit is a projector of rank DH
    assert ov_scores(W_E, W_V, W_O, W_U, block_size=16)[1] == pytest.approx(1.0)  # eigenvalues 1 and 0
    # A full-rank identity through W_E and W_U: every token's own logit is the top of its row.
    top1, share = ov_scores(torch.eye(VOCAB), torch.eye(VOCAB), torch.eye(VOCAB), 3 * torch.eye(VOCAB), block_size=10)
    assert (top1, share) == (1.0, pytest.approx(1.0))
    tops, shares = [], []
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        mats = [torch.randn(*s, generator=g) for s in ((VOCAB, D), (D, DH), (DH, D), (D, VOCAB))]
        top1, share = ov_scores(*mats, block_size=32)
        tops.append(top1)
        shares.append(share)
    # chance: 1 / vocab for top-1; for eigenvalues of a random real matrix (complex pairs) about 0.3-0.5
    assert sum(tops) / len(tops) < 3 / VOCAB
    assert 0.2 < sum(shares) / len(shares) < 0.5


def test_rows_in_blocks_and_a_sample_give_the_same_answer():
    g = torch.Generator().manual_seed(1)
    mats = [torch.randn(*s, generator=g) for s in ((VOCAB, D), (D, DH), (DH, D), (D, VOCAB))]
    mats[2] = mats[1].T @ torch.eye(D)  # W_O = W_V^T: a positive semidefinite-ish circuit, not trivially 0
    whole = ov_scores(*mats, block_size=VOCAB)
    assert ov_scores(*mats, block_size=7) == whole
    rows = torch.arange(0, VOCAB, 3)
    sampled = ov_scores(*mats, block_size=5, rows=rows)
    assert sampled[1] == whole[1] and 0.0 <= sampled[0] <= 1.0


def test_planted_induction_head_copies(planted):
    table = headscope.ov_copying(planted).set_index(["layer", "head"])
    assert table.copy_top1[(1, 0)] == 1.0 and table.positive_eig_share[(1, 0)] == pytest.approx(1.0)
    # 0.0 writes the previous token into its own block, which W_U does not read: nothing is copied
    assert table.copy_top1[(0, 0)] == 0.0


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_random_init_heads_copy_at_chance(family):
    loaded = Loaded.from_model(tiny_model(family, seed=3), char_tokenizer(), f"random-{family}")
    table = headscope.ov_copying(loaded, block_size=40)
    assert len(table) == 2 * loaded.n_heads
    assert table.copy_top1.mean() < 5 / VOCAB
    assert table.positive_eig_share.between(0.0, 0.9).all()

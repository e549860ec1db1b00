"""Heads as subspaces, read from the weights of `MultiHeadAttention` modules.

- `head_bases(module)`: orthonormal bases of each head's W_Q, W_K, W_V (read directions, column
  space of the head's slice of the projection, in the d_in the projections read: d_model but for
  zamba2's 2 * d_model) and W_O (write directions in d_model, row space of the head's rows of the
  output projection).
- `subspace_overlap(basis_a, basis_b)`: mean squared cosine of the principal angles.
- `effective_rank(singular_values)`: Roy & Vetterli's entropy-based effective rank.
- `subspace_tables(modules, layers)`: per layer, the pairwise overlaps of its heads and each head's
  QK and OV effective ranks, as two tidy DataFrames.
- `chance_overlap(d, n)`: the expected overlap of two independent random subspaces.

Overlap of subspaces A (dim a) and B (dim b) with orthonormal bases Q_A [n, a], Q_B [n, b]:
    cos theta_i = singular values of Q_A^T Q_B,
    overlap = sum_i cos^2 theta_i / min(a, b) = ||Q_A^T Q_B||_F^2 / min(a, b)
(0: orthogonal, 1: one contains the other). For independent uniformly random subspaces
E||Q_A^T Q_B||_F^2 = a b / n, so the chance value is max(a, b) / n (d / n for equal dims).

Effective rank (Roy & Vetterli 2007): with p_i = s_i / sum_j s_j over singular values s,
erank = exp(-sum_i p_i log p_i), between 1 (rank one) and the rank (all s_i equal).
QK circuit of head h: W_Q^h W_K^h^T [d_in, d_in]; OV circuit: W_V^h W_O^h [d_in, d_model]
(what the head writes from what it reads); ranks <= d_head (QK) and d_value (OV), and their singular values are
those of a small square product (W = U R by QR, so A B^T = U_A (R_A R_B^T) U_B^T).

What is left out, and why: biases (they add a constant, not a direction), q/k norms and rotary
(the QK circuit here is the position-free bilinear form before rotary), layer norms before the
block (not folded in), and an output gate (Qwen3-Next's z * sigmoid(W_gate x)): it scales each of a
head's d_head coordinates by a positive factor that depends on the input, so the head's read and
write subspaces are exact without it, while its OV effective rank is that of W_V W_O, the gate left
out (the OV table refuses such heads, `headscope.head_geometry.ov_circuit`). With grouped-query attention the K and V bases are per key/value head;
query heads of one group share them, so their K and V overlaps are 1 by construction
(`same_kv_group` in the table says which pairs). Under multi-head latent attention (DeepSeek-V2/V3)
the maps are `MultiHeadAttention.input_weights()`: through the latents, their norms' gains folded in
and per-token scales left out like the residual norms'; every head's K subspace holds the d_rope
directions of the rotary key all heads share, so K overlaps between heads are at least that shared
part. A head whose projection is all zeros has an empty subspace: its overlaps are NaN.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from ..attention.module import MultiHeadAttention
from ..errors import HeadscopeError

__all__ = ["head_bases", "subspace_overlap", "effective_rank", "subspace_tables", "chance_overlap", "ROLES"]

ROLES = ("q", "k", "v", "o")
RANK_TOL = 1e-6  # singular values below RANK_TOL * largest count as zero


def chance_overlap(d: int, n: int) -> float:
    """Expected overlap of two independent uniformly random d-dim subspaces of R^n: d / n."""
    return d / n


def _orthonormal(matrix: torch.Tensor) -> torch.Tensor:
    """Orthonormal basis `[n, rank]` of the column space of `matrix` `[n, d]`."""
    u, s, _ = torch.linalg.svd(matrix.double(), full_matrices=False)
    if s.numel() == 0 or s[0] <= 0:
        return u[:, :0]
    return u[:, s > RANK_TOL * s[0]]


def _head_slices(module: MultiHeadAttention) -> dict[str, list[torch.Tensor]]:
    """Each head's projection as `[d_in, d_head]` (q, k, v) or `[d_model, d_head]` (o) matrices, per
    role (k and v per KV head)."""
    cfg = module.config
    d, dv = cfg.d_head, cfg.d_value
    w_q, w_k, w_v = (w.detach() for w in module.input_weights())  # a latent's folded maps (gains in)

    def read(weight, n, size):  # nn.Linear weight (n * size, d_in) -> n x (d_in, size)
        return [weight[i * size:(i + 1) * size].T for i in range(n)]

    return {
        "q": read(w_q, cfg.n_heads, d),
        "k": read(w_k, cfg.n_kv_heads, d),
        "v": read(w_v, cfg.n_kv_heads, dv),
        # W_o weight (d_model, n * dv): head h writes through columns h*dv:(h+1)*dv
        "o": [module.W_o.weight.detach()[:, h * dv:(h + 1) * dv] for h in range(cfg.n_heads)],
    }


def head_bases(module: MultiHeadAttention) -> dict[str, list[torch.Tensor]]:
    """`{role: [basis [d_in or d_model, rank] per head]}`; "k" and "v" hold one basis per KV head."""
    return {role: [_orthonormal(m) for m in mats] for role, mats in _head_slices(module).items()}


def subspace_overlap(basis_a: torch.Tensor, basis_b: torch.Tensor) -> float:
    """Mean squared cosine of the principal angles between two subspaces (NaN if one is empty)."""
    dim = min(basis_a.shape[1], basis_b.shape[1])
    if dim == 0:
        return math.nan
    return float((basis_a.T @ basis_b).square().sum() / dim)


def effective_rank(singular_values: torch.Tensor) -> float:
    """exp(entropy of s / sum(s)) (Roy & Vetterli 2007); 0 for an all-zero matrix."""
    s = singular_values.detach().double().clamp(min=0)
    total = s.sum()
    if total <= 0:
        return 0.0
    p = s / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def _circuit_singular_values(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """Singular values of left @ right^T for `[n, d]` factors, through d x d QR factors."""
    _, r_left = torch.linalg.qr(left.double())  # (d, d)
    _, r_right = torch.linalg.qr(right.double())
    return torch.linalg.svdvals(r_left @ r_right.T)


def subspace_tables(modules: Sequence[MultiHeadAttention], layers: Optional[Sequence[int]] = None):
    """Pairwise overlaps within each layer and per-head circuit ranks.

    Args:
        modules: one `MultiHeadAttention` per attention layer.
        layers: the model's number of each module's layer (a hybrid's 1 and 3 of 4); by default
            its position in `modules`.
    Returns:
        `(pairs, heads)` DataFrames. `pairs`: layer, head_a, head_b (a < b), overlap_q,
        overlap_k, overlap_v, overlap_o, overlap (mean of those not NaN), same_kv_group, chance
        (the mean over the four roles of the role's size, d_head for q and k, d_value for v and o,
        over the width its subspace lives in: d_head / d_model where the projections read d_model
        and values are d_head wide). `heads`: layer, head, kv_head, dim_q, dim_k,
        dim_v, dim_o (subspace ranks), qk_effective_rank, ov_effective_rank.
    """
    import pandas as pd

    layers = range(len(modules)) if layers is None else [int(l) for l in layers]
    if len(layers) != len(modules):
        raise HeadscopeError(f"subspace_tables got {len(modules)} modules and {len(layers)} layer numbers")
    pair_rows, head_rows = [], []
    for layer, module in zip(layers, modules):
        cfg = module.config
        group = cfg.n_heads // cfg.n_kv_heads
        kv_of = lambda h: h // group
        slices = _head_slices(module)
        chance = chance_overlap(cfg.d_head, cfg.d_model)
        if cfg.d_in != cfg.d_model or cfg.d_value != cfg.d_head:  # q, k, v read d_in (zamba2: wider), o writes
            # d_model; v and o are d_value wide (multi-head latent attention's values are smaller than q, k)
            chance = (2 * chance_overlap(cfg.d_head, cfg.d_in) + chance_overlap(cfg.d_value, cfg.d_in)
                      + chance_overlap(cfg.d_value, cfg.d_model)) / 4
        bases = {role: [_orthonormal(m) for m in mats] for role, mats in slices.items()}
        for h in range(cfg.n_heads):
            kv = kv_of(h)
            qk = _circuit_singular_values(slices["q"][h], slices["k"][kv])
            # OV: W_V^h [n, d] then W_O^h: x W_V W_O, with W_O^h = slices["o"][h]^T [d, n]
            ov = _circuit_singular_values(slices["v"][kv], slices["o"][h])
            head_rows.append(dict(
                layer=layer, head=h, kv_head=kv,
                **{f"dim_{r}": bases[r][kv if r in "kv" else h].shape[1] for r in ROLES},
                qk_effective_rank=effective_rank(qk), ov_effective_rank=effective_rank(ov),
            ))
        for a in range(cfg.n_heads):
            for b in range(a + 1, cfg.n_heads):
                row = dict(layer=layer, head_a=a, head_b=b)
                for r in ROLES:
                    ia, ib = (kv_of(a), kv_of(b)) if r in "kv" else (a, b)
                    row[f"overlap_{r}"] = subspace_overlap(bases[r][ia], bases[r][ib])
                known = [row[f"overlap_{r}"] for r in ROLES if not math.isnan(row[f"overlap_{r}"])]
                row["overlap"] = sum(known) / len(known) if known else math.nan
                row["same_kv_group"] = kv_of(a) == kv_of(b)
                row["chance"] = chance
                pair_rows.append(row)
    return pd.DataFrame(pair_rows), pd.DataFrame(head_rows)

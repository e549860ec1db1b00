"""Multi-head latent attention (MLA), DeepSeek-V2's attention (DeepSeek-AI 2024, arXiv 2405.04434, §2.1).

Keys and values of every head come from one low-rank latent per token, and a small rotary key is
shared by all heads ("decoupled RoPE"), so a KV cache holds `kv_rank + d_rope` numbers per token:

    c_KV = RMSNorm(W_DKV x)                        [batch, pos, kv_rank]
    k_R  = RoPE(W_KR x)                            [batch, pos, d_rope], one for all heads
    k_h  = [W_UK,h c_KV ; k_R]                     [batch, pos, d_nope + d_rope]
    v_h  = W_UV,h c_KV                             [batch, pos, d_value]
    c_Q  = RMSNorm(W_DQ x)   (x itself when q_rank is None: one full-rank W_Q)
    q_h  = [W_UQ,h c_Q ; RoPE(W_QR,h c_Q)]         [batch, pos, d_nope + d_rope]

then softmax(q_h k_h^T * scale) v_h and W_O as in any `MultiHeadAttention`, which takes these
projections with `latent=LatentRanks(...)`: its `d_head` is d_nope + d_rope, its `d_value` the
values' size, its `rotary_dim` d_rope (or 0: the shared key is not rotated, as in Kimi Linear).

- `LatentRanks`: the latents' widths, the shared key's width and the latent norms' epsilon.
- `LatentProjections`: the module computing q, k, v that way; its parameters, as DeepSeek's
  checkpoints store them (`W_kv_down` is `kv_a_proj_with_mqa`):

      W_q         d_in -> heads * (d_nope + d_rope)        (q_rank None)
      W_q_down    d_in -> q_rank, then `q_norm`, then
      W_q_up      q_rank -> heads * (d_nope + d_rope)      per head [nope | rope]
      W_kv_down   d_in -> kv_rank + d_rope                 [latent | shared rotary key]
      kv_norm, then
      W_kv_up     kv_rank -> heads * (d_nope + d_value)    per head [key nope | value]

  Rotary turns the last d_rope dims of q and k ("rotate half", or pairs (2i, 2i + 1) when
  interleaved, left in the stored order, or regrouped as DeepSeek-V3 does: `LatentRanks.regroup`). `input_weights()` gives the linear maps from x to q, k,
  v: the latent norms' gains folded in, their per-token scales left out (the geometry and OV
  tables read them, as they leave out the residual norms' scales).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from .rotary import apply_rotary

__all__ = ["LatentRanks", "LatentProjections"]


@dataclass(frozen=True)
class LatentRanks:
    """Sizes of multi-head latent attention beside the head sizes.

    Attributes:
        kv_rank: width of the key/value latent c_KV.
        d_rope: per-head query dims with rotary, and the shared rotary key's width (the last
            d_rope of d_head).
        q_rank: width of the query latent c_Q (None: queries straight from x through W_q).
        norm_eps: epsilon of the latent RMSNorms (replaceable by any module mapping
            `[batch, pos, rank]` to itself, as from_hf puts the model's own there).
        regroup: the rotary part, stored as pairs (2i, 2i + 1), is regrouped to
            `[evens | odds]` before a "rotate half" rotation (DeepSeek-V3's `rope_interleave`):
            the pairs rotate as interleaved ones would, and q and k keep the regrouped order.
    """

    kv_rank: int
    d_rope: int
    q_rank: Optional[int] = None
    norm_eps: float = 1e-6
    regroup: bool = False


class LatentProjections(nn.Module):
    """q, k and v of multi-head latent attention (the module docstring's formulas).

    Args:
        ranks: the latents' sizes.
        d_in: width of the input.
        n_heads: heads (each with its own key and value).
        d_head: per-head query/key size, d_nope + d_rope.
        d_value: per-head value size.
        bias: biases on the down projections (or on W_q without a query latent); the up
            projections have none.
    """

    def __init__(self, ranks: LatentRanks, d_in: int, n_heads: int, d_head: int, d_value: int, bias: bool = False,
                 device=None, dtype=None):
        super().__init__()
        if not 0 <= ranks.d_rope <= d_head:
            raise ValueError(f"the latent's d_rope must be between 0 and d_head={d_head}, got {ranks.d_rope}")
        self.ranks, self.n_heads, self.d_head, self.d_value = ranks, n_heads, d_head, d_value
        self.d_nope = d_head - ranks.d_rope
        kw = dict(device=device, dtype=dtype)
        q_width = n_heads * d_head
        if ranks.q_rank is None:
            self.W_q = nn.Linear(d_in, q_width, bias=bias, **kw)
            self.W_q_down = self.q_norm = self.W_q_up = None
        else:
            self.W_q = None
            self.W_q_down = nn.Linear(d_in, ranks.q_rank, bias=bias, **kw)
            self.q_norm = nn.RMSNorm(ranks.q_rank, eps=ranks.norm_eps, **kw)
            self.W_q_up = nn.Linear(ranks.q_rank, q_width, bias=False, **kw)
        self.W_kv_down = nn.Linear(d_in, ranks.kv_rank + ranks.d_rope, bias=bias, **kw)  # [c_KV | k_R]
        self.kv_norm = nn.RMSNorm(ranks.kv_rank, eps=ranks.norm_eps, **kw)
        self.W_kv_up = nn.Linear(ranks.kv_rank, n_heads * (self.d_nope + d_value), bias=False, **kw)  # per head [k | v]

    def forward(self, x: torch.Tensor, source: torch.Tensor, rotary, interleaved: bool) -> tuple[torch.Tensor, ...]:
        """q `[B, H, T, D]`, k `[B, H, S, D]`, v `[B, H, S, Dv]` from x and the keys' and values'
        `source` (x, or a context); `rotary`: `(cos, sin)` `[..., pos, d_rope]`, or None (no rotation)."""
        B, T, _ = x.shape
        S = source.shape[1]
        H, nope, rope = self.n_heads, self.d_nope, self.ranks.d_rope
        q = self.W_q(x) if self.W_q is not None else self.W_q_up(self.q_norm(self.W_q_down(x)))  # (B, T, H * D)
        q_nope, q_rope = q.view(B, T, H, self.d_head).transpose(1, 2).split([nope, rope], dim=-1)  # (B, H, T, *)
        latent, k_rope = self.W_kv_down(source).split([self.ranks.kv_rank, rope], dim=-1)  # (B, S, r), (B, S, rope)
        kv = self.W_kv_up(self.kv_norm(latent)).view(B, S, H, nope + self.d_value).transpose(1, 2)  # (B, H, S, *)
        k_nope, v = kv.split([nope, self.d_value], dim=-1)  # (B, H, S, nope), (B, H, S, Dv)
        k_rope = k_rope[:, None]  # (B, 1, S, rope): one rotary key for every head
        if self.ranks.regroup:  # pairs (2i, 2i + 1) -> (i, i + rope / 2)
            q_rope, k_rope = _regrouped(q_rope), _regrouped(k_rope)
        if rotary is not None:
            cos, sin = rotary
            q_rope, k_rope = apply_rotary(q_rope, cos, sin, interleaved), apply_rotary(k_rope, cos, sin, interleaved)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, D)
        k = torch.cat([k_nope, k_rope.expand(B, H, S, rope)], dim=-1)  # (B, H, S, D)
        return q, k, v

    def input_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(W_q, W_k, W_v)`, Linear-style `(rows, d_in)` (`H * D`, `H * D`, `H * Dv` rows): the linear
        maps from x to q, k and v before rotary, the latent norms' gains folded in (g ⊙ (W_down x)),
        their per-token 1 / rms left out, the shared rotary key's rows repeated for every head."""
        H, nope, rope, rank = self.n_heads, self.d_nope, self.ranks.d_rope, self.ranks.kv_rank
        if self.W_q is not None:
            w_q = self.W_q.weight
        else:
            w_q = self.W_q_up.weight @ _gained(self.q_norm, self.W_q_down.weight)  # (H * D, d_in)
        down = self.W_kv_down.weight  # (r + rope, d_in)
        up = self.W_kv_up.weight.view(H, nope + self.d_value, rank)  # (H, nope + Dv, r)
        latent = _gained(self.kv_norm, down[:rank])  # (r, d_in)
        k_rope = down[rank:].expand(H, rope, down.shape[1])  # (H, rope, d_in)
        w_k = torch.cat([up[:, :nope] @ latent, k_rope], dim=1).reshape(H * self.d_head, -1)  # (H * D, d_in)
        if self.ranks.regroup:  # the rotary rows in the order q and k take
            w_q, w_k = (_regrouped(w.view(H, self.d_head, -1).transpose(1, 2), nope).transpose(1, 2).reshape(w.shape)
                        for w in (w_q, w_k))
        w_v = (up[:, nope:] @ latent).reshape(H * self.d_value, -1)  # (H * Dv, d_in)
        return w_q, w_k, w_v


def _regrouped(x: torch.Tensor, start: int = 0) -> torch.Tensor:
    """The last dim's entries from `start` on, pairs (2i, 2i + 1), regrouped as `[evens | odds]`."""
    rest = x[..., start:]
    return torch.cat([x[..., :start], rest[..., 0::2], rest[..., 1::2]], dim=-1)


def _gained(norm: nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """`diag(g) weight` for a norm computing g ⊙ x / rms(x) (its `weight` g), else `weight`."""
    gain = getattr(norm, "weight", None)
    return weight if gain is None else gain[:, None] * weight

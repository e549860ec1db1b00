"""The fused row log-sum-exp on CUDA: torch's FlexAttention.

On the CPU the lazy path gets z and each row's log-sum-exp from aten's flash kernel (the one
public SDPA calls there). CUDA has no public kernel returning the log-sum-exp besides
FlexAttention (`torch.nn.attention.flex_attention`), which computes, in one fused pass over
key blocks (online softmax, statistics in fp32 whatever the input dtype):

    s_ij = score_mod(scale * q_i . k_j),  lse_i = log sum_j exp(s_ij),  z_i = sum_j exp(s_ij - lse_i) v_j

with the keys a `block_mask` hides skipped block by block. headscope's score_mod is
cap(s) + m_ij: the soft-cap c * tanh(s / c) (Gemma 2) and then the additive mask (padding,
sliding windows, T5's position bias), read from the mask tensor at (b, h, i, j). The causal
rule is a block mask (queries aligned to the last keys), so hidden blocks cost nothing. Grouped
keys and values are read in place (`enable_gqa`), never expanded.

- `flex_available(device)`: whether the fused kernel can run here (CUDA with Triton).
- `flex_stats(q, k, v, additive, is_causal, scale, softcap, compiled=True)`: `(z, lse)`.

Compiled (`torch.compile`) is the fused kernel; uncompiled, torch runs the same computation
densely, which is how the CPU tests check this module's masks and score_mod against full maps.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

import torch

__all__ = ["flex_available", "flex_stats"]


def flex_available(device) -> bool:
    """True on a CUDA device when torch has FlexAttention and Triton to compile it."""
    if torch.device(device).type != "cuda":
        return False
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
        from torch.utils._triton import has_triton
    except ImportError:
        return False
    return bool(has_triton())


@lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@lru_cache(maxsize=32)
def _causal_block_mask(n_query: int, n_key: int, device: str):
    """Keys after each query hidden, queries aligned to the last keys (as `causal_mask`)."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset = n_key - n_query

    def visible(b, h, i, j):
        return i + offset >= j

    return create_block_mask(visible, None, None, n_query, n_key, device=device)


def _score_mod(additive: Optional[torch.Tensor], softcap: Optional[float]):
    """cap(s) + m[b, h, i, j]; a mask axis of size 1 is read at index 0 (broadcast)."""
    if additive is None and softcap is None:
        return None
    if additive is not None:
        whole_batch, whole_heads = additive.shape[0] > 1, additive.shape[1] > 1

    def modified(score, b, h, i, j):
        if softcap is not None:
            score = softcap * torch.tanh(score / softcap)
        if additive is not None:
            score = score + additive[b if whole_batch else 0, h if whole_heads else 0, i, j].to(score.dtype)
        return score

    return modified


def flex_stats(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, additive: Optional[torch.Tensor],
               is_causal: bool, scale: float, softcap: Optional[float] = None, compiled: bool = True):
    """z and the row log-sum-exp of softmax(cap(scale * q k^T) + additive) v in one fused pass.

    Args:
        q: `[batch, head, query, d]`; k `[batch, kv_head, key, d]`; v `[batch, kv_head, key, d_v]`.
        additive: float mask `[batch or 1, head or 1, query, key]` (0 visible, the dtype's
            minimum hidden) or None.
        is_causal: hide keys after each query (a block mask: hidden blocks are skipped).
        scale, softcap: as in `lazy_attention`.
        compiled: the Triton kernel (CUDA); False runs torch's dense reference (tests).
    Returns:
        `(z [batch, head, query, d_v] in v's dtype, lse [batch, head, query] fp32)`.
    """
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    block_mask = _causal_block_mask(q.shape[-2], k.shape[-2], str(q.device)) if is_causal else None
    run = _compiled_flex() if compiled else flex_attention
    z, aux = run(q, k, v, score_mod=_score_mod(additive, softcap), block_mask=block_mask, scale=scale,
                 enable_gqa=k.shape[1] != q.shape[1], return_aux=AuxRequest(lse=True))
    return z.to(v.dtype), aux.lse.float()

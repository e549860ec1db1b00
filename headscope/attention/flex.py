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

- `flex_available(device)`: whether the fused kernel can run here (CUDA with Triton); heads
  narrower than `MIN_HEAD_DIM` take the blockwise path instead (`lazy_attention`).
- `flex_stats(q, k, v, additive, is_causal, scale, softcap, compiled=True)`: `(z, lse)`.

Compiled (`torch.compile`, shapes dynamic after the second) is the fused kernel; a new length
or batch size does not compile again. Uncompiled, torch runs the same computation densely, which
is how the CPU tests check this module's masks and score_mod against full maps.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

import torch

from ..errors import HeadscopeError

__all__ = ["flex_available", "flex_stats"]


# The compiled kernel's smallest head width for queries, keys and values (Triton's tiles).
MIN_HEAD_DIM = 16


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


# torch.compile's backend for the fused kernel; the CPU tests count recompilations with a backend
# of their own (inductor on the CPU has no log-sum-exp output).
_BACKEND = "inductor"


@lru_cache(maxsize=4)
def _compiled_flex(backend: str):
    """FlexAttention compiled with automatic dynamic shapes: the first shape gets a kernel of its
    own, the second a kernel general in the sizes that changed, after which new lengths and batch
    sizes reuse it (a batch of one and a single key block still get their own). Compiled for
    fixed shapes instead, every new length recompiles, and past torch's limit on recompilations
    (8 a function) torch stops compiling and runs FlexAttention densely, materialising every
    score: an analysis with batches of many lengths (a treebank's) reaches that in one probe."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=None, backend=backend)


# Kernels a process may compile for FlexAttention. With shapes dynamic, torch still specialises a
# batch of one and a single block of 128 keys, so each dtype and mask form (none, additive,
# soft-capped) takes up to seven kernels: more than torch's default limit of 8 once the entropy's
# fp32 pass joins a bf16 model's. Past this bound a call raises rather than running densely.
RECOMPILE_LIMIT = 64


def _compile_limits():
    """torch's recompilation limit raised to `RECOMPILE_LIMIT` during a call, and an error
    instead of the silent dense fallback past it (the settings this torch has)."""
    import torch._dynamo.config as config

    limits = {}
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            limits[name] = max(getattr(config, name), RECOMPILE_LIMIT)
            break
    if hasattr(config, "fail_on_recompile_limit_hit"):
        limits["fail_on_recompile_limit_hit"] = True
    if hasattr(config, "specialize_float"):
        # The scale and soft-cap as constants: made dynamic, inductor fails on a soft-cap read
        # from a tensor (torch 2.11); each model has one of each.
        limits["specialize_float"] = True
    return config.patch(**limits)


@lru_cache(maxsize=32)
def _block_mask(n_query: int, n_key: int, device: str, is_causal: bool):
    """Causal: keys after each query hidden, queries aligned to the last keys (as `causal_mask`).
    Else every block visible: passed explicitly, since a compiled call building its own empty
    mask fails once shapes are dynamic (torch 2.11)."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset = n_key - n_query

    def visible(b, h, i, j):
        return i + offset >= j

    def every(b, h, i, j):
        return j >= 0

    return create_block_mask(visible if is_causal else every, None, None, n_query, n_key, device=device)


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

    block_mask = _block_mask(q.shape[-2], k.shape[-2], str(q.device), is_causal)
    arguments = dict(score_mod=_score_mod(additive, softcap), block_mask=block_mask, scale=scale,
                     enable_gqa=k.shape[1] != q.shape[1], return_aux=AuxRequest(lse=True))
    if compiled:
        import torch._dynamo.exc

        limit_hit = getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", ())  # absent before torch 2.6
        try:
            with _compile_limits():
                z, aux = _compiled_flex(_BACKEND)(q, k, v, **arguments)
        except limit_hit as error:
            raise HeadscopeError(
                f"FlexAttention was compiled {RECOMPILE_LIMIT} times in this process (a kernel per dtype, "
                "mask form and batch shape); past that it would run densely. Start a new process, or "
                "raise headscope.attention.flex.RECOMPILE_LIMIT") from error
    else:
        z, aux = flex_attention(q, k, v, **arguments)
    return z.to(v.dtype), aux.lse.float()

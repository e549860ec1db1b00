"""The attention kernel shared by `MultiHeadAttention` and the Hugging Face integration.

`attention(q, k, v, ...)` computes softmax(cap(q k^T * scale) + mask) v for every head, with
grouped-query attention (fewer key/value heads than query heads) handled by sharing each
key/value head among `n_heads / n_kv_heads` query heads. Two extras of recent models:
- soft-capping (Gemma 2): cap(s) = softcap * tanh(s / softcap) bounds every score;
- sinks (gpt-oss): one learned logit per head joins each row's softmax as an extra key and is
  dropped after it, so a row of the pattern sums to 1 - (the sink's share), less than 1.
`with_bias(mask, bias)` folds an additive score bias (T5's relative positions) into a mask.

Two paths compute the same math:
- fast: `torch.nn.functional.scaled_dot_product_attention`, used when nobody needs the
  scores or the pattern;
- explicit: scores and pattern materialised (softmax accumulated in fp32), so that callbacks
  can read or replace them and the pattern can be returned; soft-capping and sinks always take
  this path (SDPA has neither).

Mask convention: a boolean mask is True where a query may attend to a key; a float mask is
added to the scores. Masks broadcast to `[batch, head, query, key]`.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

__all__ = ["attention", "pattern_of", "expand_kv", "causal_mask", "with_bias", "with_selected_keys", "TensorEdit"]

TensorEdit = Callable[[torch.Tensor], Optional[torch.Tensor]]


def expand_kv(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Repeat key/value heads so there is one per query head.

    Args:
        x: `[batch, kv_head, pos, d_head]`.
        n_heads: number of query heads, a multiple of `kv_head`.
    Returns:
        `[batch, n_heads, pos, d_head]`; query head h reads kv head h // (n_heads / kv_head).
    """
    n_kv = x.shape[1]
    if n_kv == n_heads:
        return x
    if n_heads % n_kv:
        raise ValueError(f"{n_heads} query heads cannot share {n_kv} key/value heads evenly")
    return x.repeat_interleave(n_heads // n_kv, dim=1)


def causal_mask(n_query: int, n_key: int, device=None) -> torch.Tensor:
    """Boolean `[query, key]` mask, True on and below the diagonal (queries aligned to the end)."""
    offset = n_key - n_query
    return torch.ones(n_query, n_key, dtype=torch.bool, device=device).tril(diagonal=offset)


def with_bias(mask: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """An additive float mask holding `bias` (added to the scores) and what `mask` hides.

    Args:
        mask: None, boolean (True = may attend) or additive float, broadcastable to
            `[batch, head, query, key]`.
        bias: None or an additive float broadcastable to the same shape (e.g. T5's
            `[1, head, query, key]` relative position bias).
    """
    if bias is None:
        return mask
    if mask is None:
        return bias
    if mask.dtype == torch.bool:
        return bias.masked_fill(~mask, torch.finfo(bias.dtype).min)
    return bias + mask.to(bias.dtype)


def with_selected_keys(mask: Optional[torch.Tensor], indices: Optional[torch.Tensor], n_keys: int,
                       causal: bool) -> Optional[torch.Tensor]:
    """`mask` that also hides every key a query did not select (DeepSeek-V3.2's sparse attention:
    its indexer picks each query's top-k keys, the same for every head).

    Args:
        mask: None, boolean (True = may attend) or additive float, broadcastable to
            `[batch, head, query, key]`.
        indices: None (nothing selected: `mask` as it is) or `[batch, query, k]` key positions.
        n_keys: the number of keys.
        causal: `mask` is None and the queries may not see later keys (the last query is the last
            key), which then joins the mask.
    Returns:
        The mask (boolean when `mask` was None or boolean, else additive in its dtype).
    """
    if indices is None:
        return mask
    batch, n_queries, _ = indices.shape
    chosen = torch.zeros(batch, n_queries, n_keys, dtype=torch.bool, device=indices.device)
    chosen = chosen.scatter(-1, indices.long(), True).unsqueeze(1)  # (B, 1, Tq, Tk)
    if mask is None:
        if not causal:
            return chosen
        return chosen & causal_mask(n_queries, n_keys, indices.device)
    if mask.dtype == torch.bool:
        return mask & chosen
    return mask.masked_fill(~chosen, torch.finfo(mask.dtype).min)


def pattern_of(q: torch.Tensor, k: torch.Tensor, *, mask: Optional[torch.Tensor] = None, is_causal: bool = False,
               scale: Optional[float] = None, softcap: Optional[float] = None,
               sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The pattern `attention` computes for these queries and keys, out of place (autograd-safe):
    `[batch, head, query, key]` fp32. Arguments as `attention`'s; `k` may have fewer heads than `q`.
    Attribution patching's QK fix (`headscope.circuits.attribution`) recomputes a layer's pattern
    with one head's queries or keys replaced through it, with the settings the layer's call used."""
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if is_causal and mask is not None:
        mask, is_causal = _combine(mask, causal_mask(q.shape[-2], k.shape[-2], q.device)), False
    k = expand_kv(k, q.shape[1])
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # (B, H, Tq, Tk)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if is_causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool \
            else scores + mask.float()
    if sinks is not None:
        return _softmax_with_sinks(scores, sinks.float(), False)
    return torch.softmax(scores, dim=-1)


def _apply(edit: Optional[TensorEdit], x: torch.Tensor) -> torch.Tensor:
    if edit is None:
        return x
    out = edit(x)
    return x if out is None else out


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: Optional[torch.Tensor] = None,
    is_causal: bool = False,
    scale: Optional[float] = None,
    softcap: Optional[float] = None,
    sinks: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    need_pattern: bool = False,
    on_scores: Optional[TensorEdit] = None,
    on_pattern: Optional[TensorEdit] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Scaled dot-product attention over all heads.

    Args:
        q: `[batch, head, query, d_head]`.
        k, v: `[batch, kv_head, key, d_head]` (v may have its own last size); `head` must be a
            multiple of `kv_head`.
        mask: boolean (True = may attend) or additive float, broadcastable to
            `[batch, head, query, key]`; combined with `is_causal` when both are given.
        is_causal: hide keys after each query (queries aligned to the last keys).
        scale: multiplies the scores; default `1 / sqrt(d_head)`.
        softcap: if set, scores become `softcap * tanh(scores / softcap)` before the mask.
        sinks: `[head]` learned logits, one extra key per head that takes softmax mass and is
            dropped from the pattern (whose rows then sum to less than 1).
        dropout_p: dropout on the pattern (pass 0 at evaluation).
        need_pattern: return the pattern even if no callback asks for it.
        on_scores: called with the pre-softmax scores `[batch, head, query, key]` (fp32,
            masked positions at the dtype's minimum); may return a replacement.
        on_pattern: called with the pattern `[batch, head, query, key]` (fp32); may return a
            replacement.

    Returns:
        `(z, pattern)`: z is `[batch, head, query, d_head]` in v's dtype; pattern is the
        `[batch, head, query, key]` fp32 probabilities, or None on the fast path.
    """
    n_heads = q.shape[1]
    if scale is None:
        scale = q.shape[-1] ** -0.5
    extras = softcap is not None or sinks is not None  # SDPA has neither
    explicit = need_pattern or on_scores is not None or on_pattern is not None or extras
    if is_causal and mask is not None:
        mask = _combine(mask, causal_mask(q.shape[-2], k.shape[-2], q.device))
        is_causal = False
    if not explicit:
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.to(q.dtype)
        z = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p,
            is_causal=is_causal and q.shape[-2] > 1, scale=scale,
            enable_gqa=k.shape[1] != n_heads,
        )
        return z, None

    k = expand_kv(k, n_heads)
    v = expand_kv(v, n_heads)
    # Without autograd the pattern is built in place in one [B, H, Tq, Tk] fp32 buffer, so
    # the explicit path holds a single map per layer (it matters at long sequence lengths).
    in_place = not torch.is_grad_enabled()
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2))  # (B, H, Tq, Tk)
    scores = scores.mul_(scale) if in_place else scores * scale
    if softcap is not None:
        scores = scores.div_(softcap).tanh_().mul_(softcap) if in_place else torch.tanh(scores / softcap) * softcap
    if is_causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
    if mask is not None:
        if mask.dtype == torch.bool:
            fill = torch.finfo(scores.dtype).min
            scores = scores.masked_fill_(~mask, fill) if in_place else scores.masked_fill(~mask, fill)
        else:
            scores = scores.add_(mask.float()) if in_place else scores + mask.float()
    scores = _apply(on_scores, scores)
    if sinks is not None:
        pattern = _softmax_with_sinks(scores, sinks.float(), in_place and on_scores is None)
    elif in_place and on_scores is None:
        pattern = _softmax_(scores)
    else:
        pattern = torch.softmax(scores, dim=-1)  # (B, H, Tq, Tk), fp32
    pattern = _apply(on_pattern, pattern)
    weights = F.dropout(pattern, p=dropout_p) if dropout_p > 0 else pattern
    z = torch.matmul(weights.to(v.dtype), v)  # (B, H, Tq, d_head)
    return z, pattern


def _softmax_(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis, overwriting `scores` (same formula as torch.softmax)."""
    scores.sub_(scores.amax(dim=-1, keepdim=True))
    scores.exp_()
    return scores.div_(scores.sum(dim=-1, keepdim=True))


def _softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor, in_place: bool) -> torch.Tensor:
    """Softmax over the keys plus one sink logit per head, the sink's column dropped after it.

    scores `[batch, head, query, key]`, sinks `[head]`; returns `[batch, head, query, key]`
    with rows summing to 1 - exp(sink - lse), lse taken over the keys and the sink.
    """
    sink = sinks.view(1, -1, 1, 1)  # (1, H, 1, 1)
    top = torch.maximum(scores.amax(dim=-1, keepdim=True), sink)  # (B, H, Tq, 1)
    weights = scores.sub_(top).exp_() if in_place else (scores - top).exp()
    total = weights.sum(dim=-1, keepdim=True) + (sink - top).exp()
    return weights.div_(total) if in_place else weights / total


def _combine(mask: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
    """Intersect a user mask with the causal mask, keeping the user's mask type."""
    if mask.dtype == torch.bool:
        return mask & causal
    hidden = torch.zeros_like(causal, dtype=mask.dtype).masked_fill(~causal, torch.finfo(mask.dtype).min)
    return mask + hidden

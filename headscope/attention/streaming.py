"""Per-head key restriction: some key/value heads see only a sink and a recent window of keys.

A KV-cache policy (DuoAttention's streaming heads, StreamingLLM) keeps, for a restricted
key/value head, only the first `sink` keys and the last `recent` keys up to the query. For a
query at absolute position p (queries aligned to the last keys) and a key at position j,

    kept(p, j) = j < sink  or  0 <= p - j < recent

and every query head reading that key/value head inherits the restriction; the model's own
mask (causal, padding, sliding window) still applies on top. Other heads are unchanged.

- `KeyWindow(streaming, sink, recent)`: which key/value heads are restricted, and how.
- `KeyWindow.kept(n_query, n_key)`: the `[query, key]` boolean `kept` map above.
- `restricted_mask(window, mask, ...)`: the model's mask intersected with the restriction per
  head, `[batch, head, query, key]` (the explicit path, when someone reads the pattern).
- `windowed_attention(q, k, v, window, ...)`: the same attention without any `[query, key]`
  map for the whole sequence: unrestricted heads in one kernel call, restricted heads in blocks
  of queries, each block meeting only the sink keys and the window its queries can reach, so
  a restricted head costs O(T * (sink + recent)) instead of O(T^2).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..checks import check_count
from .kernel import attention, causal_mask

__all__ = ["KeyWindow", "restricted_mask", "windowed_attention"]


@dataclass(frozen=True)
class KeyWindow:
    """The key/value heads of one layer restricted to `sink` first and `recent` last keys.

    Attributes:
        streaming: key/value head indices whose keys are restricted (sorted, no repeats).
        sink: first keys every restricted query keeps (>= 0).
        recent: last keys, the query's own included, every restricted query keeps (>= 1).
    """

    streaming: tuple[int, ...]
    sink: int
    recent: int

    def __post_init__(self):
        check_count("sink", self.sink, least=0)
        check_count("recent", self.recent)
        object.__setattr__(self, "streaming", tuple(sorted(set(int(h) for h in self.streaming))))

    def kept(self, n_query: int, n_key: int, device=None) -> torch.Tensor:
        """Boolean `[query, key]`: True where a restricted head keeps the key (formula above),
        the `n_query` queries aligned to the last of `n_key` keys."""
        return _kept(_positions(n_query, n_key, device), torch.arange(n_key, device=device), self.sink, self.recent)


def _positions(n_query: int, n_key: int, device, first: int = 0, total: Optional[int] = None) -> torch.Tensor:
    """Absolute positions of queries `first..first + n_query` of `total` queries aligned to the end of
    `n_key` keys (`total` defaults to `n_query`)."""
    total = n_query if total is None else total
    return torch.arange(first, first + n_query, device=device) + (n_key - total)


def _kept(pos: torch.Tensor, keys: torch.Tensor, sink: int, recent: int) -> torch.Tensor:
    """`[query, key]` kept(p, j) = j < sink or 0 <= p - j < recent."""
    back = pos[:, None] - keys[None, :]
    return (keys[None, :] < sink) | ((back >= 0) & (back < recent))


def _query_heads(kv_heads, n_heads: int, n_kv: int, device) -> torch.Tensor:
    """Query heads reading the given key/value heads (head h reads kv head h // (n_heads / n_kv))."""
    group = n_heads // n_kv
    return torch.tensor([g * group + i for g in kv_heads for i in range(group)], dtype=torch.long, device=device)


def _heads_mask(mask: Optional[torch.Tensor], heads: torch.Tensor) -> Optional[torch.Tensor]:
    """The part of a `[batch, head or 1, query, key]` mask that some query heads read."""
    if mask is None or mask.dim() < 4 or mask.shape[1] == 1:
        return mask
    return mask[:, heads]


def _intersect(mask: Optional[torch.Tensor], kept: torch.Tensor) -> torch.Tensor:
    """The model's mask (None, boolean or additive float) with `kept` (boolean, broadcastable) hidden too."""
    if mask is None:
        return kept
    if mask.dtype == torch.bool:
        return mask & kept
    return mask.masked_fill(~kept, torch.finfo(mask.dtype).min)


def restricted_mask(window: KeyWindow, mask: Optional[torch.Tensor], n_heads: int, n_kv: int, n_query: int,
                    n_key: int, is_causal: bool, device=None) -> torch.Tensor:
    """The mask for the explicit path: the model's mask, causal if asked, and the restriction.

    Args:
        window: the restriction; mask: None, boolean (True = may attend) or additive float,
            broadcastable to `[batch, head, query, key]`.
        n_heads, n_kv: query and key/value heads; n_query, n_key: sequence sizes.
        is_causal: the kernel would hide later keys (no mask given).
    Returns:
        `[batch or 1, n_heads, query, key]`, boolean or float as `mask` is.
    """
    per_head = torch.ones(n_heads, n_query, n_key, dtype=torch.bool, device=device)  # (H, Tq, Tk)
    if window.streaming:
        per_head[_query_heads(window.streaming, n_heads, n_kv, device)] = window.kept(n_query, n_key, device)
    if is_causal:
        per_head &= causal_mask(n_query, n_key, device)
    if mask is not None and mask.dim() == 2:
        mask = mask[None, None]
    return _intersect(mask, per_head[None])


def windowed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: KeyWindow, *,
                       mask: Optional[torch.Tensor] = None, is_causal: bool = False, scale: Optional[float] = None,
                       softcap: Optional[float] = None, sinks: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                       block: Optional[int] = None) -> torch.Tensor:
    """Attention with `window`'s key/value heads restricted, no whole-sequence map for them.

    Args:
        q: `[batch, head, query, d_head]`; k, v: `[batch, kv_head, key, d_head]`.
        window: which key/value heads are restricted, and to how many sink and recent keys.
        mask, is_causal, scale, softcap, sinks, dropout_p: as in `headscope.attention.kernel.attention`.
        block: queries per block of a restricted head (default max(64, recent)).
    Returns:
        z `[batch, head, query, d_head]`: unrestricted heads exactly as `attention` gives them,
        restricted heads as `attention` with `restricted_mask` (the same math, in blocks).
    """
    B, H, Tq, _ = q.shape
    n_kv, Tk = k.shape[1], k.shape[-2]
    stream = [g for g in window.streaming if g < n_kv]
    full = [g for g in range(n_kv) if g not in set(stream)]
    z = q.new_empty(B, H, Tq, v.shape[-1])  # (B, H, Tq, Dv)
    math = dict(scale=scale, softcap=softcap, dropout_p=dropout_p)
    for kv_heads, restricted in ((full, False), (stream, True)):
        if not kv_heads:
            continue
        heads = _query_heads(kv_heads, H, n_kv, q.device)
        kv = torch.tensor(kv_heads, dtype=torch.long, device=q.device)
        part_q, part_k, part_v = q[:, heads], k[:, kv], v[:, kv]
        part_mask = _heads_mask(mask, heads)
        part_sinks = sinks[heads] if sinks is not None else None
        if not restricted:
            z[:, heads], _ = attention(part_q, part_k, part_v, mask=part_mask, is_causal=is_causal, sinks=part_sinks,
                                       **math)
            continue
        size = block or max(64, window.recent)
        pieces = []
        for first in range(0, Tq, size):
            n = min(size, Tq - first)
            pos = _positions(n, Tk, q.device, first, Tq)  # (n,) absolute positions of the block's queries
            lo = max(int(pos[0]) - window.recent + 1, 0)
            hi = min(int(pos[-1]) + 1, Tk)
            n_sink = min(window.sink, Tk)
            keys = torch.cat([torch.arange(n_sink, device=q.device),
                              torch.arange(max(lo, n_sink), max(hi, n_sink), device=q.device)])  # (Kb,)
            kept = _kept(pos, keys, window.sink, window.recent)  # (n, Kb)
            if is_causal:
                kept = kept & (keys[None, :] <= pos[:, None])
            block_mask = None
            if part_mask is not None:
                m = part_mask if part_mask.dim() == 4 else part_mask[None, None]
                block_mask = m[..., first:first + n, :][..., keys] if m.shape[-2] > 1 else m[..., keys]
            z_block, _ = attention(part_q[:, :, first:first + n], part_k[:, :, keys], part_v[:, :, keys],
                                   mask=_intersect(block_mask, kept), sinks=part_sinks, **math)
            pieces.append(z_block)
        z[:, heads] = torch.cat(pieces, dim=2)
    return z

"""A layer's attention pattern that is never materialised.

Every probability is A[i, j] = exp(s_ij - lse_i), with s_ij = cap(scale * q_i . k_j) + m_ij (m the
additive mask, cap the optional soft-cap c * tanh(x / c)) and lse_i = log(sum_j exp(s_ij) +
exp(sink)) the row's log-sum-exp, the sink term only for models with a learned sink logit per
head (rows then sum to less than 1). A fused kernel gives z and the keys' lse in one pass without
writing the [query, key] map; a sink then enters as lse_i = logaddexp(lse_i, sink) and rescales
z by exp(lse_keys - lse_i). The kernel (`lse_kernel`): on the CPU aten's flash kernel
("cpu-flash"); on CUDA FlexAttention ("flex", `headscope.attention.flex`), which takes
soft-capped scores too; elsewhere, and for soft-capped scores on the CPU, z and lse are
computed in query blocks ("blockwise"). The few entries a detector reads (a diagonal, a column, a sparse set
of targets) then cost one dot product each, and the row entropy H_i = -sum_j A[i, j] ln A[i, j]
= W_i (lse_i - sum_j A'[i, j] s_ij) (A' the pattern without the sink, W_i = sum_j A[i, j]) costs
one more fused pass with the keys as values (sum_j A'[i, j] k_j), or is computed exactly in query
blocks. Asked for up front (`entropy=True`), the CPU's fused kernel computes it in the same call as
z, the keys joining the values.

- `lazy_attention(q, k, v, ...) -> (z, LazyPattern)`: the attention output and the pattern as
  a `LazyPattern` (the row log-sum-exp, q, k and the mask). Its `fused`, `kernel` and
  `block_bytes` keywords choose the path: `fused=False` takes the blockwise path even where a
  fused kernel exists, `kernel` names one (`lse_kernel`'s choice by default), `block_bytes`
  (default `BLOCK_BYTES`, 64 MiB) bounds the fp32 scores the blockwise path holds at once.
- `lse_kernel(device, softcap, fused=True)`: which of "cpu-flash", "flex", "blockwise" runs.
- `LazyPattern`: `diagonal(offset)`, `column(j)`, `mass(targets)`, `entropy()`, each equal
  to what the same reduction of the full pattern gives (tests check both paths against it),
  and `argmax()`, `dense()`, which compute the map (`headscope.attention.pattern.Pattern`, the interface
  it shares with `DensePattern`).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

import torch
import torch.nn.functional as F

from .flex import MIN_HEAD_DIM, flex_available, flex_stats
from .kernel import _combine, causal_mask, expand_kv
from .targets import Targets

__all__ = ["lazy_attention", "LazyPattern", "fused_lse_available", "lse_kernel", "KERNELS", "BLOCK_BYTES"]

KERNELS = ("cpu-flash", "flex", "blockwise")

BLOCK_BYTES = 64 * 2**20  # fp32 scores held at once by the blockwise fallback


def _cpu_flash_available(device) -> bool:
    return torch.device(device).type == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def fused_lse_available(device: torch.device) -> bool:
    """Whether torch exposes a fused kernel that returns the log-sum-exp on this device.

    On the CPU, aten's flash kernel returns (output, logsumexp); it is the kernel public SDPA
    calls there. On CUDA, FlexAttention compiled by Triton (`headscope.attention.flex`).
    Elsewhere the log-sum-exp is computed blockwise (`_blockwise_stats`).
    """
    return _cpu_flash_available(device) or flex_available(device)


def lse_kernel(device, softcap: Optional[float] = None, fused: bool = True) -> str:
    """The kernel computing z and the row log-sum-exp: "flex" on CUDA (soft-capped scores
    included), "cpu-flash" on the CPU without a soft-cap, else "blockwise" (query blocks)."""
    if not fused:
        return "blockwise"
    if flex_available(device):
        return "flex"
    if softcap is None and _cpu_flash_available(device):
        return "cpu-flash"
    return "blockwise"


def _additive(mask: Optional[torch.Tensor], dtype) -> Optional[torch.Tensor]:
    """A mask as additive floats `[batch or 1, head or 1, query, key]` (0 = may attend, the
    dtype's minimum = hidden), or None."""
    if mask is None:
        return None
    hide = torch.finfo(dtype).min  # not -inf: a fully hidden row stays finite, as in the kernel
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, hide)
    mask = mask.to(dtype).clamp(min=hide)  # -inf -> the minimum: exp() still 0, no 0 * inf
    while mask.dim() < 4:
        mask = mask[None]
    return mask


def _zero_or_hidden(mask: Optional[torch.Tensor]) -> bool:
    """True when an additive mask only ever adds 0 (allowed) or hides a key."""
    if mask is None:
        return True
    return bool(((mask == 0) | (mask <= torch.finfo(mask.dtype).min / 2)).all())


def lazy_attention(q, k, v, *, mask=None, is_causal=False, scale=None, softcap=None, sinks=None, fused=True,
                   kernel: Optional[str] = None, block_bytes=BLOCK_BYTES, entropy: bool = False):
    """softmax(cap(q k^T * scale) + mask) v, and the pattern as a `LazyPattern`, without the map.

    Args:
        q: `[batch, head, query, d_head]`; k, v: `[batch, kv_head, key, d_head]`.
        mask: boolean (True = may attend) or additive float, broadcastable to
            `[batch, head, query, key]`.
        is_causal: hide keys after each query (queries aligned to the last keys); passed to
            the kernel as a flag, so it skips the hidden blocks.
        scale: default `1 / sqrt(d_head)`.
        softcap: scores become `softcap * tanh(scores / softcap)` (computed in query blocks).
        sinks: `[head]` sink logits that join each row's softmax and are dropped after it.
        fused: use torch's fused kernel for the log-sum-exp (and the entropy) where this device
            has one; False computes them in query blocks everywhere (same numbers, more memory).
        kernel: "cpu-flash", "flex" or "blockwise" (default `lse_kernel(q.device, softcap, fused)`);
            "flex" off CUDA runs FlexAttention uncompiled (dense: for tests); on CUDA, heads
            narrower than `flex.MIN_HEAD_DIM` (16) take "blockwise". The pattern's `kernel` says
            which ran.
        block_bytes: fp32 scores the blockwise path holds at once (`BLOCK_BYTES` by default);
            a block is at least one query row.
        entropy: the caller will read the row entropy: on the CPU's fused kernel (fp32, a mask
            that only adds 0 or hides) the same kernel call computes it beside z, with the keys
            joining the values (`_cpu_flash_with_mean_key`); elsewhere it is computed when read.
    Returns:
        `(z [batch, head, query, d_head] in v's dtype, LazyPattern)`.
    """
    n_heads, n_query, n_key = q.shape[1], q.shape[-2], k.shape[-2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    is_causal = is_causal and n_query > 1
    if is_causal and mask is not None:  # one mask holding both, as the explicit path does
        mask, is_causal = _combine(mask, causal_mask(n_query, n_key, q.device)), False
    additive = _additive(mask, q.dtype)
    kernel = lse_kernel(q.device, softcap, fused) if kernel is None else kernel
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; use one of {', '.join(KERNELS)}")
    if kernel == "cpu-flash" and (softcap is not None or v.shape[-1] != q.shape[-1] or q.device.type != "cpu"):
        kernel = "blockwise"  # aten's CPU kernel: no soft-cap, value and key widths equal
    compiled = kernel == "flex" and flex_available(q.device)  # else "flex" runs uncompiled (tests)
    if compiled and min(q.shape[-1], v.shape[-1]) < MIN_HEAD_DIM:
        kernel = "blockwise"  # the compiled kernel's tiles: heads of at least MIN_HEAD_DIM
    lazy = LazyPattern(q, k, None, additive, is_causal, scale, softcap, sinks, kernel=kernel, block_bytes=block_bytes)
    mean_key = None  # sum_j A'[i, j] k_j where the kernel call computes it beside z (`entropy`)
    if kernel == "blockwise" and softcap is not None:
        lazy.lse, _, z = _blockwise_stats(lazy, entropy=False, values=expand_kv(v, n_heads))
        return z.to(v.dtype), lazy
    if kernel == "flex":
        z, lse = flex_stats(q, k, v, additive, is_causal, scale, softcap, compiled=compiled)
    elif kernel == "cpu-flash":
        keys, values = (k, v) if cpu_flash_groups_heads() else (lazy.keys(), expand_kv(v, n_heads))
        if entropy and q.dtype == torch.float32 and _zero_or_hidden(additive):
            z, lse, mean_key = _cpu_flash_with_mean_key(q, keys, values, is_causal, additive, scale)
        else:
            z, lse = _cpu_flash(q, keys, values, is_causal, additive, scale)
        lse = lse.float()
    else:
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, is_causal=is_causal, scale=scale,
                                           enable_gqa=k.shape[1] != n_heads)
        lse = _blockwise_stats(LazyPattern(q, k, None, additive, is_causal, scale, block_bytes=block_bytes),
                               entropy=False)[0]
    lazy.lse = lse if sinks is None else torch.logaddexp(lse, lazy.sink_logits())  # (B, H, Tq)
    if mean_key is not None:
        lazy._entropy = lazy._entropy_from(mean_key, lse)
    if sinks is not None:  # the sink's share of each row leaves z: z * sum_j A[i, j]
        z = (z.float() * (lse - lazy.lse).exp()[..., None]).to(z.dtype)
    return z, lazy


def _cpu_flash(q, k, v, is_causal, additive, scale):
    """(out, lse) of aten's fused CPU kernel."""
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    return op(q, k, v, 0.0, is_causal, attn_mask=additive, scale=scale)


def _cpu_flash_with_mean_key(q, k, v, is_causal, additive, scale):
    """(z, lse, sum_j A'[i, j] k_j) of one call of aten's fused CPU kernel: the keys join the
    values, `[v | k]`. The kernel takes one head width for q, k and v, so q and k are padded with
    zeros to the joined width (the zeros add nothing to q . k; `scale` is passed, not inferred).
    One call instead of two: the scores and their exponentials are computed once."""
    width = v.shape[-1]
    padding = (0, k.shape[-1])
    out, lse = _cpu_flash(F.pad(q, padding), F.pad(k, padding), torch.cat([v, k], dim=-1), is_causal, additive, scale)
    return out[..., :width], lse, out[..., width:]


def _head_dots(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """`[batch, head, n]` the fp32 dot products queries[b, h, i] . keys[b, h // groups, i]:
    queries `[batch, head, n, d]`, keys `[batch, kv_head, n, d]` (no key copied per query head).
    Read token by token where the queries lie so (`_token_major`); the same sums either way."""
    kv, groups = keys.shape[1], queries.shape[1] // keys.shape[1]
    if _token_major(queries):  # (B, n, KV, G, D) . (B, n, KV, 1, D)
        dots = torch.linalg.vecdot(queries.transpose(1, 2).unflatten(2, (kv, groups)),
                                   keys.transpose(1, 2)[:, :, :, None])
        return dots.flatten(2).transpose(1, 2)
    return torch.linalg.vecdot(queries.unflatten(1, (kv, groups)), keys[:, :, None]).flatten(1, 2)


def _token_major(x: torch.Tensor) -> bool:
    """Whether `[batch, head, token, d_head]` x lies in memory token by token, heads inside (as
    `proj(h).view(B, T, H, D).transpose(1, 2)` leaves it), so that reductions over d_head read it
    fastest through `x.transpose(1, 2)`."""
    return x.stride(1) < x.stride(2)


@lru_cache(maxsize=1)
def cpu_flash_groups_heads() -> bool:
    """True when aten's fused CPU kernel reads grouped keys and values itself (fewer key/value
    heads than query heads, query head h reading kv head h // group) and gives what it gives on
    keys and values repeated per query head: then neither is copied per query head. Checked once
    on a tiny input."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 5, 8, generator=generator)
    k, v = (torch.randn(1, 2, 5, 8, generator=generator) for _ in range(2))
    try:
        grouped = _cpu_flash(q, k, v, True, None, 8 ** -0.5)
    except RuntimeError:
        return False
    repeated = _cpu_flash(q, expand_kv(k, 4), expand_kv(v, 4), True, None, 8 ** -0.5)
    return all(torch.equal(a, b) for a, b in zip(grouped, repeated))


def _blockwise_stats(lazy: "LazyPattern", entropy: bool, values: Optional[torch.Tensor] = None):
    """(lse, entropy or None, z or None), lse and entropy `[batch, head, query]` in fp32, z
    `[batch, head, query, d_v]` (with `values` `[batch, head, key, d_v]`), a block of queries
    at a time (as many rows as fit in `lazy.block_bytes` of fp32 scores)."""
    b, h, n_query, n_key = lazy.shape
    keys = lazy.keys().float()
    rows = max(1, lazy.block_bytes // (4 * b * h * n_key))
    lse, ent, out = [], [], []
    for start in range(0, n_query, rows):
        block = slice(start, min(n_query, start + rows))
        scores = lazy.capped(torch.matmul(lazy.q[:, :, block].float(), keys.transpose(-1, -2)))  # (B, H, rows, Tk)
        if lazy.additive is not None:
            scores = scores + lazy.additive[..., block, :].float()
        if lazy.is_causal:
            i, j = torch.arange(block.start, block.stop, device=lazy.device), torch.arange(n_key, device=lazy.device)
            scores = scores.masked_fill(lazy.causally_hidden(i[:, None], j[None, :]), torch.finfo(torch.float32).min)
        row_lse = torch.logsumexp(scores, dim=-1)  # (B, H, rows)
        if lazy.sinks is not None:
            row_lse = torch.logaddexp(row_lse, lazy.sink_logits())
        lse.append(row_lse)
        log_p = scores.sub_(row_lse[..., None])  # log A[i, j]
        if values is not None:
            out.append(torch.matmul(log_p.exp(), values.float()))  # (B, H, rows, d_v)
        if entropy:
            ent.append(-(log_p.exp() * log_p).sum(-1))
    return (torch.cat(lse, dim=-1), torch.cat(ent, dim=-1) if entropy else None,
            torch.cat(out, dim=2) if values is not None else None)


class LazyPattern:
    """Entries and row statistics of softmax(cap(q k^T * scale) + mask), computed on demand.

    Built by `lazy_attention` from one layer's q `[batch, head, query, d_head]`, k
    `[batch, kv_head, key, d_head]`, the additive mask, the causal flag and the row
    log-sum-exp (including the sink, if any), the soft-cap and the sinks; detectors read it
    through the `headscope.attention.pattern.Pattern` methods. Everything returned is fp32 and on q's device.
    """

    def __init__(self, q, k, lse, additive=None, is_causal=False, scale=None, softcap=None, sinks=None, *,
                 kernel="blockwise", block_bytes=BLOCK_BYTES):
        self.q = q
        self.k = k  # (B, KV, Tk, D): query head h reads kv head h // groups
        if q.shape[1] % k.shape[1]:
            raise ValueError(f"{q.shape[1]} query heads cannot share {k.shape[1]} key heads evenly")
        self.groups = q.shape[1] // k.shape[1]
        self.lse = lse  # (B, H, Tq) fp32
        self.additive = additive  # (B or 1, H or 1, Tq, Tk) additive floats, or None
        self.is_causal = is_causal
        self.scale = q.shape[-1] ** -0.5 if scale is None else scale
        self.softcap = softcap
        self.sinks = sinks  # (H,) sink logits, or None
        self.kernel = kernel  # what computed lse (`lse_kernel`); the entropy takes the same one
        self.block_bytes = block_bytes  # fp32 scores held at once on the blockwise path
        self._entropy = None

    def capped(self, products: torch.Tensor) -> torch.Tensor:
        """Scores from fp32 dot products q . k: scaled, then soft-capped when the model caps."""
        scores = products * self.scale
        return scores if self.softcap is None else torch.tanh(scores / self.softcap) * self.softcap

    def keys(self) -> torch.Tensor:
        """`[batch, head, key, d_head]` the keys, one per query head (a copy when heads share keys)."""
        return expand_kv(self.k, self.q.shape[1])

    def _grouped(self, queries: torch.Tensor) -> torch.Tensor:
        """Queries with heads on axis 1 (`[batch, head, ...]` or gathered rows `[n, head, d_head]`),
        that axis split into (kv head, group): keys `[., kv_head, 1, ...]` then match them by
        broadcasting, with no key copied per query head. A view."""
        return queries.unflatten(1, (self.k.shape[1], self.groups))

    def sink_logits(self) -> torch.Tensor:
        """`[1, head, 1]` fp32 sink logits, broadcasting against `[batch, head, query]`."""
        return self.sinks.float().view(1, -1, 1)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (*self.q.shape[:3], self.k.shape[-2])

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def dense(self) -> torch.Tensor:
        """`[batch, head, query, key]` the whole map, exp(s_ij - lse_i) (computed: costs what the map costs)."""
        scores = self.capped(torch.matmul(self.q.float(), self.keys().float().transpose(-1, -2)))  # (B, H, Tq, Tk)
        if self.additive is not None:
            scores = scores + self.additive.float()
        if self.is_causal:
            i, j = torch.arange(self.shape[2], device=self.device), torch.arange(self.shape[3], device=self.device)
            scores = scores.masked_fill(self.causally_hidden(i[:, None], j[None, :]), float("-inf"))
        return (scores - self.lse[..., None]).exp()

    def corner(self, rows: torch.Tensor, length: int) -> torch.Tensor:
        """`[len(rows), head, length, length]` the map of examples `rows` (indices into the batch)
        on their first `length` queries and keys, computed for that corner only (self-attention:
        as many queries as keys)."""
        if self.shape[2] != self.shape[3]:
            raise ValueError(f"corner needs as many queries as keys, not {self.shape[2]} and {self.shape[3]}")
        rows = rows.to(self.device)
        additive = self.additive
        if additive is not None:
            additive = (additive[rows] if additive.shape[0] > 1 else additive)[..., :length, :length]
        part = LazyPattern(self.q[rows, :, :length], self.k[rows, :, :length], self.lse[rows, :, :length], additive,
                           self.is_causal, self.scale, self.softcap, self.sinks, kernel=self.kernel)
        return part.dense()

    def argmax(self) -> torch.Tensor:
        """`[batch, head, query]` the key of each row's maximum (computes the map)."""
        return self.dense().argmax(dim=-1)

    def causally_hidden(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Bool, True where key j is after query i (queries aligned to the last keys)."""
        return j > i + (self.shape[3] - self.shape[2])

    def _probs(self, logits, b, i, j):
        """exp(logit + mask - lse) at 1-D query/key indices i, j: logits `[batch, head, n]` for
        every example (b None) or `[n, head]` at examples b."""
        hidden = self.causally_hidden(i, j)  # (n,)
        m = self.additive.expand(self.shape[0], -1, -1, -1) if self.additive is not None else None  # (B, H or 1, Tq, Tk)
        if b is None:
            bias = m[:, :, i, j] if m is not None else None  # (B, H or 1, n)
            lse = self.lse[:, :, i]
        else:
            bias = m[b, :, i, j] if m is not None else None  # (n, H or 1)
            hidden, lse = hidden[:, None], self.lse.permute(0, 2, 1)[b, i]
        if bias is not None:
            logits = logits + bias.float()
        if self.is_causal:
            logits = logits.masked_fill(hidden, float("-inf"))
        return (logits - lse).exp()

    def diagonal(self, offset: int) -> torch.Tensor:
        """`[batch, head, n]` A[i, i + offset], as `pattern.diagonal(offset, -2, -1)` orders it."""
        n_query, n_key = self.shape[2], self.shape[3]
        first_query = max(0, -offset)
        n = min(n_query - first_query, n_key - (first_query + offset))
        queries = self.q[:, :, first_query:first_query + n].float()  # (B, H, n, D), a view
        keys = self.k[:, :, first_query + offset:first_query + offset + n].float()  # (B, KV, n, D)
        logits = self.capped(_head_dots(queries, keys))  # (B, H, n)
        i = torch.arange(first_query, first_query + n, device=self.device)
        return self._probs(logits, None, i, i + offset)

    def column(self, key: int) -> torch.Tensor:
        """`[batch, head, query]` A[:, key]."""
        keys = self.k[:, :, None, key].float()[..., None]  # (B, KV, 1, D, 1)
        logits = self.capped(torch.matmul(self._grouped(self.q.float()), keys)[..., 0].flatten(1, 2))  # (B, H, Tq)
        i = torch.arange(self.shape[2], device=self.device)
        return self._probs(logits, None, i, torch.full_like(i, key))

    def mass(self, targets) -> torch.Tensor:
        """`[batch, head, query]` sum over keys j with targets[b, i, j] of A[i, j].

        Args:
            targets: `headscope.attention.targets.Targets`, or a `[batch, query, key]` bool mask
                (sparse: a few keys per query).
        """
        targets = Targets.of(targets)
        b, i, j = targets.b, targets.i, targets.j
        q = self._grouped(self.q.permute(0, 2, 1, 3)[b, i].float())  # (n, KV, G, D)
        k = self.k.permute(0, 2, 1, 3)[b, j].float()[:, :, None]  # (n, KV, 1, D)
        logits = self.capped(torch.linalg.vecdot(q, k).flatten(1, 2))  # (n, H)
        return targets.sum_over(self._probs(logits, b, i, j))  # (B, H, Tq)

    def entropy(self) -> torch.Tensor:
        """`[batch, head, query]` H_i = -sum_j A[i, j] ln A[i, j] in nats."""
        if self._entropy is None:
            self._entropy = self._compute_entropy()
        return self._entropy

    def _compute_entropy(self) -> torch.Tensor:
        q, k = self.q, self.k
        if self.softcap is not None or not _zero_or_hidden(self.additive):
            return _blockwise_stats(self, entropy=True)[1]
        if self.kernel == "flex":  # in fp32: H is a difference of two terms of the size of lse
            additive = None if self.additive is None else self.additive.float()
            mean_key, keys_lse = flex_stats(q.float(), k.float(), k.float(), additive, self.is_causal, self.scale,
                                            compiled=flex_available(q.device))
            return self._entropy_from(mean_key, keys_lse)
        if self.kernel == "cpu-flash" and q.dtype == torch.float32:
            # H_i = W_i (lse_i - sum_j A'[i, j] s_ij), sum_j A'[i, j] s_ij = scale * q_i . (sum_j A'[i, j] k_j)
            # when the mask only adds 0 or hides (hidden keys have A = 0): one fused pass, keys as
            # values; A' is the pattern without the sink, W_i = exp(lse'_i - lse_i) its share.
            keys = k if cpu_flash_groups_heads() else self.keys()
            mean_key, keys_lse = _cpu_flash(q, keys, keys, self.is_causal, self.additive, self.scale)
            return self._entropy_from(mean_key, keys_lse)
        return _blockwise_stats(self, entropy=True)[1]

    def _entropy_from(self, mean_key: torch.Tensor, keys_lse: torch.Tensor) -> torch.Tensor:
        """H_i = W_i (lse_i - scale * q_i . sum_j A'[i, j] k_j), from the fused pass with the keys as values."""
        entropy = self.lse - _head_dots(self.q.float(), mean_key.float()) * self.scale  # mean_key: (B, H, Tq, D)
        if self.sinks is None:
            return entropy
        return (keys_lse.float() - self.lse).exp() * entropy  # the keys' share W_i, (B, H, Tq)

"""Routing a Hugging Face model's attention through headscope's kernel.

transformers (v5) looks up each layer's attention function by `config._attn_implementation`.
headscope registers its kernel under the name "headscope", with transformers' SDPA mask builder
registered under the same name (without a mask function no causal mask would be built and the
outputs would be silently wrong). While at least one `Session` is active on a model, the model
runs with that implementation; when the last one exits, the previous implementation returns.

Sessions see each layer's pattern `[batch, head, query, key]` (key/value heads expanded to
query heads) and may edit z `[batch, pos, head, d_head]` before the output projection. When
every session watching a layer takes a `LazyPattern` (`takes_lazy`), the layer runs the fused
kernel (output plus row log-sum-exp) and no map is built.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from torch import nn

from ..errors import HeadscopeError
from ..kernel import attention, expand_kv
from ..lazy import lazy_attention
from .adapters import core_modules

__all__ = ["IMPLEMENTATION", "Session", "routed"]

IMPLEMENTATION = "headscope"
_ACTIVE: list["Session"] = []
_MODEL_STATE: dict[int, tuple[str, int]] = {}  # id(model) -> (previous implementation, sessions)
_registered = False


class Session:
    """Base class for what runs inside the kernel: override the three hooks below."""

    layer_of: dict[int, int]  # id(attention core module) -> layer index

    def wants_pattern(self, layer: int) -> bool:
        return False

    def takes_lazy(self, layer: int) -> bool:
        """True if `on_pattern` accepts a `headscope.lazy.LazyPattern` instead of a map."""
        return False

    def pattern_chunk(self, layer: int) -> Optional[int]:
        """Heads per piece if this session can take the pattern in head groups (None: whole)."""
        return None

    def on_pattern(self, layer: int, pattern: torch.Tensor, attention_mask: Optional[torch.Tensor],
                   heads: Optional[slice] = None) -> None:
        """Receives `[batch, head, query, key]` fp32 probabilities on the model's device (or a
        `LazyPattern` of them if every watcher `takes_lazy`); with head groups, `heads` says
        which query heads this piece holds."""

    def end_pattern(self, layer: int) -> None:
        """Called after the last head group of a layer (only when patterns came in groups)."""

    def edit_z(self, layer: int, z: torch.Tensor) -> torch.Tensor:
        """Receives z `[batch, pos, head, d_head]`; returns it, edited or not."""
        return z


def _headscope_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention-interface function: query `[b, h, q, d]`, key/value `[b, kv, k, d]`."""
    active = [(s, s.layer_of[id(module)]) for s in _ACTIVE if id(module) in s.layer_of]
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    # As in transformers' SDPA path: a missing mask means "causal" only for causal modules.
    is_causal = bool(is_causal) and attention_mask is None and query.shape[2] > 1
    watchers = [(s, layer) for s, layer in active if s.wants_pattern(layer)]
    chunks = [s.pattern_chunk(layer) for s, layer in watchers]
    chunk = min(chunks) if chunks and all(chunks) else None
    n_heads = query.shape[1]
    if watchers and not dropout and all(s.takes_lazy(layer) for s, layer in watchers):
        z, lazy = lazy_attention(query, key, value, mask=attention_mask, is_causal=is_causal, scale=scaling)
        for session, layer in watchers:
            session.on_pattern(layer, lazy, attention_mask)
        pattern = None
    elif chunk is not None and chunk < n_heads:
        # Head groups: the explicit path on a few heads at a time, so one layer's full map
        # never exists; observers get each group's pattern, z is assembled from the groups.
        keys, values = expand_kv(key, n_heads), expand_kv(value, n_heads)
        parts = []
        for start in range(0, n_heads, chunk):
            heads = slice(start, min(n_heads, start + chunk))
            z_part, piece = attention(query[:, heads], keys[:, heads], values[:, heads], mask=attention_mask,
                                      is_causal=is_causal, scale=scaling, dropout_p=dropout, need_pattern=True)
            for session, layer in watchers:
                session.on_pattern(layer, piece, attention_mask, heads=heads)
            parts.append(z_part)
            del piece
        for session, layer in watchers:
            session.end_pattern(layer)
        z, pattern = torch.cat(parts, dim=1), None
    else:
        z, pattern = attention(
            query, key, value, mask=attention_mask, is_causal=is_causal, scale=scaling,
            dropout_p=dropout, need_pattern=bool(watchers),
        )
        for session, layer in watchers:
            if pattern is not None:
                session.on_pattern(layer, pattern, attention_mask)
    z = z.transpose(1, 2)  # (B, T, H, D)
    for session, layer in active:
        z = session.edit_z(layer, z)
    weights = pattern.to(query.dtype) if pattern is not None else None
    return z.contiguous(), weights


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, _headscope_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    _registered = True


def layer_map(model: nn.Module) -> dict[int, int]:
    """`{id(core module): layer}` for a supported model; HeadscopeError otherwise."""
    layers = core_modules(model)  # raises for unsupported families
    if not type(model)._can_set_attn_implementation():
        raise HeadscopeError(
            f"{type(model).__name__} does not route attention through transformers' attention interface"
        )
    return {id(core): i for i, core in layers}


@contextmanager
def routed(model: nn.Module, session: Session) -> Iterator[Session]:
    """Run `model` through headscope's kernel with `session` active; always restores the model."""
    _register()
    key = id(model)
    previous, count = _MODEL_STATE.get(key, (model.config._attn_implementation, 0))
    if count == 0:
        model.set_attn_implementation(IMPLEMENTATION)
    _MODEL_STATE[key] = (previous, count + 1)
    _ACTIVE.append(session)
    try:
        yield session
    finally:
        _ACTIVE.remove(session)
        previous, count = _MODEL_STATE.pop(key)
        if count > 1:
            _MODEL_STATE[key] = (previous, count - 1)
        else:
            model.set_attn_implementation(previous)

"""An independent reference for streaming heads: plain eager attention (written here, not headscope's
kernel) with a per-head mask built one entry at a time, registered in transformers' attention
interface under its own name.

- `hand_mask(n, streams, sink, recent)`: `[query, key]` additive mask (causal; sink + recent if streaming).
- `reference_attention(model, streaming, sink, recent)`: a context manager running `model` with
  that attention; `streaming` is `{layer: [kv_head, ...]}`.
"""
from contextlib import contextmanager

import torch

NAME = "kv_reference"
_SETTINGS = {}


def hand_mask(n: int, streams: bool, sink: int, recent: int) -> torch.Tensor:
    out = torch.zeros(n, n)
    for i in range(n):
        for j in range(n):
            keep = j <= i and (not streams or j < sink or i - j < recent)
            if not keep:
                out[i, j] = float("-inf")
    return out


def _reference(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """softmax(q k^T * scale + model mask + hand mask) v, key/value heads repeated per query head."""
    streaming, sink, recent = _SETTINGS["now"]
    B, H, T, D = query.shape
    group = H // key.shape[1]
    key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scale = D ** -0.5 if scaling is None else scaling
    scores = query.float() @ key.float().transpose(-1, -2) * scale  # (B, H, T, T)
    if attention_mask is not None:
        scores = scores + attention_mask[..., :T, :T].float()
    layer = module.layer_idx
    hand = torch.stack([hand_mask(T, h // group in streaming.get(layer, []), sink, recent) for h in range(H)])
    weights = torch.softmax(scores + hand, dim=-1)
    return (weights @ value.float()).to(value.dtype).transpose(1, 2).contiguous(), weights


@contextmanager
def reference_attention(model, streaming: dict, sink: int, recent: int):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, _reference)
    AttentionMaskInterface.register(NAME, eager_mask)
    previous = model.config._attn_implementation
    _SETTINGS["now"] = (streaming, sink, recent)
    model.set_attn_implementation(NAME)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
        _SETTINGS.pop("now", None)

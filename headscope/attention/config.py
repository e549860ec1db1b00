"""The sizes and options of a `MultiHeadAttention`, resolved and checked.

- `AttentionConfig`: the frozen record a module keeps as `.config` (sizes, masking, rotary, the
  extras of recent models, the latent).
- `resolved_config(d_model, n_heads, n_kv_heads, d_head, ...)`: the config with its defaults filled
  in (head size d_model / n_heads, value size d_head, scale d_head ** -0.5, input width d_model),
  ValueError on sizes that do not fit together.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .latent import LatentRanks

__all__ = ["AttentionConfig", "resolved_config"]


@dataclass(frozen=True)
class AttentionConfig:
    """Resolved sizes and options of a `MultiHeadAttention`.

    Attributes:
        d_model: residual stream width, what W_O writes.
        d_in: width of what W_q, W_k, W_v (and W_gate) read; d_model unless the block reads
            something wider (zamba2: the hidden state joined to the embeddings, 2 * d_model).
        n_heads: query heads.
        n_kv_heads: key/value heads (divides n_heads; equal for classic attention, 1 for MQA).
        d_head: size of each head's queries and keys.
        d_value: size of each head's values and z, what W_O reads per head (d_head unless the
            values are another size: multi-head latent attention).
        causal: queries may not attend to later keys.
        qkv_bias / out_bias: whether the projections have biases.
        rotary_dim: dims of each head rotated by rotary embedding (0: no rotary).
        rotary_base: rotary theta.
        rotary_interleaved: rotary pairs are dims (2i, 2i + 1), not (i, i + rotary_dim / 2).
        scale: score multiplier (1/sqrt(d_head) unless overridden).
        dropout: dropout on the pattern during training.
        qk_norm: q and k pass through `q_norm` / `k_norm` (on `[batch, pos, head, d_head]`)
            before rotary.
        qk_norm_after_rotary: the q/k norms come after rotary instead (HunYuan), still on
            `[batch, pos, head, d_head]`.
        clip: q, k and v are clamped to [-clip, clip] after the projections (None: no clip).
        clip_after_norm: the clamp comes after the q/k norms, not before them (OLMoE).
        v_norm: each head's values pass `v_norm` (on `[batch, key, kv_head, d_value]`; Gemma 4's
            RMSNorm without a gain).
        query_temperature: `(floor_scale, attn_scale, offset)`: the query at position t is
            multiplied by 1 + attn_scale * log(1 + floor((t + offset) / floor_scale)) after q/k norm
            and rotary (Llama 4's temperature tuning in its layers without rotary, offset 1;
            Nakanishi 2025, arXiv 2501.19399; Ministral 3's scale in every layer, offset 0); None:
            no temperature.
        softcap: scores become softcap * tanh(scores / softcap) (None: no cap).
        sinks: each head has a learned sink logit (`sinks` `[head]`) in its softmax.
        output_gate: z is multiplied per element by sigmoid(W_gate x) before W_O (`W_gate`,
            `d_model -> n_heads * d_head`, from the queries' input; each head's gate reads
            only its own slice, so heads stay separate).
        pre_out_norm: z, reshaped to `[batch, pos, head * d_head]`, passes `pre_out_norm` (a norm
            over all heads' features together: an RMSNorm's per-token scale mixes the heads) before
            W_O; hook_z and hook_result see the normed z, W_O's input.
        latent: q, k and v come from low-rank latents (multi-head latent attention,
            `headscope.attention.latent`; None: from W_q, W_k, W_v).
    """

    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_value: int
    causal: bool
    qkv_bias: bool
    out_bias: bool
    rotary_dim: int
    rotary_base: float
    scale: float
    dropout: float
    d_in: int
    rotary_interleaved: bool = False
    qk_norm: bool = False
    qk_norm_after_rotary: bool = False
    clip: Optional[float] = None
    clip_after_norm: bool = False
    v_norm: bool = False
    query_temperature: Optional[tuple[float, float, float]] = None
    softcap: Optional[float] = None
    sinks: bool = False
    output_gate: bool = False
    pre_out_norm: bool = False
    latent: Optional[LatentRanks] = None


def resolved_config(d_model: int, n_heads: int, n_kv_heads: Optional[int], d_head: Optional[int], *,
                    d_value: Optional[int], rotary_dim: int, rotary_base: float, scale: Optional[float],
                    d_in: Optional[int], **options) -> AttentionConfig:
    """The checked `AttentionConfig` of the given sizes (defaults filled in; ValueError on sizes
    that do not fit together)."""
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if d_head is None:
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}; pass d_head")
        d_head = d_model // n_heads
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads {n_heads} must be a multiple of n_kv_heads {n_kv_heads}")
    if rotary_dim < 0 or rotary_dim > d_head or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even and between 0 and d_head={d_head}, got {rotary_dim}")
    return AttentionConfig(
        d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, d_head=d_head,
        d_value=d_head if d_value is None else d_value, rotary_dim=rotary_dim, rotary_base=float(rotary_base),
        scale=d_head ** -0.5 if scale is None else float(scale), d_in=d_model if d_in is None else d_in, **options,
    )

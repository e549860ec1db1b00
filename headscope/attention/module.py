"""headscope's own multi-head attention module.

`MultiHeadAttention` is the textbook Concat(head_1..head_h) W_O with
head_i = softmax(Q_i K_i^T / sqrt(d_head)) V_i (Vaswani et al. 2017), extended with what real
models use: grouped-query attention (`n_kv_heads`), optional biases, a head size not tied to
`d_model / n_heads`, causal or bidirectional masking, padding masks, rotary position embedding
(full or partial, "rotate half" or interleaved pairs), a scaling override, dropout, and the
extras of recent models: q/k norms before rotary (Qwen3, Gemma 3, OLMo 2) or after it (HunYuan), clipping of q/k/v
(OLMo; after the q/k norms: OLMoE), a norm on each head's values (Gemma 4), a per-position query
temperature (Llama 4's layers without rotary), score soft-capping (Gemma 2), a learned sink logit per head (gpt-oss) and a sigmoid output gate
(Qwen3-Next: z * sigmoid(W_gate x), per element of each head, before W_O), and a norm over all
heads' outputs together before W_O (BitNet's `attn_sub_norm`: W_O RMSNorm(Concat(head_1..head_h))),
which mixes the heads through its per-token scale. Given a
`context`, keys and values come from it instead of `x`: cross-attention (an encoder-decoder's
decoder reading the encoder's output), with no rotary and no causal mask. The projections may
read an input of another width than the output's (`d_in`: zamba2's shared block reads the hidden
state joined to the embeddings, `2 * d_model` wide, and writes `d_model`), values may have their own
head size (`d_value`), and q, k, v may come from low-rank latents instead of W_q, W_k, W_v
(`latent`: multi-head latent attention, DeepSeek-V2/V3, `headscope.attention.latent`).

Hook points (read or replace with `headscope.attention.hook_points.hooks(module, {...})` or `module.hooks(...)`):
    hook_q       [batch, head, pos, d_head]      queries, after q/k norm, rotary and temperature
    hook_k       [batch, kv_head, key, d_head]   keys, after q/k norm and rotary
    hook_v       [batch, kv_head, key, d_value]  values (key = pos, or the context's positions;
                                                 d_value = d_head unless set apart)
    hook_scores  [batch, head, query, key]       pre-softmax scores, fp32, masked entries at min
    hook_pattern [batch, head, query, key]       attention probabilities, fp32
    hook_z       [batch, pos, head, d_value]     per-head weighted values, W_O's input (with an
                                                 output gate: after it, z * sigmoid(W_gate x); with
                                                 a norm before W_O: after it, the normed z)
    hook_result  [batch, pos, head, d_model]     per-head output after W_O (no bias); computed
                                                 only when hooked
The fast path (SDPA) runs unless a hook on scores or pattern, or `return_pattern`, needs them.

`MultiHeadAttention.from_hf(attention_module, config)` loads a Hugging Face layer's weights
through the adapters in `headscope.hf.adapters` (`headscope.hf.from_hf`).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .hook_points import HookPoint, hooks as _hooks
from .config import AttentionConfig, resolved_config
from .kernel import attention
from .latent import LatentProjections, LatentRanks
from .rotary import apply_rotary, rotary_cos_sin

__all__ = ["AttentionConfig", "MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head attention with hook points; see the module docstring for the hook shapes.

    Args:
        d_model: residual width.
        n_heads: number of query heads.
        n_kv_heads: number of key/value heads; defaults to `n_heads`.
        d_head: head size; defaults to `d_model // n_heads`.
        causal: mask out later keys.
        bias: biases on W_q, W_k, W_v; `out_bias` on W_o (defaults to `bias`).
        rotary_dim: rotate this many leading dims of each head (0 = no rotary).
        rotary_base: rotary theta.
        scale: score multiplier; defaults to 1/sqrt(d_head).
        dropout: dropout probability on the pattern in training mode.
        rotary_interleaved: rotate dims in pairs (2i, 2i + 1) (GPT-J layout).
        qk_norm: RMS-normalise each head's q and k before rotary (`q_norm`, `k_norm`, replaceable
            by any module mapping `[batch, pos, head, d_head]` to itself).
        qk_norm_after_rotary: apply the q/k norms after rotary instead (HunYuan); not with
            `clip_after_norm`.
        clip: clamp q, k and v to [-clip, clip]; with `clip_after_norm`, after the q/k norms.
        v_norm: normalise each head's values (`v_norm`, an `nn.RMSNorm(d_value)` without gain,
            replaceable by any module mapping `[batch, key, kv_head, d_value]` to itself).
        query_temperature: `(floor_scale, attn_scale)` or `(floor_scale, attn_scale, offset)`: scale
            the query at position t (from `positions`, default 0..pos-1) by
            1 + attn_scale * log(1 + floor((t + offset) / floor_scale)); offset 1 (Llama 4, the
            default) or 0 (Ministral 3).
        softcap: cap scores at softcap * tanh(scores / softcap).
        sinks: add a learned sink logit per head (`sinks` `[head]`, initialised to 0).
        output_gate: gate z per element by sigmoid(W_gate x) before W_O (`W_gate` with a bias
            when `bias`); `hook_z` and `hook_result` see the gated z.
        pre_out_norm: normalise z over all heads' features `[batch, pos, head * d_head]` before
            W_O (`pre_out_norm`, an `nn.RMSNorm(n_heads * d_head)`, replaceable by any module
            mapping `[batch, pos, head * d_head]` to itself, as from_hf puts BitNet's own
            `attn_sub_norm` there); `hook_z` and `hook_result` see the normed z.
        d_in: width of the input the projections read (default `d_model`); the output is
            `d_model` wide either way.
        d_value: each head's value (and z) size (default `d_head`).
        latent: multi-head latent attention (DeepSeek-V2/V3): `LatentRanks`, its projections
            `latent` (a `LatentProjections`) in place of W_q, W_k, W_v, the rotary part the last
            `latent.d_rope` dims of each head (`rotary_dim` that or 0), one key and value per head,
            the rotary key shared by all; no q/k norm or clip.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: Optional[int] = None,
        d_head: Optional[int] = None,
        *,
        causal: bool = True,
        bias: bool = False,
        out_bias: Optional[bool] = None,
        rotary_dim: int = 0,
        rotary_base: float = 10000.0,
        scale: Optional[float] = None,
        dropout: float = 0.0,
        rotary_interleaved: bool = False,
        qk_norm: bool = False,
        qk_norm_after_rotary: bool = False,
        clip: Optional[float] = None,
        clip_after_norm: bool = False,
        v_norm: bool = False,
        query_temperature: Optional[tuple[float, ...]] = None,
        softcap: Optional[float] = None,
        sinks: bool = False,
        output_gate: bool = False,
        pre_out_norm: bool = False,
        d_in: Optional[int] = None,
        d_value: Optional[int] = None,
        latent: Optional[LatentRanks] = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.config = resolved_config(
            d_model, n_heads, n_kv_heads, d_head, d_value=d_value, causal=causal, qkv_bias=bias,
            out_bias=bias if out_bias is None else out_bias, rotary_dim=rotary_dim, rotary_base=rotary_base,
            scale=scale, dropout=dropout, rotary_interleaved=rotary_interleaved, qk_norm=qk_norm, clip=clip,
            qk_norm_after_rotary=qk_norm_after_rotary, clip_after_norm=clip_after_norm, v_norm=v_norm,
            query_temperature=_temperature_of(query_temperature),
            softcap=softcap, sinks=sinks, output_gate=output_gate, d_in=d_in, pre_out_norm=pre_out_norm,
            latent=latent,
        )
        cfg, kw = self.config, dict(device=device, dtype=dtype)
        if qk_norm_after_rotary and (not qk_norm or clip_after_norm):
            raise ValueError("qk_norm_after_rotary needs qk_norm, and a clip after the norms would come after rotary "
                             "too: not with clip_after_norm")
        if latent is not None and (cfg.n_kv_heads != cfg.n_heads or qk_norm or v_norm or clip is not None
                                   or cfg.rotary_dim not in (0, latent.d_rope)):
            raise ValueError(f"latent attention has a key per head (n_kv_heads {cfg.n_kv_heads} must be n_heads "
                             f"{cfg.n_heads}), no q/k or value norm or clip, and rotates its d_rope={latent.d_rope} dims or none "
                             f"(rotary_dim {cfg.rotary_dim})")
        if latent is None:
            self.W_q = nn.Linear(cfg.d_in, cfg.n_heads * cfg.d_head, bias=bias, **kw)
            self.W_k = nn.Linear(cfg.d_in, cfg.n_kv_heads * cfg.d_head, bias=bias, **kw)
            self.W_v = nn.Linear(cfg.d_in, cfg.n_kv_heads * cfg.d_value, bias=bias, **kw)
            self.latent = None
        else:  # q, k, v from low-rank latents (headscope.attention.latent)
            self.W_q = self.W_k = self.W_v = None
            self.latent = LatentProjections(latent, cfg.d_in, cfg.n_heads, cfg.d_head, cfg.d_value, bias, **kw)
        self.q_norm = nn.RMSNorm(cfg.d_head, **kw) if qk_norm else None  # on (B, T, H, D)
        self.k_norm = nn.RMSNorm(cfg.d_head, **kw) if qk_norm else None
        self.v_norm = nn.RMSNorm(cfg.d_value, elementwise_affine=False, **kw) if v_norm else None  # on (B, S, Hkv, Dv)
        z_width = cfg.n_heads * cfg.d_value
        self.W_o = nn.Linear(z_width, cfg.d_model, bias=cfg.out_bias, **kw)
        self.W_gate = nn.Linear(cfg.d_in, z_width, bias=cfg.qkv_bias, **kw) if cfg.output_gate else None
        self.pre_out_norm = nn.RMSNorm(z_width, **kw) if cfg.pre_out_norm else None  # on (B, T, H * Dv)
        self.sinks = nn.Parameter(torch.zeros(cfg.n_heads, **kw)) if cfg.sinks else None  # (H,)
        self.hook_q = HookPoint("hook_q")  # (B, H, T, D)
        self.hook_k = HookPoint("hook_k")  # (B, Hkv, S, D), S = T or the context's length
        self.hook_v = HookPoint("hook_v")  # (B, Hkv, S, Dv)
        self.hook_scores = HookPoint("hook_scores")  # (B, H, Tq, Tk)
        self.hook_pattern = HookPoint("hook_pattern")  # (B, H, Tq, Tk)
        self.hook_z = HookPoint("hook_z")  # (B, T, H, Dv)
        self.hook_result = HookPoint("hook_result")  # (B, T, H, d_model)

    # Convenience views used by tests and adapters.
    @property
    def d_model(self) -> int:
        return self.config.d_model

    @property
    def n_heads(self) -> int:
        return self.config.n_heads

    def input_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(W_q, W_k, W_v)` weights, Linear-style `(rows, d_in)`: the linear maps from x to q, k and v
        before q/k norms and rotary (what the geometry and OV tables read); with a latent, its
        folded maps (`LatentProjections.input_weights`)."""
        if self.latent is not None:
            return self.latent.input_weights()
        return self.W_q.weight, self.W_k.weight, self.W_v.weight

    def hooks(self, fwd_hooks):
        """Context manager adding hooks by name; see `headscope.attention.hook_points.hooks`."""
        return _hooks(self, fwd_hooks)

    def forward(
        self,
        x: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        *,
        context: Optional[torch.Tensor] = None,
        positions: Optional[torch.Tensor] = None,
        rotary: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
        return_pattern: bool = False,
    ):
        """Attend over a sequence, or from it over a context.

        Args:
            x: `[batch, pos, d_in]`, the queries' (and, without `context`, the keys' and
                values') input (`d_in` is `d_model` unless the module was built wider).
            context: `[batch, key, d_in]`: cross-attention, keys and values projected from
                `context` (an encoder's output), queries from `x`; no rotary and no causal mask
                (every query may read every key the mask allows).
            attention_mask: `[batch, key]` padding mask (1/True = real token), or a boolean
                (True = may attend) or additive float mask broadcastable to
                `[batch, head, query, key]` (T5's relative position bias arrives this way).
                Combined with the causal mask when `causal` and there is no `context`.
            positions: `[pos]` or `[batch, pos]` positions for rotary (default 0..pos-1).
            rotary: precomputed `(cos, sin)`, each `[pos, rot]` or `[batch, pos, rot]`; used
                instead of `positions` (e.g. a model's own scaled rotary tables).
            return_pattern: also return the pattern `[batch, head, query, key]`.

        Returns:
            `[batch, pos, d_model]`, or `(output, pattern)` when `return_pattern`.
        """
        cfg = self.config
        B, T, _ = x.shape
        source = x if context is None else context  # keys and values read it
        q, k, v = self._project(x, source, None if context is not None else self._rotary(T, x, positions, rotary))
        if cfg.query_temperature is not None:
            q = self._tempered(q, positions)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)

        mask = _as_4d_mask(attention_mask)
        z, pattern = attention(
            q, k, v, mask=mask, is_causal=cfg.causal and context is None, scale=cfg.scale, softcap=cfg.softcap,
            sinks=self.sinks,
            dropout_p=cfg.dropout if self.training else 0.0,
            need_pattern=return_pattern,
            on_scores=self.hook_scores if self.hook_scores.hooked else None,
            on_pattern=self.hook_pattern if self.hook_pattern.hooked else None,
        )
        z = z.transpose(1, 2)  # (B, T, H, Dv)
        if cfg.output_gate:  # per element of each head: heads stay separate, z is W_O's input
            z = z * torch.sigmoid(self.W_gate(x)).view(B, T, cfg.n_heads, cfg.d_value)
        if cfg.pre_out_norm:  # over all heads' features together: the heads mix, z is W_O's input
            z = self.pre_out_norm(z.reshape(B, T, cfg.n_heads * cfg.d_value)).view(B, T, cfg.n_heads, cfg.d_value)
        z = self.hook_z(z)  # (B, T, H, Dv)
        if self.hook_result.hooked:
            w_o = self.W_o.weight.view(cfg.d_model, cfg.n_heads, cfg.d_value)  # (d_model, H, Dv)
            result = torch.einsum("bthd,mhd->bthm", z, w_o)  # (B, T, H, d_model)
            out = self.hook_result(result).sum(dim=2)
            if self.W_o.bias is not None:
                out = out + self.W_o.bias
        else:
            out = self.W_o(z.reshape(B, T, cfg.n_heads * cfg.d_value))
        return (out, pattern) if return_pattern else out

    def _rotary(self, T: int, x: torch.Tensor, positions, rotary) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """`(cos, sin)` `[..., pos, rotary_dim]` for the queries and keys of a self-attention call
        (None without rotary): the tables given, else computed for `positions` (default 0..T-1)."""
        cfg = self.config
        if not cfg.rotary_dim:
            return None
        if rotary is None:
            pos = torch.arange(T, device=x.device) if positions is None else positions
            rotary = rotary_cos_sin(pos, cfg.rotary_dim, cfg.rotary_base, interleaved=cfg.rotary_interleaved)
        if rotary[0].shape[-1] != cfg.rotary_dim:
            raise ValueError(f"rotary tables have {rotary[0].shape[-1]} dims, module rotates {cfg.rotary_dim}")
        return rotary

    def _tempered(self, q: torch.Tensor, positions: Optional[torch.Tensor]) -> torch.Tensor:
        """q `[B, H, T, D]` times its position's temperature
        1 + attn_scale * log(1 + floor((t + offset) / floor_scale))."""
        floor_scale, attn_scale, offset = self.config.query_temperature
        T = q.shape[2]
        t = torch.arange(T, device=q.device) if positions is None else positions  # (T,) or (B, T)
        temperature = torch.log1p(torch.floor((t.float() + offset) / floor_scale)) * attn_scale + 1.0
        return (q * temperature.view(-1, 1, T, 1)).to(q.dtype)  # (B or 1, 1, T, 1) broadcast over heads

    def _project(self, x: torch.Tensor, source: torch.Tensor, rotary) -> tuple[torch.Tensor, ...]:
        """q `[B, H, T, D]`, k `[B, Hkv, S, D]`, v `[B, Hkv, S, Dv]` from the queries' input x and the
        keys' and values' `source` (x, or a cross-attention's context; `rotary`: None there)."""
        cfg = self.config
        if self.latent is not None:
            return self.latent(x, source, rotary, cfg.rotary_interleaved)
        B, T, _ = x.shape
        S = source.shape[1]
        q, k, v = self.W_q(x), self.W_k(source), self.W_v(source)  # (B, T, H * D), (B, S, Hkv * D), (B, S, Hkv * Dv)
        if cfg.clip is not None and not cfg.clip_after_norm:
            q, k, v = (t.clamp(-cfg.clip, cfg.clip) for t in (q, k, v))
        q = q.view(B, T, cfg.n_heads, cfg.d_head)  # (B, T, H, D)
        k = k.view(B, S, cfg.n_kv_heads, cfg.d_head)  # (B, S, Hkv, D)
        if cfg.qk_norm and not cfg.qk_norm_after_rotary:
            q, k = self.q_norm(q), self.k_norm(k)
        if cfg.clip is not None and cfg.clip_after_norm:  # elementwise: the same on any view
            q, k, v = (t.clamp(-cfg.clip, cfg.clip) for t in (q, k, v))
        v = v.view(B, S, cfg.n_kv_heads, cfg.d_value)  # (B, S, Hkv, Dv)
        if cfg.v_norm:
            v = self.v_norm(v)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D), (B, Hkv, S, D), (B, Hkv, S, Dv)
        if rotary is not None:  # cross-attention: positions of two sequences, no rotary
            cos, sin = rotary
            q = apply_rotary(q, cos, sin, cfg.rotary_interleaved)
            k = apply_rotary(k, cos, sin, cfg.rotary_interleaved)
        if cfg.qk_norm_after_rotary:  # the norms see (B, T, H, D), as before rotary
            q, k = self.q_norm(q.transpose(1, 2)).transpose(1, 2), self.k_norm(k.transpose(1, 2)).transpose(1, 2)
        return q, k, v

    @classmethod
    def from_hf(cls, attention_module: nn.Module, config, layer: Optional[int] = None) -> "MultiHeadAttention":
        """Build a module holding the weights of a Hugging Face attention layer.

        Args:
            attention_module: the layer's attention block (e.g. Llama's `self_attn`, GPT-2's
                `attn`, BERT's `attention`, GPT-NeoX's `attention`).
            config: the model's config.
            layer: the model's number of the layer; needed only where one block serves several
                layers, each adding its own low-rank adapters to q, k, v (zamba2 with
                `use_shared_attention_adapter`), which are folded into that layer's W_q, W_k, W_v.
        Returns:
            A `MultiHeadAttention` on the same device and dtype, in eval mode.
        """
        # Reading a Hugging Face block is hf/'s job (`headscope.hf.from_hf.module_from_hf`); this is
        # the name callers know. Imported on call: attention/ sits below hf/ and imports none of it.
        from ..hf.from_hf import module_from_hf

        return module_from_hf(cls, attention_module, config, layer)


def _temperature_of(given: Optional[tuple]) -> Optional[tuple[float, float, float]]:
    """`(floor_scale, attn_scale, offset)` from a query temperature of two (offset 1) or three numbers."""
    if given is None:
        return None
    if len(given) not in (2, 3):
        raise ValueError(f"query_temperature is (floor_scale, attn_scale) or (floor_scale, attn_scale, offset), "
                         f"got {given!r}")
    floor_scale, attn_scale, offset = (*given, 1.0) if len(given) == 2 else given
    return float(floor_scale), float(attn_scale), float(offset)


def _as_4d_mask(mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Turn a `[batch, key]` padding mask into `[batch, 1, 1, key]` booleans; pass others on."""
    if mask is None or mask.dim() != 2:
        return mask
    return mask.bool()[:, None, None, :]

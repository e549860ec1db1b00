"""Building headscope's `MultiHeadAttention` from a Hugging Face attention block, by its adapter.

- `module_from_hf(cls, block, config, layer=None)`: a `MultiHeadAttention` holding the block's
  weights (a scale the model puts on the values folded into W_V: `Adapter.value_scale`), its q/k
  norms and values' norm (copies of the model's own modules), clip, query
  temperature, soft-cap, sink logits and
  output gate and a norm over all heads before the output projection (`Adapter.mixes_heads`,
  copied as `pre_out_norm`); for multi-head latent attention (`Adapter.latent`: DeepSeek-V2/V3),
  a `MultiHeadAttention` with `latent=`, holding the block's down and up projections and copies of
  its latent norms; where one block serves several layers with per-layer low-rank adapters on q, k, v
  (`Adapter.lora`, zamba2), those of `layer` folded into W_q, W_k, W_v (W + B A). A block whose
  linear layers do not apply their weight as it is stored (a quantized checkpoint's layers, as
  BitNet's `BitLinear` and `AutoBitLinear`, which round their inputs to 8 bits per token as they
  run) is refused in one line: no fixed matrix reproduces them; so is a layer attending with the
  keys and values another layer computed (`Adapter.kv_shared`, Gemma 4's shared layers).
- `rotary_tables(block, config, position_embeddings)`: the `(cos, sin)` the model passed to the
  block, in the layout and width `MultiHeadAttention` takes (None for a layer without rotary).
- `call_arguments(module, config, received, returned)`: the arguments that make such a module
  compute what the model's attention computed, from what that received (its forward's named
  inputs) and returned: hidden states, mask (with T5's position bias), the cross-attention's
  context, rotary tables.
"""
from __future__ import annotations

import copy
import inspect
from typing import Callable, Optional

import torch
from torch import nn

from ..errors import HeadscopeError
from ..attention.kernel import with_bias, with_selected_keys
from ..attention.latent import LatentRanks
from ..attention.rotary import full_width
from .adapters import Adapter, _sub, block_adapter, head_sizes
from .layouts import conv1d, linear

__all__ = ["module_from_hf", "rotary_tables", "call_arguments"]

# What models name the inputs of their attention modules: the mask (T5: `mask`) and
# cross-attention's source of keys and values (bart, whisper, T5: the encoder's output; mllama: the image's).
_MASK_NAMES = ("attention_mask", "mask")
_CONTEXT_NAMES = ("key_value_states", "cross_attention_states", "encoder_hidden_states")
# A packed module's bounds of its pieces in one sequence of patches (qwen2_5_vl's vision attention).
_PIECES_NAME = "cu_seqlens"


class _HeadsFirst(nn.Module):
    """A norm written for `[batch, head, pos, d_head]`, applied to `[batch, pos, head, d_head]`."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.transpose(1, 2)).transpose(1, 2)  # (B, T, H, D)


class _WholeProjection(nn.Module):
    """A norm over all heads' features `[batch, pos, head * d_head]`, applied to `[batch, pos, head, d_head]`."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.flatten(2)).view_as(x)  # (B, T, H * D) -> (B, T, H, D)


_WRAP = {"head": lambda norm: norm, "heads_first": _HeadsFirst, "projection": _WholeProjection}


def _norms(adapter: Adapter, core: nn.Module) -> Optional[tuple[nn.Module, nn.Module]]:
    spec = adapter.qk_norm
    if spec is None or (spec.switch is not None and not getattr(core, spec.switch)):
        return None
    if spec.where_present and not hasattr(core, spec.q):
        return None
    norms = _sub(core, spec.q), _sub(core, spec.k)
    wrap = _WRAP[spec.over]
    return tuple(wrap(copy.deepcopy(norm)) for norm in norms)


def _clip(adapter: Adapter, core: nn.Module, config) -> Optional[float]:
    """The clamp of q, k and v: the core's attribute where it has it, else the config's (None: no clamp)."""
    if not adapter.clip:
        return None
    return getattr(core, adapter.clip) if hasattr(core, adapter.clip) else getattr(config, adapter.clip, None)


def _temperature(adapter: Adapter, core: nn.Module, config, rotary_dim: int) -> Optional[tuple[float, float, float]]:
    """`(floor_scale, attn_scale, offset)` of a layer whose queries are scaled by position
    (`Temperature`: Llama 4's layers without rotary, Ministral 3's every layer)."""
    spec = adapter.temperature
    if spec is None or (spec.nope_only and rotary_dim) or (spec.switch is not None and not getattr(core, spec.switch)):
        return None
    if spec.in_rope_parameters:
        params = getattr(config, "rope_parameters", None) or {}
        floor, scale = params.get(spec.floor), params.get(spec.scale)
    else:
        floor, scale = getattr(core, spec.floor), getattr(core, spec.scale)
    if floor is None or scale is None:
        return None
    return float(floor), float(scale), float(spec.offset)


def _rotary_dim(adapter: Adapter, core: nn.Module, config, d_head: int) -> int:
    """Dims of each head the core rotates: 0 without rotary, in a NoPE layer (the adapter's
    switches) and where its forward takes no `position_embeddings`, so never gets the model's tables
    (mllama's cross-attention layers, in a family whose self-attention rotates)."""
    spec = adapter.rotary
    if spec is None or not _takes_tables(core):
        return 0
    switched = spec.switch is not None and (spec.switch_if_set is None or getattr(core, spec.switch_if_set) is not None)
    forced = spec.force is not None and getattr(core, spec.force)
    if switched and not getattr(core, spec.switch) and not forced:
        return 0
    if spec.config_switch is not None and getattr(config, spec.config_switch[0], None) != spec.config_switch[1]:
        return 0
    if spec.needs_base and _rotary_params(spec, core, config).get("rope_theta") is None:
        return 0  # no base, no rotary module: the model passes no tables
    if spec.theta_per_layer is not None and not getattr(config, spec.theta_per_layer)[core.layer_idx]:
        return 0  # a layer whose rotary base is 0: NoPE, the model passes it no tables
    dims = getattr(core, spec.dims, None) if spec.dims else None
    if dims is None:  # transformers' tables: a frequency per even dim below int(d_head * factor)
        dims = int(d_head * float(_rotary_params(spec, core, config).get("partial_rotary_factor", 1.0)))
        dims += dims % 2
    return int(dims)


def _rotary_params(spec, core: nn.Module, config) -> dict:
    """The config's rotary parameters for the core's layer: `rope_parameters`, or its entry for the
    layer's type where the family keeps one per type (`Rotary.by_layer_type`)."""
    params = getattr(config, "rope_parameters", None) or {}
    if spec is not None and spec.by_layer_type is not None:
        params = params.get(getattr(core, spec.by_layer_type)) or {}
    return params


def _takes_tables(core: nn.Module) -> bool:
    """Whether the core's forward names `position_embeddings` (the rotary tables) among its parameters."""
    return "position_embeddings" in inspect.signature(type(core).forward).parameters


def _axis_order(d_head: int, axes: int) -> torch.Tensor:
    """The order of a head's dims that makes `axes` rotate-half parts one rotate-half layout
    (`Rotary.axes`): every part's first half, then every part's second half, so that dim j pairs
    with j + d_head / 2 as part a's dim i pairs with its i + part / 2. Identity for one axis."""
    part = d_head // axes
    first = [torch.arange(a * part, a * part + part // 2) for a in range(axes)]
    second = [torch.arange(a * part + part // 2, (a + 1) * part) for a in range(axes)]
    return torch.cat(first + second)  # (d_head,)


def _heads_reordered(weight: torch.Tensor, bias: Optional[torch.Tensor], heads: int, order: torch.Tensor):
    """A projection's rows `(heads * d_head, d_in)` and bias, each head's dims taken in `order`."""
    d_head = order.numel()
    weight = weight.view(heads, d_head, -1)[:, order.to(weight.device)].reshape(heads * d_head, -1)
    if bias is not None:
        bias = bias.view(heads, d_head)[:, order.to(bias.device)].reshape(-1)
    return weight, bias


def _norm_reordered(norm: nn.Module, order: torch.Tensor) -> nn.Module:
    """A per-head norm's copy whose gains (its parameters over the head's dims) follow `order`:
    the norm's statistics over a head do not depend on the order of its dims."""
    with torch.no_grad():
        for param in norm.parameters():
            if param.shape == order.shape:
                param.copy_(param[order.to(param.device)])
    return norm


def _rotary_base(config, spec=None, core: Optional[nn.Module] = None) -> float:
    if spec is not None and spec.theta_per_layer is not None:  # the layer's own base (0 there: no rotary)
        return float(getattr(config, spec.theta_per_layer)[core.layer_idx]) or 10000.0
    params = _rotary_params(spec, core, config)
    base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return 10000.0 if base is None else float(base)  # None: no rotary (`Rotary.needs_base`), the base unused


def _sizes(adapter: Adapter, core: nn.Module, config) -> tuple[int, int, int, int]:
    """`(d_model, n_heads, n_kv_heads, d_head)`; where the adapter names the module's own head count
    (an encoder-decoder's stacks may differ, a vision tower's config names it its own way), that count,
    the module's `head_dim` (else d_model over it) and no grouped keys."""
    if adapter.sizes_per_layer:  # Gemma 4: its full-attention layers' heads are larger, with fewer keys
        n_heads = int(config.num_attention_heads)  # the config's head size and key/value heads are per layer
        return int(getattr(config, adapter.width)), n_heads, n_heads // int(core.num_key_value_groups), int(core.head_dim)
    if not adapter.heads:
        return head_sizes(config)
    d_model, n_heads = int(getattr(config, adapter.width)), int(getattr(core, adapter.heads))
    return d_model, n_heads, n_heads, int(getattr(core, "head_dim", None) or d_model // n_heads)


def _adapter_deltas(adapter: Adapter, core: nn.Module, config, layer: Optional[int], like: torch.Tensor) -> list:
    """`[B A of q, k, v]` (Linear-style `(rows, d_in)`) that `layer`'s low-rank adapters add to the
    shared block's projections, or `[None] * 3` where the family or config has none. Each adapter is
    a bias-free linear map, so its matrix is what it makes of the identity: `adapter(I) = I A^T B^T`
    (`like`: W_q, whose input width, device and dtype the identity takes)."""
    spec = adapter.lora
    if spec is None or not getattr(config, spec.switch, False):
        return [None] * 3
    index = getattr(core, spec.index)  # the model's layer number -> its adapters' entry
    if layer not in index:
        raise HeadscopeError(f"{adapter.family}'s attention block is shared by layers {', '.join(map(str, index))}, "
                             f"each adding its own low-rank adapters to q, k, v: from_hf needs layer= one of them "
                             f"(got {layer})")
    eye = torch.eye(like.shape[1], device=like.device, dtype=like.dtype)  # (d_in, d_in)
    return [core.get_submodule(path)[index[layer]](eye).T for path in (spec.q, spec.k, spec.v)]  # (rows, d_in)


def _runs_as_stored(block: nn.Module) -> None:
    """HeadscopeError in one line where a linear layer of the block does not compute x W^T + b with
    the weight it stores: a packed integer weight (BitNet's BitLinear) or a forward other than
    nn.Linear's (AutoBitLinear quantizes its input per token to 8 bits, and online its weight to
    ternary, on every call: rounding that depends on the input, which no matrix reproduces)."""
    for name, sub in block.named_modules():
        weight = getattr(sub, "weight", None)
        packed = isinstance(weight, torch.Tensor) and not weight.is_floating_point()
        if packed or (isinstance(sub, nn.Linear) and type(sub).forward is not nn.Linear.forward):
            raise HeadscopeError(f"from_hf and verify are not available for this {type(block).__name__}: its {name} "
                                 f"({type(sub).__name__}) is not a plain linear layer (a quantized layer rounds its "
                                 f"weights or inputs as it runs), so no weight matrix reproduces it; load the model "
                                 f"unquantized")


def module_from_hf(cls: Callable, block: nn.Module, config, layer: Optional[int] = None):
    """Build `cls` (a MultiHeadAttention) from a Hugging Face attention block's weights (`config`:
    the model's; a vision-language model's text config is read, or its vision config for a block of
    its vision tower, `block_adapter`; `layer`: the model's number of the block's layer, needed
    where the adapter has `lora`)."""
    adapter, config = block_adapter(config, block)
    if adapter.no_from_hf:
        raise HeadscopeError(adapter.no_from_hf)
    if adapter.no_from_hf_when and getattr(config, adapter.no_from_hf_when[0], False):
        raise HeadscopeError(adapter.no_from_hf_when[1])
    _runs_as_stored(block)
    core = _sub(block, adapter.core)
    if adapter.kv_shared and getattr(core, adapter.kv_shared):
        raise HeadscopeError(f"from_hf and verify are not available for this {type(core).__name__}: its layer reuses "
                             f"the keys and values another layer computed from that layer's input; capture, ablate "
                             f"and analyze work")
    if adapter.latent is not None:
        return _latent_module(cls, adapter, block, core, config)
    d_model, n_heads, n_kv, d_head = _sizes(adapter, core, config)
    (wq, bq), (wk, bk), (wv, bv) = adapter.qkv.extract(block, n_heads, n_kv, d_head)
    with torch.no_grad():  # a shared block's per-layer adapters, folded in: W + B A
        deltas = _adapter_deltas(adapter, core, config, layer, wq)
        wq, wk, wv = (w if d is None else w + d for w, d in zip((wq, wk, wv), deltas))
    if adapter.heads:
        d_head = wq.shape[0] // n_heads  # T5's d_kv need not be d_model / n_heads
    out = _sub(block, adapter.out)
    wo, bo = conv1d(out) if adapter.out_is_conv1d else linear(out)
    scale = getattr(core, adapter.scale, None)
    if adapter.query_prescaled:  # q = W_q x * scaling, scores scaled by 1: fold it into W_q
        wq, bq, scale = wq * scale, (bq * scale if bq is not None else None), 1.0
    norms = _norms(adapter, core)
    if adapter.rotary is not None and adapter.rotary.axes > 1:  # one rotate-half layout per head (`Rotary.axes`)
        order = _axis_order(d_head, adapter.rotary.axes)
        (wq, bq), (wk, bk) = _heads_reordered(wq, bq, n_heads, order), _heads_reordered(wk, bk, n_kv, order)
        if norms is not None:
            norms = tuple(_norm_reordered(norm, order) for norm in norms)
    if adapter.value_scale:  # v = s (W_V x + b): the scale folded into W_V's rows and bias
        scale_v = float(getattr(core, adapter.value_scale))
        wv, bv = wv * scale_v, (bv * scale_v if bv is not None else None)
    d_value = int(getattr(core, adapter.value_size)) if adapter.value_size else None
    sinks = getattr(core, adapter.sinks) if adapter.sinks else None
    wg, bg = adapter.qkv.gate(block, n_heads, d_head) if adapter.output_gate else (None, None)
    rotary_dim = _rotary_dim(adapter, core, config, d_head)
    module = cls(
        d_model, n_heads, n_kv, d_head,
        causal=bool(getattr(core, "is_causal", adapter.causal)),
        bias=any(b is not None for b in (bq, bk, bv)), out_bias=bo is not None,
        rotary_dim=rotary_dim, rotary_base=_rotary_base(config, adapter.rotary, core),
        rotary_interleaved=adapter.rotary is not None and adapter.rotary.interleaved,
        scale=scale, d_value=d_value, qk_norm=norms is not None, qk_norm_after_rotary=norms is not None and adapter.qk_norm.after_rotary,
        clip=_clip(adapter, core, config), clip_after_norm=adapter.clip_after_norm,
        v_norm=adapter.v_norm is not None, query_temperature=_temperature(adapter, core, config, rotary_dim),
        softcap=getattr(core, adapter.softcap, None) if adapter.softcap else None,
        sinks=sinks is not None, output_gate=wg is not None, pre_out_norm=adapter.mixes_heads is not None,
        d_in=wq.shape[1],
        device=wq.device, dtype=wq.dtype,
    )
    pairs = [(module.W_q, wq, bq), (module.W_k, wk, bk), (module.W_v, wv, bv), (module.W_o, wo, bo)]
    _copy_into(pairs + ([(module.W_gate, wg, bg)] if wg is not None else []))
    if sinks is not None:
        with torch.no_grad():
            module.sinks.copy_(sinks)
    if norms is not None:
        module.q_norm, module.k_norm = norms
    if adapter.v_norm is not None:  # the model's own norm on each head's values, (B, T, Hkv, D)
        module.v_norm = copy.deepcopy(_sub(core, adapter.v_norm))
    if adapter.mixes_heads is not None:  # the model's own norm over all heads' features, (B, T, H * D)
        module.pre_out_norm = copy.deepcopy(_sub(block, adapter.mixes_heads))
    return module.eval()


def _copy_into(pairs) -> None:
    """Copy `(weight, bias)` into each `(nn.Linear, weight, bias)`; a bias the source lacks is
    zeroed (whisper's k_proj has none while q and v have theirs)."""
    with torch.no_grad():
        for lin, w, b in pairs:
            lin.weight.copy_(w)
            if b is not None:
                lin.bias.copy_(b)
            elif lin.bias is not None:
                lin.bias.zero_()


def _latent_module(cls: Callable, adapter: Adapter, block: nn.Module, core: nn.Module, config):
    """A `cls` with `latent=` holding a multi-head latent attention block's projections (`Adapter.latent`):
    its down and up projections, copies of its latent norms, its output projection and score scale, and
    where the block has them its sink logits (`Adapter.sinks`) and sigmoid output gate (`Latent.gate`)."""
    spec = adapter.latent
    q_rank, kv_rank, nope, rope, value = (getattr(core, name) for name in (spec.q_rank, spec.kv_rank, spec.nope,
                                                                         spec.rope, spec.value))
    parts = [spec.q] if q_rank is None else [spec.q_down, spec.q_up]
    sources = [linear(_sub(core, path)) for path in parts + [spec.kv_down, spec.kv_up]]
    wo, bo = linear(_sub(block, adapter.out))
    d_model, n_heads = head_sizes(config)[:2]
    down = sources[-2][0]  # (kv_rank + rope, d_in)
    sinks = getattr(core, adapter.sinks) if adapter.sinks else None
    gate = linear(_sub(core, spec.gate)) if adapter.output_gate and spec.gate else None  # (H * Dv, d_in) rows
    module = cls(
        d_model, n_heads, n_heads, nope + rope, d_value=value, causal=bool(getattr(core, "is_causal", adapter.causal)),
        bias=any(b is not None for _, b in sources), out_bias=bo is not None,
        rotary_dim=rope if adapter.rotary is not None else 0, rotary_base=_rotary_base(config),
        rotary_interleaved=adapter.rotary is not None and adapter.rotary.interleaved,
        scale=getattr(core, adapter.scale, None), d_in=down.shape[1],
        sinks=sinks is not None, output_gate=gate is not None,
        latent=LatentRanks(kv_rank, rope, q_rank, regroup=_regrouped(spec.regroup, config)),
        device=down.device, dtype=down.dtype,
    )
    lat = module.latent
    targets = ([lat.W_q] if q_rank is None else [lat.W_q_down, lat.W_q_up]) + [lat.W_kv_down, lat.W_kv_up]
    pairs = [(t, w, b) for t, (w, b) in zip(targets, sources)] + [(module.W_o, wo, bo)]
    _copy_into(pairs + ([(module.W_gate, *gate)] if gate is not None else []))
    if sinks is not None:
        with torch.no_grad():
            module.sinks.copy_(sinks)
    if q_rank is not None:
        lat.q_norm = copy.deepcopy(_sub(core, spec.q_norm))
    lat.kv_norm = copy.deepcopy(_sub(core, spec.kv_norm))
    return module.eval()


def rotary_tables(module, config, position_embeddings, block: Optional[nn.Module] = None
                  ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """`(cos, sin)` `[batch, pos, rotary_dim]` (or `[pos, rotary_dim]`) for `module` (built by
    `module_from_hf` from `block`, None: a text block) from what the model passed its attention block,
    or None when the module has no rotary."""
    spec = block_adapter(config, block)[0].rotary
    dim, interleaved = module.config.rotary_dim, module.config.rotary_interleaved
    if not dim or position_embeddings is None:
        return None
    if spec.tables == "complex":  # e^(i angle) per pair, [..., pos, dim / 2]
        cos, sin = position_embeddings.real, position_embeddings.imag
    else:
        first, second = position_embeddings
        cos, sin = (second, first) if spec.sin_first else (first, second)
        if spec.tables == "halves":  # one angle per pair: the first half of a rotate-half table
            cos, sin = cos[..., : cos.shape[-1] // 2], sin[..., : sin.shape[-1] // 2]
    if spec.backwards:  # a rotation by -angle: cos(-a) = cos(a), sin(-a) = -sin(a)
        sin = -sin
    cos, sin = full_width(cos, sin, dim, interleaved)
    if spec.axes > 1:  # the order from_hf gave the head's q and k dims
        order = _axis_order(dim, spec.axes).to(cos.device)
        cos, sin = cos[..., order], sin[..., order]
    return cos, sin


def _within_pieces(bounds: torch.Tensor) -> torch.Tensor:
    """`[1, 1, patch, patch]` True where two patches lie in the same piece `[bounds[i], bounds[i + 1])`."""
    piece = torch.repeat_interleave(torch.arange(len(bounds) - 1, device=bounds.device), bounds.diff())  # (P,)
    return (piece[:, None] == piece[None, :])[None, None]


def _regrouped(regroup, config) -> bool:
    """`Latent.regroup` read: always (True), never (None) or as a config attribute says."""
    return regroup is True or bool(isinstance(regroup, str) and getattr(config, regroup, False))


def call_arguments(module, config, received: dict, returned, block: Optional[nn.Module] = None) -> dict:
    """Keyword arguments for `module` (built by `module_from_hf`) that reproduce one call of the
    model's attention module.

    Args:
        module: the `MultiHeadAttention` of that attention module.
        config: the model's config.
        received: the attention module's forward inputs by name (`hidden_states`, its mask,
            `key_value_states` or mllama's `cross_attention_states` at cross-attention,
            `position_embeddings`); `indices`, the keys its selector picked (`Adapter.selector`,
            or returned: "indices" in `Adapter.returns`), which join the mask; `bias_in_call`, the
            score bias it handed its attention function (`Adapter.bias_in_call`), added to the mask.
        returned: what its forward returned (T5's holds the position bias it used,
            `Adapter.returns`).
        block: the attention block `module` was built from (None: a text block); a vision
            tower's is described by its own adapter (`block_adapter`).
    Returns:
        `{"x", "attention_mask", "context", "rotary"}`. A packed module's `[patch, d_model]`
        (`cu_seqlens` among its inputs) becomes a batch of one, each patch attending to the
        patches of its own piece (image or window).
    """
    returns = block_adapter(config, block)[0].returns
    x = received["hidden_states"]
    mask = next((received[name] for name in _MASK_NAMES if received.get(name) is not None), None)
    if "position_bias" in returns:  # [1 or batch, head, query, key], added to the scores like the mask
        mask = with_bias(mask, returned[returns.index("position_bias")])
    if received.get("bias_in_call") is not None:  # UMT5: each layer's own relative position bias
        mask = with_bias(mask, received["bias_in_call"])
    indices = returned[returns.index("indices")] if "indices" in returns else received.get("indices")
    if indices is not None:  # DeepSeek-V3.2, GLM-5: only the keys its indexer picked
        mask = with_selected_keys(mask, indices, x.shape[1], causal=mask is None and module.config.causal)
    if received.get(_PIECES_NAME) is not None:  # one packed sequence (P, d_model): block-diagonal attention
        x, mask = x[None], _within_pieces(received[_PIECES_NAME])
    context = next((received[name] for name in _CONTEXT_NAMES if received.get(name) is not None), None)
    return {"x": x, "attention_mask": mask, "context": context,
            "rotary": rotary_tables(module, config, received.get("position_embeddings"), block)}

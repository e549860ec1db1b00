"""Declarative adapters from Hugging Face architectures to headscope's canonical names.

Each family is one `Adapter`: where the layers are, which submodule is the attention block
(what `MultiHeadAttention.from_hf` takes), which part of it calls transformers' attention
interface, and how q/k/v/o weights are laid out. Shared code reads adapters; it never branches
on an architecture name.

- `adapter_for(config)`: the adapter of a model's family (HeadscopeError if none).
- `attention_blocks(model)`: `[(layer, block)]` for every layer.
- `module_from_hf(cls, block, config)`: a `MultiHeadAttention` with the block's weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..errors import HeadscopeError

__all__ = ["Adapter", "ADAPTERS", "adapter_for", "attention_blocks", "module_from_hf", "supported_families"]

Weights = tuple[torch.Tensor, "torch.Tensor | None"]  # Linear-style (out, in) weight and bias


def _linear(module: nn.Module) -> Weights:
    return module.weight, module.bias


def _conv1d(module: nn.Module) -> Weights:
    # transformers' Conv1D computes x @ W + b with W shaped (in, out).
    return module.weight.t(), module.bias


@dataclass(frozen=True)
class Separate:
    """q, k and v projections are separate Linear modules."""

    q: str
    k: str
    v: str

    def extract(self, block: nn.Module, n_heads: int, n_kv: int, d_head: int) -> list[Weights]:
        return [_linear(block.get_submodule(p)) for p in (self.q, self.k, self.v)]


@dataclass(frozen=True)
class FusedConv1D:
    """GPT-2: one Conv1D producing [q | k | v] along the output features."""

    path: str

    def extract(self, block: nn.Module, n_heads: int, n_kv: int, d_head: int) -> list[Weights]:
        weight, bias = _conv1d(block.get_submodule(self.path))
        sizes = [n_heads * d_head, n_kv * d_head, n_kv * d_head]
        weights = weight.split(sizes, dim=0)
        biases = bias.split(sizes, dim=0) if bias is not None else (None,) * 3
        return list(zip(weights, biases))


@dataclass(frozen=True)
class FusedPerHead:
    """GPT-NeoX: one Linear whose output features are grouped per head as [q_h | k_h | v_h]."""

    path: str

    def extract(self, block: nn.Module, n_heads: int, n_kv: int, d_head: int) -> list[Weights]:
        weight, bias = _linear(block.get_submodule(self.path))
        w = weight.view(n_heads, 3, d_head, -1)  # (H, qkv, D, d_model)
        b = bias.view(n_heads, 3, d_head) if bias is not None else None
        return [
            (w[:, i].reshape(n_heads * d_head, -1), b[:, i].reshape(-1) if b is not None else None)
            for i in range(3)
        ]


@dataclass(frozen=True)
class Adapter:
    """How one architecture family names its attention.

    Attributes:
        family: canonical family name.
        model_types: `config.model_type` values it covers.
        layers: path from `model.base_model` to the list of layers.
        block: path from a layer to the attention block (holds q/k/v and the output projection).
        core: path from the block to the module that calls the attention interface ("" = block).
        qkv: layout of the q/k/v weights inside the block.
        out: path from the block to the output projection.
        out_is_conv1d: the output projection is a transformers Conv1D (x @ W).
        rotary: "none", "full" (all of d_head) or "partial" (`core.rotary_ndims` dims).
    """

    family: str
    model_types: tuple[str, ...]
    layers: str
    block: str
    core: str
    qkv: object
    out: str
    out_is_conv1d: bool = False
    rotary: str = "none"


ADAPTERS = (
    Adapter("gpt2", ("gpt2",), layers="h", block="attn", core="", qkv=FusedConv1D("c_attn"),
            out="c_proj", out_is_conv1d=True),
    Adapter("bert", ("bert",), layers="encoder.layer", block="attention", core="self",
            qkv=Separate("self.query", "self.key", "self.value"), out="output.dense"),
    Adapter("llama", ("llama", "mistral", "qwen2"), layers="layers", block="self_attn", core="",
            qkv=Separate("q_proj", "k_proj", "v_proj"), out="o_proj", rotary="full"),
    Adapter("gpt_neox", ("gpt_neox",), layers="layers", block="attention", core="",
            qkv=FusedPerHead("query_key_value"), out="dense", rotary="partial"),
)


def supported_families() -> str:
    """One line naming the supported model types."""
    return ", ".join(t for a in ADAPTERS for t in a.model_types)


def adapter_for(config) -> Adapter:
    """The adapter for a model config; HeadscopeError naming the supported types otherwise."""
    model_type = getattr(config, "model_type", None)
    for adapter in ADAPTERS:
        if model_type in adapter.model_types:
            return adapter
    raise HeadscopeError(
        f"architecture {model_type!r} is not supported by headscope; supported: {supported_families()}"
    )


def _sub(module: nn.Module, path: str) -> nn.Module:
    return module.get_submodule(path) if path else module


def attention_blocks(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """`[(layer index, attention block)]` for every layer of a Hugging Face model."""
    adapter = adapter_for(model.config)
    layers = _sub(model.base_model, adapter.layers)
    return [(i, _sub(layer, adapter.block)) for i, layer in enumerate(layers)]


def core_modules(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """`[(layer index, module that calls the attention interface)]` for every layer."""
    adapter = adapter_for(model.config)
    return [(i, _sub(block, adapter.core)) for i, block in attention_blocks(model)]


def out_projection(model: nn.Module, block: nn.Module) -> nn.Module:
    """The output projection (W_O) inside an attention block."""
    return _sub(block, adapter_for(model.config).out)


def head_sizes(config) -> tuple[int, int, int, int]:
    """`(d_model, n_heads, n_kv_heads, d_head)` read from a transformers config."""
    d_model = config.hidden_size
    n_heads = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    d_head = getattr(config, "head_dim", None) or d_model // n_heads
    return d_model, n_heads, n_kv, d_head


def _rotary_dim(adapter: Adapter, core: nn.Module, d_head: int) -> int:
    if adapter.rotary == "full":
        return d_head
    if adapter.rotary == "partial":
        return int(core.rotary_ndims)
    return 0


def _rotary_base(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def module_from_hf(cls: Callable, block: nn.Module, config):
    """Build `cls` (a MultiHeadAttention) from a Hugging Face attention block's weights."""
    adapter = adapter_for(config)
    core = _sub(block, adapter.core)
    d_model, n_heads, n_kv, d_head = head_sizes(config)
    (wq, bq), (wk, bk), (wv, bv) = adapter.qkv.extract(block, n_heads, n_kv, d_head)
    out = _sub(block, adapter.out)
    wo, bo = _conv1d(out) if adapter.out_is_conv1d else _linear(out)
    ref = wq
    module = cls(
        d_model, n_heads, n_kv, d_head,
        causal=bool(getattr(core, "is_causal", True)),
        bias=bq is not None, out_bias=bo is not None,
        rotary_dim=_rotary_dim(adapter, core, d_head), rotary_base=_rotary_base(config),
        scale=getattr(core, "scaling", None),
        device=ref.device, dtype=ref.dtype,
    )
    with torch.no_grad():
        for linear, w, b in ((module.W_q, wq, bq), (module.W_k, wk, bk), (module.W_v, wv, bv), (module.W_o, wo, bo)):
            linear.weight.copy_(w)
            if b is not None:
                linear.bias.copy_(b)
    return module.eval()

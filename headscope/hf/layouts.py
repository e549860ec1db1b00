"""How Hugging Face attention blocks store their q, k and v projection weights.

Each layout's `extract(block, n_heads, n_kv, d_head)` returns `[(weight, bias), ...]` for q, k, v,
each weight Linear-style `(out features, in features)` and bias None when the model has none.

- `Separate`: three Linear modules (Llama, BERT, ...).
- `FusedRows`: one Linear whose output is `[q | k | v]` (Phi-3 `qkv_proj`, ModernBERT `Wqkv`).
- `FusedConv1D`: the same in a transformers Conv1D, which stores `(in, out)` (GPT-2 `c_attn`).
- `FusedPerHead`: one Linear grouped per head as `[q_h | k_h | v_h]` (GPT-NeoX).
- `KeysAsValues`: three Linear modules, but where the value projection is absent (Gemma 4's
  full-attention layers with `attention_k_eq_v`) the values are the key projection's output.
- `FusedMultiQuery`: one Linear that is `FusedRows` where the block's switch is set (one key/value
  head) and `FusedPerHead` where not (GPT-BigCode `c_attn`, `multi_query`).
- `GatedQuery`: three Linear modules, the query's grouped per head as `[q_h | gate_h]`, the
  rows of a sigmoid output gate beside each head's query rows (Qwen3-Next); `gate(...)` gives them.
- `SeparateGate`: three Linear modules and a fourth, the sigmoid output gate's (AFMoE `gate_proj`).
- `HeadGate`: three Linear modules and a fourth with one row per head, a sigmoid gate on each head's
  output (LFM3 `g_proj`), given as that row repeated over the head's dims.
- `FusedGroups`: one Linear whose output is a few equal groups, each `[q_g | v_g | k_g]` over a
  run of whole heads (CodeGen `qkv_proj`, its `mp_num` groups).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is not imported by `import headscope`
    import torch
    from torch import nn

__all__ = ["Weights", "linear", "conv1d", "Separate", "FusedRows", "FusedConv1D", "FusedPerHead", "FusedMultiQuery",
           "KeysAsValues", "GatedQuery", "SeparateGate", "HeadGate", "FusedGroups"]

Weights = "tuple[torch.Tensor, torch.Tensor | None]"  # Linear-style (out, in) weight and bias


def linear(module: nn.Module) -> Weights:
    return module.weight, module.bias


def conv1d(module: nn.Module) -> Weights:
    # transformers' Conv1D computes x @ W + b with W shaped (in, out).
    return module.weight.t(), module.bias


def _split_rows(weights: Weights, n_heads: int, n_kv: int, d_head: int) -> list[Weights]:
    weight, bias = weights
    sizes = [n_heads * d_head, n_kv * d_head, n_kv * d_head]
    parts = weight.split(sizes, dim=0)
    biases = bias.split(sizes, dim=0) if bias is not None else (None,) * 3
    return list(zip(parts, biases))


@dataclass(frozen=True)
class Separate:
    """q, k and v projections are separate Linear modules."""

    q: str
    k: str
    v: str

    def extract(self, block: nn.Module, n_heads: int, n_kv: int, d_head: int) -> list[Weights]:
        return [linear(block.get_submodule(p)) for p in (self.q, self.k, self.v)]


@dataclass(frozen=True)
class FusedRows:
    """One Linear producing [q | k | v] along the output features."""

    path: str

    def extract(self, block: nn.Module, n_heads: int, n_kv: int, d_head: int) -> list[Weights]:
        return _split_rows(linear(block.get_submodule(self.path)), n_heads, n_kv, d_head)


@dataclass(frozen=True)
class FusedConv1D:
    """GPT-2: one Conv1D producing [q | k | v] along the output features."""

    path: str

    def extract(self, block: nn.Module, n_heads: int, n_kv: int, d_head: int) -> list[Weights]:
        return _split_rows(conv1d(block.get_submodule(self.path)), n_heads, n_kv, d_head)


@dataclass(frozen=True)
class FusedPerHead:
    """GPT-NeoX: one Linear whose output features are grouped per head as [q_h | k_h | v_h]."""

    path: str

    def extract(self, block: nn.Module, n_heads: int, n_kv: int, d_head: int) -> list[Weights]:
        weight, bias = linear(block.get_submodule(self.path))
        w = weight.view(n_heads, 3, d_head, -1)  # (H, qkv, D, d_model)
        b = bias.view(n_heads, 3, d_head) if bias is not None else None  # (H, qkv, D)
        return [
            (w[:, i].reshape(n_heads * d_head, -1), b[:, i].reshape(-1) if b is not None else None)
            for i in range(3)
        ]


@dataclass(frozen=True)
class FusedMultiQuery:
    """GPT-BigCode: one Linear, `[q | k | v]` along its output features where the block's `switch`
    is True (multi-query: one key/value head), grouped per head as `[q_h | k_h | v_h]` where not."""

    path: str
    switch: str

    def extract(self, block: nn.Module, n_heads: int, n_kv: int, d_head: int) -> list[Weights]:
        layout = FusedRows(self.path) if getattr(block, self.switch) else FusedPerHead(self.path)
        return layout.extract(block, n_heads, n_kv, d_head)


@dataclass(frozen=True)
class KeysAsValues:
    """Gemma 4: separate q, k, v Linears; a block whose `v` is None takes its values from `k`
    (the same weights: v = W_k x, before the key's norm)."""

    q: str
    k: str
    v: str

    def extract(self, block: nn.Module, n_heads: int, n_kv: int, d_head: int) -> list[Weights]:
        v = self.v if getattr(block, self.v, None) is not None else self.k
        return [linear(block.get_submodule(p)) for p in (self.q, self.k, v)]


@dataclass(frozen=True)
class GatedQuery:
    """Qwen3-Next: separate q, k, v Linears, the query's output grouped per head as
    `[q_h | gate_h]` (`2 * d_head` rows a head); `extract` gives the query rows, `gate` the gate's."""

    q: str
    k: str
    v: str

    def _halves(self, block: nn.Module, n_heads: int, d_head: int, half: int) -> Weights:
        weight, bias = linear(block.get_submodule(self.q))
        w = weight.view(n_heads, 2, d_head, -1)[:, half].reshape(n_heads * d_head, -1)  # (H * D, d_model)
        b = bias.view(n_heads, 2, d_head)[:, half].reshape(-1) if bias is not None else None  # (H * D,)
        return w, b

    def extract(self, block: nn.Module, n_heads: int, n_kv: int, d_head: int) -> list[Weights]:
        return [self._halves(block, n_heads, d_head, 0), linear(block.get_submodule(self.k)),
                linear(block.get_submodule(self.v))]

    def gate(self, block: nn.Module, n_heads: int, d_head: int) -> Weights:
        """The output gate's rows `(n_heads * d_head, d_model)` and bias: z * sigmoid(x W^T + b)."""
        return self._halves(block, n_heads, d_head, 1)


@dataclass(frozen=True)
class SeparateGate:
    """AFMoE: separate q, k, v Linears and a fourth, `gate`, whose output gates z per element:
    z * sigmoid(x W_gate^T + b)."""

    q: str
    k: str
    v: str
    gate_path: str

    def extract(self, block: nn.Module, n_heads: int, n_kv: int, d_head: int) -> list[Weights]:
        return [linear(block.get_submodule(p)) for p in (self.q, self.k, self.v)]

    def gate(self, block: nn.Module, n_heads: int, d_head: int) -> Weights:
        """The output gate's rows `(n_heads * d_head, d_model)` and bias."""
        return linear(block.get_submodule(self.gate_path))


@dataclass(frozen=True)
class HeadGate(SeparateGate):
    """LFM3: `SeparateGate`, but the fourth Linear has one output per head that scales the head's
    whole output: z_h * sigmoid(x w_h + b_h). `gate` gives each head's row repeated over its
    `d_head` dims, the same gate per element (None where the block has none: use_attention_gate off)."""

    def gate(self, block: nn.Module, n_heads: int, d_head: int) -> Weights:
        """The gate's rows `(n_heads * d_head, d_model)` (each head's `d_head` times) and bias, or (None, None)."""
        module = getattr(block, self.gate_path, None)
        if module is None:
            return None, None
        weight, bias = linear(module)  # (H, d_model), (H,)
        return weight.repeat_interleave(d_head, dim=0), bias.repeat_interleave(d_head) if bias is not None else None


@dataclass(frozen=True)
class FusedGroups:
    """CodeGen: one Linear whose output features are `groups` equal groups (the core attribute
    naming their number: CodeGen's `mp_num`, 4), each `[q_g | v_g | k_g]` (in `order`) of
    `n_heads * d_head / groups` rows, the rows of a run of whole heads; q is the groups' q parts
    in turn (so head h's rows lie in group h // (n_heads / groups)), k and v alike."""

    path: str
    groups: str
    order: tuple[str, ...] = ("q", "v", "k")

    def extract(self, block: nn.Module, n_heads: int, n_kv: int, d_head: int) -> list[Weights]:
        weight, bias = linear(block.get_submodule(self.path))
        groups = int(getattr(block, self.groups))
        w = weight.view(groups, 3, n_heads * d_head // groups, -1)  # (G, part, rows of the group, d_model)
        b = bias.view(groups, 3, -1) if bias is not None else None  # (G, part, rows of the group)
        parts = [self.order.index(name) for name in ("q", "k", "v")]
        return [(w[:, i].reshape(n_heads * d_head, -1), b[:, i].reshape(-1) if b is not None else None)
                for i in parts]

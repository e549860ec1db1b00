"""What the family tests share: the hook contract of an adapter (the five-family and the
all-family tests), an adapter changed for one test (`with_adapter_changed`, for mutation tests), and the two references they hold headscope to, independent of its kernel:
each attention module's own eager weights (`eager_weights`) and removing a head at its output
projection's input (`head_zeroed_at`, or `head_meaned_at` for mean ablation)."""
import dataclasses
from contextlib import contextmanager

import pytest
import torch

from headscope.attention import MultiHeadAttention
from headscope.hf import adapters
from headscope.hf.adapters import adapter_for, attention_blocks
from headscope.attention.hook_points import hook_points
from headscope.errors import HeadscopeError
from headscope.head_geometry.ov_circuit import ov_copying, ov_table


def with_adapter_changed(monkeypatch, model, vision: bool = False, **change) -> None:
    """For the rest of the test, the model's adapter in `ADAPTERS` (with `vision`, its vision tower's
    in `VISION_ADAPTERS`) is a copy with the fields `change` (a mutation: what verify must notice)."""
    table = "VISION_ADAPTERS" if vision else "ADAPTERS"
    adapter = adapters.vision_adapter_for(model.config) if vision else adapter_for(model.config)
    wrong = dataclasses.replace(adapter, **change)
    monkeypatch.setattr(adapters, table, tuple(wrong if a is adapter else a for a in getattr(adapters, table)))


@torch.no_grad()
def assert_hook_contract(model) -> None:
    """Every hook point of the first layer's `from_hf` module exists and fires once with its shape."""
    layer, block = attention_blocks(model)[0]
    m = MultiHeadAttention.from_hf(block, model.config, layer)
    c = m.config
    B, T = 2, 5
    expected = {
        "hook_q": (B, c.n_heads, T, c.d_head), "hook_k": (B, c.n_kv_heads, T, c.d_head),
        "hook_v": (B, c.n_kv_heads, T, c.d_value), "hook_scores": (B, c.n_heads, T, T),
        "hook_pattern": (B, c.n_heads, T, T), "hook_z": (B, T, c.n_heads, c.d_value),
        "hook_result": (B, T, c.n_heads, c.d_model),
    }
    assert set(hook_points(m)) == set(expected)
    seen = {}
    with m.hooks({n: (lambda n: lambda v, h: seen.setdefault(n, []).append(tuple(v.shape)))(n) for n in expected}):
        m(torch.randn(B, T, c.d_in))  # d_in: what the projections read (d_model but for zamba2)
    assert seen == {n: [s] for n, s in expected.items()}


def eager_weights(model, modules: dict, x: dict) -> dict:
    """`{layer: weights}` the attention modules `{layer: module}` return on their own eager path
    (`(output, weights)`, read with forward hooks) for `model(**x)`; the model's implementation
    is restored."""
    seen, handles = {}, []

    def keep(layer):
        def hook(module, args, out):
            seen[layer] = out[1]  # returns None: the output stays the model's
        return hook

    for layer, module in modules.items():
        handles.append(module.register_forward_hook(keep(layer)))
    run_eager(model, x, handles)
    return seen


def run_eager(model, x: dict, handles=()):
    """`model(**x)` on the model's eager attention; afterwards its implementation is restored
    and `handles` (hooks that recorded the pass) removed, also when the pass raises."""
    return run_under(model, x, "eager", handles)


def run_under(model, x: dict, implementation: str, handles=()):
    """`model(**x)` with the attention implementation `implementation` (a registered name: "eager",
    or a test's recording function); afterwards the model's own is restored and `handles` removed,
    also when the pass raises."""
    default = model.config._attn_implementation
    model.set_attn_implementation(implementation)
    try:
        return model(**x)
    finally:
        model.set_attn_implementation(default)
        for handle in handles:
            handle.remove()


@contextmanager
def head_zeroed_at(projection, head: int, n_heads: int):
    """Inside the block, a forward pre-hook on an output projection zeroes head `head`'s slice of
    its input `[..., n_heads * d_head]`: the ablation reference of the family tests."""
    def zero_slice(module, args):
        z = args[0].clone()  # (B, T, H * D)
        d = z.shape[-1] // n_heads
        z[..., head * d:(head + 1) * d] = 0
        return (z,)

    handle = projection.register_forward_pre_hook(zero_slice)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def head_meaned_at(projection, head: int, n_heads: int):
    """Inside the block, a forward pre-hook on an output projection sets head `head`'s slice of its
    input `[batch, pos, n_heads * d_head]` to its mean over batch and positions: the reference of
    mean ablation at the output projection's input."""
    def mean_slice(module, args):
        z = args[0].clone()  # (B, T, H * D)
        d = z.shape[-1] // n_heads
        z[..., head * d:(head + 1) * d] = z[..., head * d:(head + 1) * d].mean(dim=(0, 1), keepdim=True)
        return (z,)

    handle = projection.register_forward_pre_hook(mean_slice)
    try:
        yield
    finally:
        handle.remove()


def assert_ov_refused(loaded, match: str) -> str:
    """`ov_copying` refuses `loaded` in one line matching `match`, and `ov_table` gives no table and
    that reason (what analyze notes); returns the reason."""
    with pytest.raises(HeadscopeError, match=match) as err:
        ov_copying(loaded, n_tokens=0)
    assert "\n" not in str(err.value)
    frame, reason = ov_table(loaded)
    assert frame is None and reason == str(err.value)
    return reason


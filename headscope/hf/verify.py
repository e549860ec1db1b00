"""Side-by-side check of headscope's attention against a Hugging Face model's own.

`verify(model, inputs)` runs the model once with its eager attention and
`output_attentions=True`, records what every attention layer received (hidden states, mask,
rotary tables) and what its output projection produced, then runs a `MultiHeadAttention` built
with `from_hf` on exactly those inputs. Families whose adapter says from_hf is not available
(multi-head latent attention, T5) and families without an adapter get a one-line HeadscopeError.
It returns one row per layer: layer, max_abs_diff_output, max_abs_diff_pattern.
"""
from __future__ import annotations

import inspect
from typing import Mapping

import torch
from torch import nn

from ..errors import HeadscopeError
from ..attention.module import MultiHeadAttention
from .adapters import _sub, adapter_for, attention_blocks, out_projection
from .from_hf import rotary_tables

__all__ = ["verify", "DEFAULT_TOLERANCE"]

DEFAULT_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def _named_inputs(module: nn.Module, args, kwargs) -> dict:
    bound = inspect.signature(module.forward).bind_partial(*args, **kwargs)
    named = dict(bound.arguments)
    named.update(named.pop("kwargs", {}) or {})
    return named


@torch.no_grad()
def verify(model: nn.Module, inputs: Mapping[str, torch.Tensor]):
    """Compare every layer's headscope module with the model's attention on the same inputs.

    Args:
        model: a transformers model of a supported family.
        inputs: keyword inputs for `model(...)` (input_ids, attention_mask, ...).
    Returns:
        pandas DataFrame with columns layer, max_abs_diff_output, max_abs_diff_pattern.
    """
    import pandas as pd

    if not isinstance(model, nn.Module):
        raise HeadscopeError(f"verify needs a transformers model (loaded.model), got {type(model).__name__}")
    if not isinstance(inputs, Mapping) or not isinstance(inputs.get("input_ids"), torch.Tensor):
        raise HeadscopeError("verify needs inputs={'input_ids': tensor, ...} (e.g. dict(tokenizer(texts, return_tensors='pt')))")
    rows = model.get_input_embeddings().num_embeddings
    if inputs["input_ids"].numel() and not 0 <= int(inputs["input_ids"].min()) <= int(inputs["input_ids"].max()) < rows:
        raise HeadscopeError(f"input_ids reach {int(inputs['input_ids'].max())} but the model's embedding has {rows} rows: "
                             f"the tokenizer does not match the model")
    blocks = attention_blocks(model)  # raises without an adapter
    adapter = adapter_for(model.config)
    # Built first: from_hf raises where the family's adapter says it is not available.
    mine = {layer: MultiHeadAttention.from_hf(block, model.config) for layer, block in blocks}
    received: dict[int, dict] = {}
    produced: dict[int, torch.Tensor] = {}
    weights: dict[int, torch.Tensor] = {}  # the eager probabilities each core returned
    handles = []

    def save_inputs(layer):
        def hook(module, args, kwargs):
            received[layer] = _named_inputs(module, args, kwargs)
        return hook

    def save_output(layer):
        def hook(module, args, output):
            produced[layer] = output
        return hook

    def save_weights(layer):
        def hook(module, args, output):
            if isinstance(output, tuple) and len(output) > 1 and isinstance(output[1], torch.Tensor):
                weights[layer] = output[1]
        return hook

    previous = model.config._attn_implementation
    try:
        for layer, block in blocks:
            core = _sub(block, adapter.core)
            handles.append(core.register_forward_pre_hook(save_inputs(layer), with_kwargs=True))
            handles.append(core.register_forward_hook(save_weights(layer)))
            handles.append(out_projection(model, block).register_forward_hook(save_output(layer)))
        model.set_attn_implementation("eager")
        outputs = model(**inputs, output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
        model.set_attn_implementation(previous)

    rows = []
    for layer, block in blocks:
        got = received[layer]
        out, pattern = mine[layer](
            got["hidden_states"], got.get("attention_mask"),
            rotary=rotary_tables(mine[layer], model.config, got.get("position_embeddings")),
            return_pattern=True,
        )
        # The core's own eager weights: a hybrid's `attentions` holds only its attention layers
        # (or nothing), so the model's output tuple is not indexed by the model's layer numbers.
        theirs = weights[layer] if layer in weights else outputs.attentions[layer]
        rows.append({
            "layer": layer,
            "max_abs_diff_output": (out - produced[layer]).abs().max().item(),
            "max_abs_diff_pattern": (pattern.to(theirs.dtype) - theirs).abs().max().item(),
        })
    return pd.DataFrame(rows)

"""Side-by-side check of headscope's attention against a Hugging Face model's own.

`verify(model, inputs, sites=None)` runs the model once with its eager attention and
`output_attentions=True`, records what every attention module of a group of sites received
(hidden states, mask, cross-attention's context, rotary tables) and returned (T5: the position
bias it used; DeepSeek-V3.2: the keys its indexer selected, `Adapter.selector`) and what its
output projection produced, then runs a `MultiHeadAttention` built with `from_hf` on exactly
those inputs. `sites` names the group (`headscope.hf.sites`: an
encoder-decoder's "encoder", the default, "decoder.self" or "decoder.cross"); the reference
patterns are the model's own `encoder_attentions`, `decoder_attentions` or `cross_attentions`
where its output has them, else each module's eager weights (where those leave the sink out,
`Adapter.weights_before_sinks`, times the share the module's pattern gives the keys, its row sums) (mllama's "text.cross": its
cross-attention over the image's features, `cross_attention_states`). With `sites="vision"` the vision
tower's attention is compared (gemma3's SigLIP, llava's CLIP, mllama's, qwen2_5_vl's; its adapter in
`headscope.hf.adapters.VISION_ADAPTERS`), against each module's eager weights; a packed module
(qwen2_5_vl's, once per image or window: `headscope.hf.sites`) against the eager weights of its calls,
kept by an attention implementation that runs the module's own eager function (`_record_eager`), joined
along the diagonal, its headscope module run on the whole packed sequence with a block-diagonal mask
(`call_arguments`). Families whose adapter says from_hf is not available, blocks whose linear layers quantize as they run (a quantized bitnet checkpoint) and
families without an adapter get a one-line HeadscopeError. It returns one row per layer of the
group: layer, site (the module path), max_abs_diff_output, max_abs_diff_pattern.
`teacher_forced(model, inputs)` adds an encoder-decoder's decoder_input_ids (its start token, then
the encoder's ids shifted right), which its decoder sites need (`headscope verify --sites`).
"""
from __future__ import annotations

import inspect
import sys
from typing import Mapping, Optional

import torch
from torch import nn

from ..errors import HeadscopeError
from ..attention.module import MultiHeadAttention
from .adapters import _needs_adapter, _sub, block_adapter, out_projection
from .from_hf import call_arguments
from .route import block_diagonal
from .sites import select
from ..probes.copy import decoder_start_token, shifted_right

__all__ = ["verify", "teacher_forced", "DEFAULT_TOLERANCE"]

DEFAULT_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
# The model output holding each group's eager patterns, by layer of the group (an encoder-decoder's).
_EAGER_OUTPUTS = {"encoder.self": "encoder_attentions", "decoder.self": "decoder_attentions",
                  "decoder.cross": "cross_attentions"}
# The attention implementation verify runs a model with packed sites under: eager, keeping their calls' weights.
_RECORDING = "headscope_verify"
_KEPT: dict[int, list] = {}  # id(packed module) -> the eager weights of its calls so far, while verify runs
_BIAS: dict[int, Optional[torch.Tensor]] = {}  # id(module) -> the score bias it handed its attention function


def _record_eager(module, query, key, value, attention_mask, **kwargs):
    """transformers attention-interface function: the eager attention of the module's own modeling file
    (what its forward falls back on under "eager"), keeping the weights `[1, head, n, n]` of a packed
    module's calls and the `position_bias` of a module that computes its own (`Adapter.bias_in_call`);
    the weights are returned as eager returns them."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise HeadscopeError(f"{type(module).__name__}'s modeling file has no eager_attention_forward for verify "
                             f"to compare with")
    out, weights = eager(module, query, key, value, attention_mask, **kwargs)
    if id(module) in _KEPT:
        _KEPT[id(module)].append(weights)
    if id(module) in _BIAS:
        _BIAS[id(module)] = kwargs.get("position_bias")
    return out, weights


def _register_recording() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(_RECORDING, _record_eager)
    AttentionMaskInterface.register(_RECORDING, eager_mask)


def _named_inputs(module: nn.Module, args, kwargs) -> dict:
    bound = inspect.signature(module.forward).bind_partial(*args, **kwargs)
    named = dict(bound.arguments)
    named.update(named.pop("kwargs", {}) or {})
    return named


def _check_inputs(model: nn.Module, inputs) -> None:
    main = getattr(model, "main_input_name", "input_ids")  # whisper: input_features
    given = isinstance(inputs, Mapping) and (isinstance(inputs.get(main), torch.Tensor)
                                             or inputs.get("encoder_outputs") is not None)  # the encoder skipped
    if not given:
        raise HeadscopeError(f"verify needs inputs={{'{main}': tensor, ...}} (e.g. dict(tokenizer(texts, "
                             f"return_tensors='pt')))")
    ids = inputs.get("input_ids")
    rows = model.get_input_embeddings().num_embeddings
    if isinstance(ids, torch.Tensor) and ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < rows:
        raise HeadscopeError(f"input_ids reach {int(ids.max())} but the model's embedding has {rows} rows: "
                             f"the tokenizer does not match the model")


def teacher_forced(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> dict:
    """`inputs` with an encoder-decoder's `decoder_input_ids`: its decoder start token, then
    `input_ids` shifted right by one (as transformers makes them from labels); unchanged for
    other models and where decoder_input_ids are given."""
    inputs = dict(inputs)
    if not getattr(model.config, "is_encoder_decoder", False) or "decoder_input_ids" in inputs:
        return inputs
    start = decoder_start_token(model)
    if start is None or not isinstance(inputs.get("input_ids"), torch.Tensor):
        raise HeadscopeError(f"{type(model).__name__}'s decoder needs decoder_input_ids, and it has no "
                             f"decoder_start_token_id (or the inputs no input_ids) to make them from")
    inputs["decoder_input_ids"] = shifted_right(inputs["input_ids"], start)
    return inputs


@torch.no_grad()
def verify(model: nn.Module, inputs: Mapping[str, torch.Tensor], sites: Optional[str] = None):
    """Compare every layer's headscope module with the model's attention on the same inputs.

    Args:
        model: a transformers model of a family with an adapter.
        inputs: keyword inputs for `model(...)` (input_ids, attention_mask, ...; an
            encoder-decoder's decoder sites need decoder_input_ids, whisper input_features).
        sites: the group of attention sites to compare ("decoder.cross", "vision"; None: the default stack).
    Returns:
        pandas DataFrame with columns layer (within the group), site (the module path),
        max_abs_diff_output, max_abs_diff_pattern.
    """
    import pandas as pd

    if not isinstance(model, nn.Module):
        raise HeadscopeError(f"verify needs a transformers model (loaded.model), got {type(model).__name__}")
    _check_inputs(model, inputs)
    selection = select(model, sites)
    if not selection.blocks:
        if selection.default:
            _needs_adapter(model.config)  # names the family without an adapter, and what works without one
        raise HeadscopeError(f"verify compares the sites a family adapter describes; {type(model).__name__}'s "
                             f"{selection.group!r} sites have none (capture, ablate and hooks work on them)")
    blocks = sorted(selection.blocks.items())
    adapters = {layer: block_adapter(model.config, block)[0] for layer, block in blocks}
    # Built first: from_hf raises where the family's adapter says it is not available.
    mine = {layer: MultiHeadAttention.from_hf(block, model.config, layer) for layer, block in blocks}
    packed = {layer: selection.cores[layer] for layer in selection.packed if layer in selection.blocks}
    biased = {layer: selection.cores[layer] for layer, _ in blocks if adapters[layer].bias_in_call}
    received: dict[int, dict] = {}
    returned: dict[int, tuple] = {}
    produced: dict[int, torch.Tensor] = {}
    handles = []

    def save_inputs(layer):
        def hook(module, args, kwargs):
            received[layer] = _named_inputs(module, args, kwargs)
        return hook

    def save_returned(layer):
        def hook(module, args, output):
            returned[layer] = output
        return hook

    def save_output(layer):
        def hook(module, args, output):
            produced[layer] = output
        return hook

    def save_selection(layer):  # runs inside the core's forward, after its inputs were saved
        def hook(module, args, output):
            received[layer]["indices"] = output
        return hook

    previous = model.config._attn_implementation
    recording = bool(packed or biased)
    if recording:
        _register_recording()
    try:
        for layer, block in blocks:
            core = selection.cores[layer]
            handles.append(core.register_forward_pre_hook(save_inputs(layer), with_kwargs=True))
            handles.append(core.register_forward_hook(save_returned(layer)))
            handles.append(out_projection(model, block).register_forward_hook(save_output(layer)))
            if adapters[layer].selector:
                handles.append(_sub(core, adapters[layer].selector).register_forward_hook(save_selection(layer)))
        _KEPT.update({id(core): [] for core in packed.values()})
        _BIAS.update({id(core): None for core in biased.values()})
        model.set_attn_implementation(_RECORDING if recording else "eager")
        outputs = model(**inputs, output_attentions=True)
        kept = {layer: _KEPT[id(core)] for layer, core in packed.items()}
        for layer, core in biased.items():
            if layer in received:
                received[layer]["bias_in_call"] = _BIAS[id(core)]
    finally:
        for handle in handles:
            handle.remove()
        for core in packed.values():
            _KEPT.pop(id(core), None)
        for core in biased.values():
            _BIAS.pop(id(core), None)
        model.set_attn_implementation(previous)

    missing = [layer for layer, _ in blocks if layer not in received]
    if missing:
        raise HeadscopeError(f"{selection.noun} {missing[0]} ({selection.sites[missing[0]].name}) never ran on these "
                             f"inputs, so verify has nothing to compare (an encoder-decoder's encoder runs unless "
                             f"encoder_outputs are given, its decoder only with decoder_input_ids; mllama's "
                             f"cross-attention only with an image)")
    group = selection.sites[blocks[0][0]].group
    eager = getattr(outputs, _EAGER_OUTPUTS.get(group, ""), None)
    rows = []
    for layer, block in blocks:
        arguments = call_arguments(mine[layer], model.config, received[layer], returned[layer], block)
        out, pattern = mine[layer](**arguments, return_pattern=True)
        # A hybrid's `attentions` holds only its attention layers (or nothing), so it is not indexed
        # by the model's layer numbers: there the module's own eager weights are the reference.
        own, returns = returned[layer], adapters[layer].returns
        at = returns.index("weights") if "weights" in returns else None
        weights = own[at] if at is not None and isinstance(own, tuple) and len(own) > at else None
        if layer in kept:  # a packed module's calls, joined along the diagonal
            theirs = block_diagonal(kept[layer])
        else:
            theirs = eager[layer] if eager is not None else (weights if isinstance(weights, torch.Tensor)
                                                               else outputs.attentions[layer])
        if adapters[layer].weights_before_sinks:  # eager weights over the keys alone: given the module's key share
            theirs = theirs * pattern.sum(-1, keepdim=True).to(theirs.dtype)
        rows.append({
            "layer": layer,
            "site": selection.sites[layer].name,
            "max_abs_diff_output": (out.reshape(produced[layer].shape) - produced[layer]).abs().max().item(),
            "max_abs_diff_pattern": (pattern.to(theirs.dtype) - theirs).abs().max().item(),
        })
    return pd.DataFrame(rows)

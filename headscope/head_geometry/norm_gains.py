"""The gains of the norms in front of each attention block and of the unembedding, found by what they do.

A pre-norm transformer computes a layer's values from norm(x) = x / scale(x) * g (+ b), and its
logits from the final norm's output. For a weights-only circuit such as the OV circuit
(`headscope.head_geometry.ov_circuit`), the gains g fold into the adjacent matrices (W_V -> diag(g_in) W_V,
W_U -> diag(g_final) W_U); the per-token scale only multiplies whole rows and the biases are
left out.

- `norm_gains(model)` -> `(per-layer input gains {layer: [d_model]}, final gain [d_model])`, None
  where no norm was found. The norms are found, not named: one short forward pass records the
  output of every module with a `[d_model]` weight, and the one whose output is exactly what
  the attention block (or the unembedding) receives is that block's norm, so shared code never
  branches on a family.
- The gain is read off what the norm does, too: its weight where it multiplies by the weight
  (Llama's RMSNorm, LayerNorm), `1 + weight` where it multiplies by that (Gemma's RMSNorm:
  `x / rms(x) * (1 + weight)`), told apart by `measured_gain`.
- `measured_gain(norm, d_model)`: the norm run on `u` and `-u`, `u` a vector of +1 and -1 with
  mean 0 and mean square 1, which LayerNorm and RMSNorm both leave as it is up to their eps, so
  `(norm(u) - norm(-u)) / 2u` is the gain (the bias cancels).
- `norm_gain(norm, d_model)`: the gain itself, the norm's weight or `1 + weight` (`measured_gain`
  tells which).
- `attention_norms(model)` -> `{layer: (input norm, post norm)}`: the modules themselves, None
  where absent; the post norm is the one that reads the attention block's output before the
  residual stream (Gemma 2 and 3's `post_attention_layernorm`), found the same way.
- `centres(norm, d_model)`: whether the norm removes the mean (LayerNorm) or not (RMSNorm), told
  by running it on `u` and `u + 1`.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..hf.adapters import analysed_body, attention_blocks, text_stack

__all__ = ["norm_gains", "norm_gain", "measured_gain", "attention_norms", "centres"]


@torch.no_grad()
def norm_gains(model) -> tuple[dict[int, Optional[torch.Tensor]], Optional[torch.Tensor]]:
    """Gains of the norm feeding each attention block, and of the norm feeding the unembedding.

    Args:
        model: a transformers model with an adapter (`attention_blocks`).
    Returns:
        `({layer: [d_model] fp32 or None}, [d_model] fp32 or None)`.
    """
    found = _recorded(model)
    d_model = found["d_model"]
    gains = {layer: None if pre is None else norm_gain(pre, d_model) for layer, (pre, _) in found["layers"].items()}
    final = found["final"]
    return gains, None if final is None else norm_gain(final, d_model)


@torch.no_grad()
def attention_norms(model) -> dict:
    """`{layer: (input norm or None, post norm or None)}` of every attention block (module docstring)."""
    return _recorded(model)["layers"]


@torch.no_grad()
def centres(norm, d_model: int) -> bool:
    """Whether `norm` removes its input's mean: LayerNorm does (norm(u + 1) = norm(u)), RMSNorm not."""
    weight = norm.weight
    u = torch.ones(d_model, device=weight.device, dtype=torch.float32)
    u[1::2] = -1.0
    x = u.to(weight.dtype)[None, None]
    return bool(torch.allclose(norm(x + 1).float(), norm(x).float(), atol=1e-3, rtol=1e-3))


def _recorded(model) -> dict:
    """One short forward pass: each attention block's input and output, the unembedding's input,
    and the input and output of every module with a `[d_model]` weight; matched by equality."""
    d_model = model.get_input_embeddings().weight.shape[1]
    candidates = {name: module for name, module in model.named_modules()
                  if isinstance(getattr(module, "weight", None), torch.Tensor) and module.weight.dim() == 1
                  and module.weight.shape[0] == d_model and not list(module.children())}
    outputs: dict[str, torch.Tensor] = {}
    read: dict[str, torch.Tensor] = {}
    inputs: dict[object, torch.Tensor] = {}
    written: dict[object, torch.Tensor] = {}
    handles = []

    def keep(name):
        def hook(module, args, output):
            outputs[name] = output.detach()
            if args and isinstance(args[0], torch.Tensor):
                read[name] = args[0].detach()
        return hook

    def keep_input(key):
        def hook(module, args, kwargs):
            first = args[0] if args else kwargs.get("hidden_states")
            inputs[key] = first.detach()
        return hook

    def keep_output(key):
        def hook(module, args, kwargs, output):
            first = output if isinstance(output, torch.Tensor) else output[0]
            written[key] = first.detach()
        return hook

    try:
        for name, module in candidates.items():
            handles.append(module.register_forward_hook(keep(name)))
        blocks = dict(attention_blocks(model))
        for layer, block in blocks.items():
            handles.append(block.register_forward_pre_hook(keep_input(layer), with_kwargs=True))
            handles.append(block.register_forward_hook(keep_output(layer), with_kwargs=True))
        unembed = model.get_output_embeddings()
        if unembed is not None:
            handles.append(unembed.register_forward_pre_hook(keep_input("final"), with_kwargs=True))
        ids = torch.arange(3, 9, device=model.get_input_embeddings().weight.device)[None]
        body = analysed_body(model)
        # The whole model, unless the captured layers run in a part of it (T5's encoder, which
        # takes token ids alone; the decoder would want its own inputs).
        (model if body is text_stack(model) else body)(input_ids=ids)
    finally:
        for handle in handles:
            handle.remove()

    def producing(seen):  # the norm whose output is `seen`
        for name, out in outputs.items():
            if seen is not None and out.shape == seen.shape and torch.equal(out, seen):
                return candidates[name]
        return None

    def reading(seen):  # the norm whose input is `seen`
        for name, x in read.items():
            if seen is not None and x.shape == seen.shape and torch.equal(x, seen):
                return candidates[name]
        return None

    layers = {layer: (producing(inputs.get(layer)), reading(written.get(layer))) for layer in blocks}
    return {"d_model": d_model, "layers": layers, "final": producing(inputs.get("final"))}


@torch.no_grad()
def measured_gain(norm, d_model: int) -> torch.Tensor:
    """`[d_model]` fp32: what `norm` multiplies each dimension by (module docstring)."""
    weight = norm.weight
    u = torch.ones(d_model, device=weight.device, dtype=torch.float32)
    u[1::2] = -1.0  # mean 0 over an even width, mean square 1 (an odd width: mean 1/d, close)
    x = u.to(weight.dtype)[None, None]  # (1, 1, d_model)
    return ((norm(x) - norm(-x)).float()[0, 0] / (2 * u))


def norm_gain(norm, d_model: int) -> torch.Tensor:
    """The norm's weight, or `1 + weight`, whichever it multiplies by: the one nearer its
    measured gain (they differ by 1 in every dimension, the measurement by about eps)."""
    weight = norm.weight.detach().float()
    measured = measured_gain(norm, d_model)
    plain, shifted = weight.clone(), 1.0 + weight
    return plain if (measured - plain).abs().max() <= (measured - shifted).abs().max() else shifted


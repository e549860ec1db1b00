"""Direct logit attribution: how much of the logit difference each component writes directly.

`logit_attribution(loaded, task, on="clean")` runs the task's prompts and takes the last residual
state at each example's answer position apart (`headscope.circuits.residual`): the embedding,
every head's output (`hook_result`, after W_O), each attention block's output bias, each MLP or
other mixer, and the constant the final norm's and the unembedding's biases add. With the final
norm's per-token scale frozen at the run's own value (and any post-sublayer norm's, as Gemma's),
the logit difference is linear in the residual state, so

    effect(c) = logit_scale * readout * (g * P(c) / s) . (mean_{a in A} W_U[a] - mean_{w in W} W_U[w])

for each component c, and the effects of all components sum to the model's own logit difference
(TransformerLens's `stack_head_results` + `apply_ln_to_stack` + `logit_attrs`; Elhage et al. 2021,
"A Mathematical Framework for Transformer Circuits", for the direct path). P subtracts the mean
for a LayerNorm, nothing for an RMSNorm; g is the norm's gain, s its scale on that row; readout is
1, or the fixed factor between the final norm and the unembedding (T5's tied head: d_model ** -0.5);
logit_scale is 1, or the model's fixed multiplier of its logits (Cohere's). A model whose logits
are soft-capped (Gemma 2) is not linear there and is refused.

A head's effect is its *direct* effect only: what it writes that the unembedding reads without
passing another layer. Heads that act through later heads (IOI's S-inhibition heads) show small
direct effects; `headscope.attribute` measures total effects.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ..errors import HeadscopeError, UsageError
from ..detectors.stats import bootstrap_mean_ci
from ..hf.adapters import out_projection
from ..hf.hooks import model_hooks
from .residual import Decomposition, close, decompose, frozen_norm, layer_list, record
from .target import Target, batches, output_logits

__all__ = ["logit_attribution", "COLUMNS"]

COLUMNS = ["kind", "layer", "head", "site", "effect", "lo", "hi"]
ON = ("clean", "corrupted")


def logit_attribution(loaded: Any, task: Any, on: str = "clean", sites: Optional[str] = None,
                      batch_size: int = 32, n_resamples: int = 1000, seed: int = 0):
    """Each component's direct effect on the task's logit difference (module docstring).

    Args:
        loaded: a `headscope.Loaded` (or a transformers model with an adapter: heads are read
            through W_O, as `hook_result` reads them).
        task: a `headscope.Task`; its answer and wrong tokens define the logit difference, whatever
            its metric.
        on: "clean" (default) or "corrupted": which prompts run.
        sites: the group of attention sites whose heads are components ("decoder.self" for an
            encoder-decoder's decoder); default: the analysed stack.
        batch_size: prompts per forward pass.
        n_resamples: bootstrap resamples of the examples for the 95% intervals.
        seed: the bootstrap's seed.
    Returns:
        pandas DataFrame, one row per component: kind ("embed", "head", "bias", "attn", "mlp",
        "mixer"), layer (the model's own numbers; None for embed and the final bias), head (heads
        only), site (the module path), effect (mean over examples), lo, hi (95% percentile bootstrap
        interval). `attrs`: total (the model's own mean logit difference), n (examples), on.
    """
    import pandas as pd

    if on not in ON:
        raise UsageError(f"on must be 'clean' or 'corrupted', got {on!r}")
    target = Target(loaded, task, sites, "logit_attribution")
    task = task.with_metric("logit_diff") if task.metric != "logit_diff" else task
    rows, per_example, totals = None, [], []
    for part in batches(task.n, batch_size):
        names, effects, total = _batch(target, task.subset(part), on)
        if rows is None:
            rows = names
        elif names != rows:
            raise HeadscopeError("the model's components differ between batches of the task; run it in one batch")
        per_example.append(effects)
        totals.append(total)
    effects = torch.cat(per_example, dim=1)  # (components, examples)
    mean, low, high, _ = bootstrap_mean_ci(effects, n_resamples=n_resamples, seed=seed)
    table = pd.DataFrame([dict(zip(("kind", "layer", "head", "site"), name), effect=float(m), lo=float(lo),
                               hi=float(hi)) for name, m, lo, hi in zip(rows, mean, low, high)], columns=COLUMNS)
    table["layer"] = table["layer"].astype("Int64")
    table["head"] = table["head"].astype("Int64")
    table.attrs.update(total=float(torch.cat(totals).double().mean()), n=int(task.n), on=on)
    return table


@torch.no_grad()
def _batch(target: Target, task, on: str):
    """(component names, effects `[components, n]`, the model's logit differences `[n]`) of one batch."""
    model, selection = target.model, target.selection
    inputs, positions = target.inputs(task, on)
    rows = torch.arange(task.n, device=positions.device)
    results = {}

    def keep(value, hook):  # (B, T, H, D) -> the answer positions, (B, H, D)
        results[int(hook.name.split(".")[1])] = value[rows, positions].detach()

    stack = layer_list(model, selection)[0].rpartition(".")[0]
    length = inputs["decoder_input_ids" if target.two_inputs else "input_ids"].shape[1]
    with record(model, positions, length, target.d_model, within=stack + "." if stack else "") as rec, \
            model_hooks(model, {"layers.*.attn.hook_result": keep}, sites=target.sites):
        logits = output_logits(model(**inputs))
    parts = decompose(model, rec, selection, target.d_model)
    readout = _readout(model, parts, rec)
    unembed = model.get_output_embeddings()
    direction = task.direction(unembed.weight.detach().float()).to(positions.device)  # (n, d)
    final = logits[rows, positions].float()
    unembedded = unembed(rec.inputs[parts.unembed]).float()  # (n, vocab): what the head computed there
    scale, logit_bias = _logit_map(final, unembedded, type(model).__name__, logits.dtype)
    total = task.score(target.aligned(logits).float())

    paths = {id(m): name for name, m in model.named_modules()}
    embedding = paths.get(id(model.get_input_embeddings()), parts.embed)
    names, effects = [("embed", None, None, embedding)], [readout(rec.inputs[parts.embed])]
    for layer, writers in parts.writers.items():
        for writer in writers:
            for name, value in _parts_of(model, writer, rec, results.get(layer), target.d_model):
                names.append(name)
                effects.append(readout(value))
    names.append(("bias", None, None, "final"))
    effects.append(readout.constant.expand(task.n, -1))
    stacked = torch.stack(effects)  # (components, n, d)
    contributions = scale * (stacked * direction).sum(-1)
    bias = logit_bias + (scale * readout.lm_bias if readout.lm_bias is not None else 0.0)  # (vocab,)
    contributions[-1] += task.direction(bias[:, None]).to(positions.device)[:, 0]
    if readout.lm_bias is None and not logit_bias.any() and (readout.frozen is None or getattr(
            dict(model.named_modules())[parts.final_norm], "bias", None) is None):
        names, contributions = names[:-1], contributions[:-1]  # no bias after the last layer: no row
    if not close(contributions.sum(0), total, contributions, like=logits.dtype):
        raise HeadscopeError(f"{type(model).__name__}: the components do not add up to the logit difference "
                             f"(off by {float((contributions.sum(0) - total).abs().max()):.3g}), so they cannot be "
                             f"reported as its parts")
    return names, contributions.cpu(), total.cpu()


class _Readout:
    """The final norm, frozen, and the readout factor: `self(c)` = readout * g * P(c) / s for a part
    c of the last residual state; `constant` `[1, d]` what the final norm's bias adds, and `lm_bias`
    the unembedding's bias `[vocab]` (or None)."""

    def __init__(self, frozen, factor: float, lm_bias, d_model: int, device):
        self.frozen, self.factor, self.lm_bias = frozen, factor, lm_bias
        bias = frozen.bias if frozen is not None else torch.zeros(d_model, device=device)
        self.constant = (factor * bias)[None]

    def __call__(self, part: torch.Tensor) -> torch.Tensor:
        part = part.float()
        return self.factor * (self.frozen.apply(part) if self.frozen is not None else part)


def _readout(model, parts: Decomposition, rec) -> _Readout:
    modules = dict(model.named_modules())
    first = rec.inputs[parts.embed]
    frozen = None
    if parts.final_norm is not None:
        frozen = frozen_norm(modules[parts.final_norm], rec.inputs[parts.final_norm],
                             rec.outputs[parts.final_norm], f"the final norm ({parts.final_norm})")
    bias = getattr(modules[parts.unembed], "bias", None)
    return _Readout(frozen, parts.readout, bias.detach().float() if bias is not None else None, first.shape[-1],
                    first.device)


def _logit_map(final: torch.Tensor, unembedded: torch.Tensor, name: str, dtype) -> tuple[float, torch.Tensor]:
    """`(c, beta [vocab])` with the model's logits = c * the unembedding's output + beta at every row:
    c is 1 almost everywhere (Cohere scales its logits), beta 0 (BART-like models add a
    `final_logits_bias`). Fitted on the rows' differences, so one row alone is read as beta = 0."""
    if final.shape[0] > 1:
        moved, seen = final - final.mean(0), unembedded - unembedded.mean(0)
    else:
        moved, seen = final, unembedded
    scale = float((moved * seen).sum() / (seen * seen).sum().clamp_min(1e-30))
    beta = torch.zeros_like(final[0])
    if final.shape[0] > 1 and not close(final, scale * unembedded, final, like=dtype):
        beta = (final - scale * unembedded).mean(0)  # no bias where none is needed: the rows stay the same
    if not close(final, scale * unembedded + beta, final, like=dtype):
        raise HeadscopeError(f"{name}'s logits are not its unembedding's output times a constant plus a bias "
                             f"(soft-capped logits, as Gemma 2's), so they are not a sum of the residual stream's parts")
    return scale, beta


def _parts_of(model, writer, rec, results: Optional[torch.Tensor], d_model: int):
    """`[(name, [n, d] contribution to the last residual state)]` of one writer: a head group's heads
    and output bias, or the writer's whole output. The contributions pass its post-norm, frozen."""
    post = None
    if writer.post_norm is not None:
        post = frozen_norm(writer.post_norm, rec.inputs[writer.post_path], rec.outputs[writer.post_path],
                           f"layer {writer.layer}'s norm {writer.post_path}")
    if writer.kind != "heads":
        output = rec.outputs[writer.post_path or writer.path].float()
        return [((writer.kind, writer.layer, None, writer.path), output)]
    if results is None:
        raise HeadscopeError(f"layer {writer.layer}'s attention ran without its heads' outputs being seen")
    results = results.float()  # (n, H, d)
    out = out_projection(model, writer.module)
    bias = getattr(out, "bias", None)
    has_bias = bias is not None or getattr(writer.post_norm, "bias", None) is not None
    bias = bias.detach().float() if bias is not None else torch.zeros(d_model, device=results.device)
    if not close(results.sum(1) + bias, rec.outputs[writer.path].float(), results, like=rec.outputs[writer.path].dtype):
        raise HeadscopeError(f"layer {writer.layer}'s heads do not add up to its attention block's output "
                             f"({writer.path}), so they cannot be parts of it")
    if post is not None:
        heads = post.apply(results)
        bias = post.apply(bias.expand(results.shape[0], -1)) + post.bias
    else:
        heads, bias = results, bias.expand(results.shape[0], -1)
    found = [(("head", writer.layer, h, writer.path), heads[:, h]) for h in range(heads.shape[1])]
    return found + ([(("bias", writer.layer, None, writer.path), bias)] if has_bias else [])

"""Activation patching per head, inside Hugging Face models.

- `patch(loaded, clean, corrupted, metric, hook="z", direction="denoising")`: runs the clean and
  the corrupted prompts, then one of them again with one head's activation taken from the other
  run, for every head; returns a DataFrame (layer, head, effect, patched_metric).
  "denoising" (clean -> corrupted) reruns the corrupted prompts with the head's clean activation:
      effect = (metric(patched) - metric(corrupted)) / (metric(clean) - metric(corrupted)),
  the fraction of the gap the head's clean activation recovers (is it sufficient?).
  "noising" (corrupted -> clean) reruns the clean prompts with the head's corrupted activation:
      effect = (metric(clean) - metric(patched)) / (metric(clean) - metric(corrupted)),
  the fraction of the gap lost without the head's clean activation (is it necessary?).
  Either way 1 means the head alone carries the whole gap, 0 nothing, negative the other way
  (Heimersheim & Nanda, "How to use and interpret activation patching", 2024: denoising finds
  each of several redundant ("OR") components, noising each of several jointly needed ("AND")
  ones). Heads are batched: each forward pass repeats the rerun batch and patches a different
  head in each copy, so `heads_per_pass` heads cost one pass. `sites="decoder.cross"` patches
  another group of attention sites than the analysed stack (`headscope.hf.sites`); the layers
  in the table are then that group's.
  `hook` is one of z, pattern, result (per query head) or q, k, v (q per query head; k and v per
  key/value head, as `hook_k` and `hook_v` hold them under grouped-query attention).
- `plot_patching(table)`: the effects as a plotly heatmap, layer by head.
- `patched_runs(...)`: the same runs, each example's metric kept (`headscope.attribute`'s exact method).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional, Union

import torch

from ..errors import HeadscopeError
from ..checks import check_count, check_loaded
from ..hf.activation_cache import cache_activations
from ..hf.capture import head_pairs
from ..hf.hooks import model_hooks, point_name
from ..hf.route import selection

__all__ = ["patch", "patched_runs", "plot_patching", "HEAD_AXIS", "DIRECTIONS"]

# Which axis of each patchable point holds the heads (shapes as in `headscope.hf.hooks`):
# z/result [B, T, H, ...], pattern [B, H, Tq, Tk], q [B, H, T, D], k/v [B, KV, T, D] (key/value heads).
HEAD_AXIS = {"z": 2, "pattern": 1, "result": 2, "q": 1, "k": 1, "v": 1}
DIRECTIONS = ("denoising", "noising")  # clean -> corrupted, corrupted -> clean
Inputs = Union[torch.Tensor, Mapping[str, torch.Tensor]]
Metric = Callable[[torch.Tensor], torch.Tensor]


def _as_inputs(x: Inputs, device) -> dict:
    if not isinstance(x, (torch.Tensor, Mapping)) or (isinstance(x, Mapping) and not all(
            isinstance(v, torch.Tensor) for v in x.values())):
        raise HeadscopeError(f"patch takes token ids (a tensor) or tokenizer output (a dict of tensors) for clean and "
                             f"corrupted, got {type(x).__name__}; tokenize the prompts first")
    x = {"input_ids": x} if isinstance(x, torch.Tensor) else dict(x)
    return {k: v.to(device) for k, v in x.items()}


def _output(model, inputs: dict) -> torch.Tensor:
    out = model(**inputs)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _scores(metric: Metric, logits: torch.Tensor) -> torch.Tensor:
    """The metric of one batch-sized piece of logits: `[batch]`, or `[1]` for a metric that
    returns a scalar; fp32 on the CPU."""
    return torch.as_tensor(metric(logits)).detach().float().reshape(-1).cpu()


def _heads_of(place: torch.Tensor, axis: int, head: int) -> tuple:
    """Index of one head's slice along `axis` (the batch axis is handled by the caller)."""
    return (slice(None),) * (axis - 1) + (head,)


@torch.no_grad()
def patch(
    loaded: Any,
    clean: Inputs,
    corrupted: Inputs,
    metric: Metric,
    hook: str = "z",
    heads: Optional[Iterable[tuple[int, int]]] = None,
    heads_per_pass: Optional[int] = None,
    direction: str = "denoising",
    sites: Optional[str] = None,
):
    """Patch each head's activation from one run into the other: clean into corrupted
    ("denoising", the default) or corrupted into clean ("noising").

    Args:
        loaded: a `headscope.Loaded` or a transformers model headscope runs inside
            ("result" needs the family's adapter).
        clean, corrupted: `input_ids` `[batch, pos]` or dicts of model inputs, of equal shapes.
        metric: `fn(logits [batch, pos, vocab]) -> scalar or [batch]` (encoders: the last
            hidden state); called on one batch-sized piece at a time and averaged.
        hook: which activation to patch: "z" (the head's output before W_O), "pattern",
            "result" (its output after W_O), "q", "k" or "v" (k and v per key/value head).
        heads: `[(layer, head), ...]` to patch (default every head).
        heads_per_pass: heads patched per forward pass (default: enough for 64 examples).
        direction: "denoising" (rerun corrupted with a clean activation; effect = recovered
            fraction of the gap) or "noising" (rerun clean with a corrupted activation; effect
            = lost fraction of the gap).
        sites: the group of attention sites whose heads are patched ("decoder.cross";
            `headscope.hf.sites`); default: the analysed stack. An encoder-decoder's inputs
            then hold its decoder inputs too (`decoder_input_ids`).
    Returns:
        pandas DataFrame with columns layer, head, effect, patched_metric; `table.attrs` holds
        clean_metric, corrupted_metric, hook and direction.
    """
    check_loaded(loaded, "patch")
    import pandas as pd

    model = getattr(loaded, "model", loaded)
    source_metric, rerun_metric, patched = patched_runs(model, clean, corrupted, metric, hook, heads, heads_per_pass,
                                                        direction, sites)
    source_metric, rerun_metric = float(source_metric.mean()), float(rerun_metric.mean())
    clean_metric, corrupted_metric = (source_metric, rerun_metric) if direction == "denoising" \
        else (rerun_metric, source_metric)
    rows = []
    for (layer, head), values in patched.items():
        value = float(values.mean())
        # (patched - rerun) / (source - rerun): recovered (denoising) or lost (noising) fraction
        rows.append({"layer": layer, "head": head, "effect": (value - rerun_metric) / (source_metric - rerun_metric),
                     "patched_metric": value})
    table = pd.DataFrame(rows, columns=["layer", "head", "effect", "patched_metric"])
    table.attrs.update(clean_metric=clean_metric, corrupted_metric=corrupted_metric, hook=hook,
                       direction=direction)
    return table


@torch.no_grad()
def patched_runs(model, clean: Inputs, corrupted: Inputs, metric: Metric, hook: str = "z",
                 heads: Optional[Iterable[tuple[int, int]]] = None, heads_per_pass: Optional[int] = None,
                 direction: str = "denoising", sites: Optional[str] = None):
    """`patch`'s runs with each example's metric kept (arguments as `patch`'s, `model` a transformers
    model). Returns `(source [n], rerun [n], {(layer, head): patched [n]})` fp32 on the CPU, where
    the source run is the clean one for "denoising", the corrupted one for "noising" (n is 1 for a
    metric that returns a scalar)."""
    if not callable(metric):
        raise HeadscopeError(f"patch needs metric=fn(logits) -> [batch] (a logit difference, say), got {metric!r}")
    if hook not in HEAD_AXIS:
        raise HeadscopeError(f"cannot patch {hook!r}; choose one of {', '.join(HEAD_AXIS)}")
    if direction not in DIRECTIONS:
        raise HeadscopeError(f"unknown direction {direction!r}; choose one of {', '.join(DIRECTIONS)}")
    device = next(model.parameters()).device
    clean, corrupted = _as_inputs(clean, device), _as_inputs(corrupted, device)
    main = "input_ids" if "input_ids" in clean else next(iter(clean))  # whisper: input_features
    if main not in corrupted or clean[main].shape != corrupted[main].shape:
        shown = tuple(corrupted[main].shape) if main in corrupted else f"(no {main})"
        raise HeadscopeError(f"clean {tuple(clean[main].shape)} and corrupted {shown} inputs must have the same shape")
    chosen_sites = selection(model, sites)
    layers = chosen_sites.layers
    if heads_per_pass is not None:
        check_count("heads_per_pass", heads_per_pass)
    given = head_pairs(heads, "patch") if heads is not None else None
    point = "hook_" + hook
    axis = HEAD_AXIS[hook]
    batch = clean[main].shape[0]
    source, rerun = (clean, corrupted) if direction == "denoising" else (corrupted, clean)
    names = [point_name(l, point) for l in layers] if given is None else sorted({point_name(l, point) for l, _ in given
                                                                                if l in layers})
    with cache_activations(model, names or [point_name(layers[0], point)], to=None, sites=sites) as saved:
        source_metric = _scores(metric, _output(model, source))
    # Heads along the point's head axis: query heads, or key/value heads for k and v.
    n_heads = saved[point_name(layers[0], point)].shape[axis] if hook in ("k", "v") else chosen_sites.n_heads
    chosen = given if given is not None else [(l, h) for l in layers for h in range(n_heads)]
    what = "key/value heads" if hook in ("k", "v") else "heads"
    for layer, head in chosen:
        if not (layer in layers and 0 <= head < n_heads):
            raise HeadscopeError(f"head {layer}.{head} is out of range (attention layers {layers}, {n_heads} {what} each)")
    rerun_metric = _scores(metric, _output(model, rerun))
    if float(source_metric.mean()) == float(rerun_metric.mean()):
        raise HeadscopeError("the metric is the same on clean and corrupted inputs; there is no gap to recover")
    per_pass = heads_per_pass or max(1, 64 // batch)
    patched = {}
    for start in range(0, len(chosen), per_pass):
        group = chosen[start:start + per_pass]
        repeated = {k: v.repeat(len(group), *([1] * (v.dim() - 1))) for k, v in rerun.items()}

        def patcher(value, hook_point, group=group):
            value = value.clone()
            layer = int(hook_point.name.split(".")[1])
            source_value = saved[hook_point.name]
            for copy, (l, h) in enumerate(group):
                if l == layer:  # copy `copy` of the batch gets head h's activation from the source run
                    where = (slice(copy * batch, (copy + 1) * batch),) + _heads_of(value, axis, h)
                    value[where] = source_value[(slice(None),) + _heads_of(value, axis, h)]
            return value

        hooked = sorted({point_name(l, point) for l, _ in group})
        with model_hooks(model, [(name, patcher) for name in hooked], sites=sites):
            logits = _output(model, repeated)
        for copy, pair in enumerate(group):
            patched[pair] = _scores(metric, logits[copy * batch:(copy + 1) * batch])
    return source_metric, rerun_metric, patched


def plot_patching(table, title: Optional[str] = None):
    """A heatmap of `patch`'s effects: layers down, heads across, 0 white.

    Args:
        table: what `headscope.patch` returns (layer, head, effect).
        title: the figure's title (default: the fraction recovered, or lost when noising, and the hook).
    Returns:
        A plotly `go.Figure`.
    """
    import plotly.graph_objects as go

    if not all(hasattr(table, "columns") and column in table.columns for column in ("layer", "head", "effect")):
        raise HeadscopeError(f"plot_patching takes the table headscope.patch returns (layer, head, effect), "
                             f"got {type(table).__name__}")
    grid = table.pivot(index="layer", columns="head", values="effect")
    fig = go.Figure(go.Heatmap(z=grid.values, x=[str(h) for h in grid.columns], y=[str(l) for l in grid.index],
                               colorscale="RdBu", zmid=0, colorbar=dict(title="effect"),
                               hovertemplate="layer %{y} head %{x}: %{z:.3f}<extra></extra>"))
    hook = table.attrs.get("hook", "z")
    what = "Lost" if table.attrs.get("direction") == "noising" else "Recovered"
    fig.update_layout(title=title or f"{what} fraction of the clean-corrupted gap, patching hook_{hook}",
                      xaxis_title="head", yaxis_title="layer", yaxis_autorange="reversed")
    return fig

"""Which heads a task's behaviour needs: attribution patching (AtP, AtP*) and exact patching.

`attribute(loaded, task, method, point="z", direction="denoising")` estimates, for every head, the
effect of patching its activation at `point` from one run into the other, in `headscope.patch`'s
units and conventions: the fraction of the clean-corrupted gap of the task's metric M that the
patch recovers ("denoising": the corrupted prompts rerun with the head's clean activation) or
loses ("noising": the clean prompts rerun with its corrupted activation),

    effect(n) = sum_b (M_b(rerun with n patched) - M_b(rerun)) / sum_b (M_b(source) - M_b(rerun)).

- "exact": `headscope.patch` itself (one forward pass of every prompt per head).
- "atp" (attribution patching, Nanda 2023; Syed et al. 2023): the numerator to first order,
  sum_b (a_n^source - a_n^rerun) . dM_b/da_n, the gradient taken on the rerun, for every head at
  once from two forward passes and one backward pass.
- "atp*" (Kramar et al. 2024, "AtP*", arXiv 2403.00745) fixes AtP's two known failures:
  * the QK fix (points q and k): a patched query or key moves the pattern through a softmax whose
    gradient vanishes where attention saturates; the pattern is recomputed exactly with the head's
    source q (or k) and the rerun's k (or q), and only what follows the pattern is linearised:
    sum_b (A_n^patched - A^rerun) . dM_b/dA (`headscope.attention.kernel.pattern_of`, with the
    settings of the layer's own call);
  * GradDrop (every point): a head's direct and indirect effects may cancel in the gradient. For
    each residual layer l, the backward pass is repeated with the gradient through layer l's update
    dropped (only its skip connection carries it), giving AtP_l(n); the estimate of |effect| is
    (1 / (L - 1)) sum_l |AtP_l(n)| (L residual layers; the term of n's own layer is 0), reported
    as `magnitude`, by which AtP* ranks heads. `effect` stays the signed AtP (with the QK fix). A
    model of one layer has nothing to cancel: its magnitude is |effect|.

Points: z (a head's output before W_O), q, k, v, pattern; k and v per key/value head under
grouped-query attention (as `hook_k` holds them). Gradients accumulate over batches of prompts;
per-example numerators give the 95% bootstrap intervals of the ratio (`lo`, `hi`).

The kl metric (`-KL(p_clean || p)`) has a gradient of exactly 0 at the clean run, which noising
AtP and AtP* take their gradient on: that combination is refused in one line.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Any, Optional

import torch

from ..causal.patching import DIRECTIONS, patched_runs
from ..detectors.stats import bootstrap_ratio_ci
from ..errors import HeadscopeError, UsageError
from ..attention.kernel import pattern_of
from ..hf.route import Session, layer_map, routed
from .residual import layer_list
from .target import Target, batches, output_logits

__all__ = ["attribute", "METHODS", "POINTS", "DIRECTIONS", "COLUMNS"]

METHODS = ("atp", "atp*", "exact")
POINTS = ("z", "q", "k", "v", "pattern")
COLUMNS = ["layer", "head", "site", "effect", "lo", "hi", "magnitude"]


def attribute(loaded: Any, task: Any, method: str = "atp", point: str = "z", direction: str = "denoising",
              sites: Optional[str] = None, batch_size: int = 16, heads_per_pass: Optional[int] = None,
              n_resamples: int = 1000, seed: int = 0, progress: Optional[Any] = None):
    """Each head's effect on the task's metric when its activation at `point` is patched (module docstring).

    Args:
        loaded: a `headscope.Loaded` (or a transformers model headscope runs inside).
        task: a `headscope.Task` (its metric: logit difference, probability or KL).
        method: "atp", "atp*" or "exact".
        point: "z", "q", "k", "v" or "pattern".
        direction: "denoising" (clean into corrupted) or "noising" (corrupted into clean).
        sites: the group of attention sites whose heads are attributed; default: the analysed stack.
        batch_size: prompts per forward pass (atp, atp*); exact patching runs every prompt at once,
            `heads_per_pass` heads per pass, as `headscope.patch` does.
        heads_per_pass: exact only: heads patched per forward pass.
        n_resamples: bootstrap resamples of the examples for `lo` and `hi`.
        seed: the bootstrap's seed.
        progress: an optional callable `progress(done, total)` called after each batch.
    Returns:
        pandas DataFrame (layer, head, site, effect, lo, hi, magnitude): one row per query head
        (per key/value head for k and v), the model's own layer numbers. `magnitude` is |effect|,
        or AtP*'s GradDrop estimate of it. `attrs`: method, point, direction, metric, n,
        clean_metric, corrupted_metric, passes ({"forward": ..., "backward": ...}, in passes over
        all the task's prompts).
    """
    if method not in METHODS:
        raise UsageError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if point not in POINTS:
        raise UsageError(f"cannot attribute at {point!r}; choose one of {', '.join(POINTS)}")
    if direction not in DIRECTIONS:
        raise UsageError(f"unknown direction {direction!r}; choose one of {', '.join(DIRECTIONS)}")
    target = Target(loaded, task, sites, "attribute")
    if task.metric == "kl" and direction == "noising" and method != "exact":
        raise UsageError(f"{method} with direction='noising' takes its gradient on the clean run, where the kl "
                         f"metric's gradient is exactly 0, so every effect would be 0: use direction='denoising', "
                         f"method='exact' or another metric")
    if method == "exact":
        numerators, gaps, drops, passes, metrics = _exact(target, task, point, direction, heads_per_pass)
    else:
        numerators, gaps, drops, passes, metrics = _gradients(target, task, method, point, direction, batch_size,
                                                              progress)
    return _table(target, task, numerators, gaps, drops, passes, metrics, method, point, direction, n_resamples,
                  seed)


def _table(target, task, numerators, gaps, drops, passes, metrics, method, point, direction, n_resamples, seed):
    """The result frame from per-example numerators `{(layer, head): [n]}` and gaps `[n]`."""
    import pandas as pd

    nodes = sorted(numerators)
    stacked = torch.stack([numerators[node] for node in nodes]).double()  # (nodes, n)
    gaps = gaps.double()
    if float(gaps.sum()) == 0:
        raise HeadscopeError("the metric is the same on clean and corrupted prompts; there is no gap to attribute")
    effect, low, high = bootstrap_ratio_ci(stacked, gaps, n_resamples=n_resamples, seed=seed)
    if drops is not None and next(iter(drops.values())).shape[0] > 1:  # GradDrop: (1/(L-1)) sum_l |sum_b AtP_l,b| / sum_b gap_b
        dropped = torch.stack([drops[node] for node in nodes]).double()  # (nodes, L, n)
        magnitude = dropped.sum(-1).abs().sum(-1) / (dropped.shape[1] - 1) / gaps.sum().abs()
    else:
        magnitude = effect.abs()
    sites = target.selection.sites
    rows = [dict(layer=layer, head=head, site=sites[layer].name, effect=float(e), lo=float(lo), hi=float(hi),
                 magnitude=float(m)) for (layer, head), e, lo, hi, m in zip(nodes, effect, low, high, magnitude)]
    table = pd.DataFrame(rows, columns=COLUMNS)
    source, rerun = metrics
    clean, corrupted = (source, rerun) if direction == "denoising" else (rerun, source)
    table.attrs.update(method=method, point=point, direction=direction, metric=task.metric, n=int(task.n),
                       clean_metric=clean, corrupted_metric=corrupted, passes=passes)
    return table


def _exact(target, task, point, direction, heads_per_pass):
    """`headscope.patch`'s runs on the task: per-example numerators patched - rerun."""
    clean, _ = target.inputs(task, "clean")
    corrupted, _ = target.inputs(task, "corrupted")
    reference = None
    if task.metric == "kl":
        with torch.no_grad():
            reference = target.aligned(output_logits(target.model(**clean))).float()

    def metric(logits):  # one batch-sized piece: the whole task, in order
        return task.score(target.aligned(logits).float(), reference=reference)

    source, rerun, patched = patched_runs(target.model, clean, corrupted, metric, point, None, heads_per_pass,
                                          direction, target.sites)
    numerators = {node: values - rerun for node, values in patched.items()}
    passes = {"forward": 2 + len(patched) + (reference is not None), "backward": 0}
    return numerators, source - rerun, None, passes, (float(source.mean()), float(rerun.mean()))


class _Recorder(Session):
    """Keeps, for every layer of the sites, the activations attribution reads (with their graph):
    q, k, v as the model hands them to attention, the pattern, z; and each call's settings."""

    def __init__(self, layer_of: dict, wanted: set, qk_fix: bool):
        self.layer_of = layer_of
        self.wanted, self.qk_fix = wanted, qk_fix
        self.values: dict = {}
        self.settings: dict = {}

    def edit_qkv(self, layer, q, k, v):
        for name, value in (("q", q), ("k", k), ("v", v)):
            if name in self.wanted:
                self.values[(layer, name)] = value
        return q, k, v

    def edits_attention(self, layer):
        return "pattern" in self.wanted

    def edit_pattern(self, layer, pattern):
        self.values[(layer, "pattern")] = pattern
        return pattern

    def edit_z(self, layer, z):
        if "z" in self.wanted:
            self.values[(layer, "z")] = z
        return z

    def note_call(self, layer, settings):
        if self.qk_fix:
            self.settings[layer] = settings


class _Gate(torch.autograd.Function):
    """Identity forward; the backward multiplies by `switch[index]` (GradDrop's dropped layer)."""

    @staticmethod
    def forward(ctx, x, switch, index):
        ctx.switch, ctx.index = switch, index
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.switch[ctx.index], None, None


@contextmanager
def _gated_layers(model, selection, switch: list):
    """Each residual layer's update `out - in` passed through `_Gate`, so a backward pass can drop
    the gradient through one layer's sublayers (its skip connection still carries it)."""
    modules = dict(model.named_modules())
    handles = []

    def gate(index):
        def hook(module, args, kwargs, output):
            given = args[0] if args else kwargs.get("hidden_states")
            out = output if isinstance(output, torch.Tensor) else output[0]
            gated = given + _Gate.apply(out - given, switch, index)
            return gated if isinstance(output, torch.Tensor) else (gated, *output[1:])
        return hook

    try:
        for index, (_, path) in enumerate(layer_list(model, selection)[1]):
            handles.append(modules[path].register_forward_hook(gate(index), with_kwargs=True))
        yield len(handles)
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def _grad_from_embeddings(model):
    """Make the embedding's output require grad, so activations are in a graph even when the
    model's weights are frozen."""
    def hook(module, args, output):
        return output if output.requires_grad else output.detach().requires_grad_()
    handle = model.get_input_embeddings().register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _gradients(target, task, method, point, direction, batch_size, progress):
    """AtP / AtP*: per-example numerators (and GradDrop's per-layer ones) accumulated over batches."""
    model, selection = target.model, target.selection
    qk_fix = method == "atp*" and point in ("q", "k")
    wanted = {point} | ({"q", "k", "pattern"} if qk_fix else set())
    layer_of = layer_map(model, target.sites)
    numerators, drops, gaps, sources, reruns = {}, {}, [], [], []
    parts = batches(task.n, batch_size)
    backward = 0
    for done, part in enumerate(parts):
        rows = task.subset(part)
        clean, _ = target.inputs(rows, "clean")
        corrupted, _ = target.inputs(rows, "corrupted")
        source_inputs, rerun_inputs = (clean, corrupted) if direction == "denoising" else (corrupted, clean)
        seen = _Recorder(layer_of, wanted, qk_fix)
        with torch.no_grad(), routed(model, seen):
            source_logits = target.aligned(output_logits(model(**source_inputs))).float()
        reference = None
        if task.metric == "kl":
            reference = source_logits if direction == "denoising" else None
        source_values = {key: value.detach() for key, value in seen.values.items()}
        rerun = _Recorder(layer_of, wanted, qk_fix)
        switch = []
        with ExitStack() as stack:
            stack.enter_context(torch.enable_grad())
            stack.enter_context(_grad_from_embeddings(model))
            if method == "atp*":
                n_layers = stack.enter_context(_gated_layers(model, selection, switch))
                switch.extend([1.0] * n_layers)
            stack.enter_context(routed(model, rerun))
            rerun_logits = target.aligned(output_logits(model(**rerun_inputs))).float()
        if task.metric == "kl" and reference is None:
            reference = rerun_logits.detach()  # noising reruns the clean prompts
        scores = rows.score(rerun_logits, reference=reference)  # (b,)
        with torch.no_grad():
            source_scores = rows.score(source_logits, reference=reference)
        sources.append(source_scores.detach().cpu())
        reruns.append(scores.detach().cpu())
        gaps.append((source_scores - scores).detach().cpu())
        keys = sorted(rerun.values)
        tensors = [rerun.values[key] for key in keys]
        grads = torch.autograd.grad(scores.sum(), tensors, retain_graph=method == "atp*", allow_unused=True)
        backward += 1
        first = _numerators(dict(zip(keys, grads)), rerun, source_values, point, qk_fix)
        for node, value in first.items():
            numerators.setdefault(node, []).append(value)
        if method == "atp*":
            per_layer = []
            for index in range(len(switch)):
                switch[:] = [1.0] * len(switch)
                switch[index] = 0.0
                grads = torch.autograd.grad(scores.sum(), tensors, retain_graph=index < len(switch) - 1,
                                            allow_unused=True)
                backward += 1
                per_layer.append(_numerators(dict(zip(keys, grads)), rerun, source_values, point, qk_fix))
            for node in first:
                drops.setdefault(node, []).append(torch.stack([layer[node] for layer in per_layer]))  # (L, b)
        if progress is not None:
            progress(done + 1, len(parts))
    numerators = {node: torch.cat(values) for node, values in numerators.items()}
    drops = {node: torch.cat(values, dim=-1) for node, values in drops.items()} if method == "atp*" else None
    passes = {"forward": 2, "backward": backward / len(parts)}
    return numerators, torch.cat(gaps), drops, passes, (float(torch.cat(sources).mean()),
                                                        float(torch.cat(reruns).mean()))


def _numerators(grads: dict, rerun: _Recorder, source: dict, point: str, qk_fix: bool) -> dict:
    """`{(layer, head): [b]}`: each head's first-order numerator on this batch (module docstring)."""
    found = {}
    for layer in sorted({layer for layer, name in rerun.values if name == point}):
        if qk_fix:
            found.update(_qk_fixed(layer, grads, rerun, source, point))
            continue
        value, grad = rerun.values[(layer, point)], grads[(layer, point)]
        delta = source[(layer, point)].to(value.dtype) - value.detach()
        if grad is None:
            grad = torch.zeros_like(value)
        axis = 2 if point == "z" else 1  # z [B, T, H, D]; q, k, v [B, H, T, D]; pattern [B, H, Tq, Tk]
        product = (delta.float() * grad.float()).movedim(axis, 1)  # (B, H, ...)
        per_head = product.reshape(product.shape[0], product.shape[1], -1).sum(-1)  # (B, H)
        for head in range(per_head.shape[1]):
            found[(layer, head)] = per_head[:, head].detach().cpu()
    return found


def _qk_fixed(layer: int, grads: dict, rerun: _Recorder, source: dict, point: str) -> dict:
    """The QK fix: each head's pattern recomputed exactly with its source q (or its key/value head's
    source k), the rest of the model linearised from the pattern on."""
    q, k = rerun.values[(layer, "q")].detach(), rerun.values[(layer, "k")].detach()
    pattern = rerun.values[(layer, "pattern")].detach()
    grad = grads[(layer, "pattern")]
    grad = torch.zeros_like(pattern) if grad is None else grad.float()
    settings = dict(rerun.settings[layer])
    mask, sinks = settings.pop("mask"), settings.pop("sinks")
    n_heads, n_kv = q.shape[1], k.shape[1]
    group = n_heads // n_kv
    found = {}
    units = range(n_heads) if point == "q" else range(n_kv)
    for unit in units:
        heads = slice(unit, unit + 1) if point == "q" else slice(unit * group, (unit + 1) * group)
        kv = slice(unit // group, unit // group + 1) if point == "q" else slice(unit, unit + 1)
        new_q = source[(layer, "q")][:, heads].to(q.dtype) if point == "q" else q[:, heads]
        new_k = k[:, kv] if point == "q" else source[(layer, "k")][:, kv].to(k.dtype)
        head_mask = mask[:, heads] if mask is not None and mask.dim() == 4 and mask.shape[1] > 1 else mask
        patched = pattern_of(new_q, new_k, mask=head_mask, sinks=sinks[heads] if sinks is not None else None,
                             **settings)
        change = (patched - pattern[:, heads]) * grad[:, heads]  # (B, heads, Tq, Tk)
        found[(layer, unit)] = change.reshape(change.shape[0], -1).sum(-1).detach().cpu()
    return found

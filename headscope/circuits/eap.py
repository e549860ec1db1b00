"""Edge attribution patching (EAP, EAP-IG) and faithfulness measured by running the model.

An edge u -> r is the part of receiver r's input that sender u wrote (`headscope.circuits.edges`).
Its score estimates the change of the task's metric M (summed over prompts, then divided by their
number) when that one edge carries the corrupted run's value instead of the clean one:

    score(u -> r) = (1 / n) sum_b (a_u^corrupted - a_u^clean) . g_r

with a_u the sender's output at every position and g_r the gradient of M with respect to r's
own copy of the residual stream (`headscope.circuits.split`):
- "eap" (Syed et al. 2023, arXiv 2310.10348): g_r on the clean run. Two forward passes (clean and
  corrupted activations) and one forward/backward pair.
- "eap-ig" (Hanna et al. 2024, arXiv 2403.17806): integrated gradients along the straight path
  from the corrupted to the clean input embeddings, g_r = (1 / S) sum_{k=1..S} dM/dr at the
  embeddings e_corrupted + (k / S)(e_clean - e_corrupted) (a right Riemann sum with S = `steps`
  points; S = 1 is EAP). Two forward passes and S forward/backward pairs.

`evaluate(circuit, loaded, sizes)` *runs* the model with only a circuit's edges clean: every other
edge u -> r carries the corrupted run's value, so r reads
`s_r - sum_{u not kept} (a_u - a_u^corrupted)` (counterfactual ablation, MIB's recommendation;
Mueller et al. 2025, arXiv 2504.13151; the runs are `headscope.circuits.patched`'s). The circuit
of a size is the top `size`% of edges by |score|; faithfulness is
`f = (m(C) - m(empty)) / (m(model) - m(empty))` with m the mean metric, m(model) the clean run's
(every edge kept: the model itself) and m(empty) the corrupted run's (no edge kept: every
receiver reads the corrupted stream, which is the corrupted run). Over the sizes x (fractions
of all edges), CPR = the area under f and CMD = the area under |1 - f|, by the trapezoid rule
from the smallest size to 100% (MIB). Random circuits of the same sizes (uniform draws of edges)
give the baseline.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..errors import HeadscopeError, UsageError
from .edges import Graph, graph_of
from .patched import Patched, plain_senders
from .running import Target, batches, output_logits
from .split import split_run

__all__ = ["score_edges", "evaluate", "METHODS", "check_sizes", "area"]

METHODS = ("eap", "eap-ig")


def _embedding_of(model, inputs: dict) -> torch.Tensor:
    """What the input embedding module outputs for `inputs` (before anything else sees it)."""
    seen = {}
    handle = model.get_input_embeddings().register_forward_hook(lambda m, a, out: seen.setdefault("e", out.detach()))
    try:
        ids = inputs["decoder_input_ids"] if "decoder_input_ids" in inputs else inputs["input_ids"]
        model.get_input_embeddings()(ids)
    finally:
        handle.remove()
    return seen["e"]


def score_edges(target: Target, graph: Graph, task, method: str = "eap-ig", steps: int = 5, batch_size: int = 8,
                progress=None) -> tuple[np.ndarray, dict]:
    """`(scores, passes, metrics)`: every edge's score (module docstring) in `graph.edges()` order,
    the passes spent (over all prompts) and the clean and corrupted runs' mean metrics."""
    if method not in METHODS:
        raise UsageError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if method == "eap":
        steps = 1
    elif isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise UsageError(f"steps must be an integer of at least 1, got {steps!r}")
    model = target.model
    totals = {id(r): torch.zeros(len(r.names), len(r.upstream), dtype=torch.float64) for r in graph.receivers}
    metrics = {"clean": 0.0, "corrupted": 0.0}
    parts = batches(task.n, batch_size)
    for done, part in enumerate(parts):
        rows = task.subset(part)
        clean, _ = target.inputs(rows, "clean")
        corrupted, _ = target.inputs(rows, "corrupted")
        clean_senders, clean_logits = plain_senders(target, graph, clean)
        corrupted_senders, corrupted_logits = plain_senders(target, graph, corrupted)
        change = corrupted_senders - clean_senders  # (S, B, T, D)
        del corrupted_senders
        reference = target.aligned(clean_logits).float() if task.metric == "kl" else None
        for name, logits in (("clean", clean_logits), ("corrupted", corrupted_logits)):
            metrics[name] += float(rows.score(target.aligned(logits).float(), reference=reference).double().sum())
        e_clean, e_corrupted = _embedding_of(model, clean), _embedding_of(model, corrupted)
        grads = {id(r): 0.0 for r in graph.receivers}
        for k in range(1, steps + 1):
            alpha = k / steps
            leaves = {}

            def delta_for(receiver):
                shape = (len(receiver.names), *clean_senders.shape[1:])
                leaves[id(receiver)] = torch.zeros(shape, dtype=clean_senders.dtype, device=clean_senders.device,
                                                   requires_grad=True)
                return leaves[id(receiver)]

            mixed = None if alpha == 1.0 else (lambda e: e_corrupted + alpha * (e_clean - e_corrupted))
            with torch.enable_grad(), split_run(target, graph, delta_for, embed=mixed):
                logits = output_logits(model(**clean, use_cache=False))
                metric = rows.score(target.aligned(logits).float(), reference=reference).sum()
                found = torch.autograd.grad(metric, [leaves[id(r)] for r in graph.receivers], allow_unused=True)
            for receiver, grad in zip(graph.receivers, found):
                if grad is not None:
                    grads[id(receiver)] = grads[id(receiver)] + grad.detach()
        for receiver in graph.receivers:
            grad = grads[id(receiver)]
            if isinstance(grad, float):
                continue
            upstream = change[receiver.upstream].double()  # (U, B, T, D)
            totals[id(receiver)] += torch.einsum("ubtd,rbtd->ru", upstream, grad.double() / steps)
        if progress is not None:
            progress(f"circuit ({method})", done + 1, len(parts))
    scores = np.concatenate([(totals[id(r)] / task.n).numpy().reshape(-1) for r in graph.receivers])
    means = {name: value / task.n for name, value in metrics.items()}
    return scores, {"forward": 2 + steps, "backward": steps}, means


def check_sizes(sizes) -> list:
    """Sizes in percent of all edges, each a number in (0, 100]; HeadscopeError in one line otherwise."""
    try:
        values = [float(s) for s in sizes]
    except (TypeError, ValueError):
        raise UsageError(f"sizes are percentages of the edges, numbers in (0, 100], got {sizes!r}") from None
    bad = [s for s in values if not (0 < s <= 100) or math.isnan(s)]
    if not values or bad:
        raise UsageError(f"circuit sizes are percentages of the edges in (0, 100], got {bad[0] if bad else 'none'}")
    return sorted(set(values))


def area(sizes, values) -> float:
    """The trapezoid-rule area under `values` over `sizes` given in percent (x as fractions)."""
    x = np.asarray(sizes, dtype=float) / 100
    y = np.asarray(values, dtype=float)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2)) if len(x) > 1 else 0.0


def evaluate(circuit, loaded: Any, sizes, n_random: int = 5, seed: int = 0, batch_size: int = 16, progress=None):
    """Faithfulness of `circuit` at each size and of random circuits of the same sizes (module docstring).

    Returns:
        `(evaluation, random)` DataFrames (see `Circuit.evaluate`).
    """
    import pandas as pd

    sizes = check_sizes(sizes)
    if isinstance(n_random, bool) or not isinstance(n_random, int) or n_random < 0:
        raise UsageError(f"n_random must be an integer of at least 0, got {n_random!r}")
    task = circuit.task
    target = Target(loaded, task, circuit.meta.get("sites"), "evaluate")
    graph = graph_of(target, task)
    names = [f"{graph.senders[u][0]}->{name}" for u, _, name in graph.edges()]
    given = [f"{s}->{d}" for s, d in zip(circuit.edges.src, circuit.edges.dst)]
    if names != given:
        raise HeadscopeError("this circuit's edges are not this model's: evaluate it on the model it was found in")
    scores = circuit.edges.score.to_numpy()
    n_edges = len(scores)
    everything = np.ones(n_edges, dtype=bool)
    patched = Patched(target, graph, task, batch_size)
    clean, empty = patched.metric(everything), patched.metric(~everything)
    if clean == empty:
        raise HeadscopeError("the metric is the same with every edge clean and every edge corrupted; faithfulness "
                             "is undefined")
    order = np.argsort(-np.abs(scores), kind="stable")
    rng = np.random.default_rng(seed)
    rows, random_rows = [], []
    total = len(sizes) * (1 + n_random)
    for i, size in enumerate(sizes):
        count = max(1, int(round(n_edges * size / 100)))
        kept = np.zeros(n_edges, dtype=bool)
        kept[order[:count]] = True
        value = patched.metric(kept)
        rows.append(dict(size=size, n_edges=count, faithfulness=(value - empty) / (clean - empty), metric=value))
        for draw in range(n_random):
            chosen = np.zeros(n_edges, dtype=bool)
            chosen[rng.choice(n_edges, size=count, replace=False)] = True
            value = patched.metric(chosen)
            random_rows.append(dict(draw=draw, size=size, n_edges=count, faithfulness=(value - empty) / (clean - empty),
                                    metric=value))
        if progress is not None:
            progress("evaluate", (i + 1) * (1 + n_random), total)
    evaluation = pd.DataFrame(rows, columns=["size", "n_edges", "faithfulness", "metric"])
    random = pd.DataFrame(random_rows, columns=["draw", "size", "n_edges", "faithfulness", "metric"])
    if len(random):
        grouped = random.groupby("size").faithfulness
        evaluation["random_mean"] = grouped.mean().reindex(evaluation["size"]).to_numpy()
        evaluation["random_lo"] = grouped.min().reindex(evaluation["size"]).to_numpy()
        evaluation["random_hi"] = grouped.max().reindex(evaluation["size"]).to_numpy()
    f = evaluation.faithfulness.to_numpy()
    evaluation.attrs.update(cpr=area(sizes, f), cmd=area(sizes, np.abs(1 - f)), clean_metric=clean,
                            corrupted_metric=empty, n_random=n_random)
    if len(random):
        mean = evaluation.random_mean.to_numpy()
        evaluation.attrs.update(random_cpr=area(sizes, mean),
                                random_cmd=float(np.mean([area(sizes, np.abs(1 - random[random.draw == d]
                                                                              .faithfulness.to_numpy()))
                                                          for d in range(n_random)])))
    return evaluation, random

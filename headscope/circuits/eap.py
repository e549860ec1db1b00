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
  from the corrupted to the clean input embeddings, g_r = (1 / S) sum_k dM/dr at the embeddings
  e_corrupted + (k / S)(e_clean - e_corrupted), S = `steps`. `riemann="left"` (the default)
  takes k = 0..S-1, starting at the corrupted run, as the EAP-IG code does (`get_scores_eap_ig`
  of Hanna et al.'s repository; MIB's "EAP-IG-inputs"); `riemann="right"` takes k = 1..S,
  ending at the clean run (so S = 1 is EAP). Two forward passes and S forward/backward pairs.
The scores are means over prompts of per-prompt scores, which `score_edges` keeps as well
(`Circuit.stability` resamples them).

The KL metric (`-KL(p_clean || p)`) has a gradient of exactly 0 at the clean run, so EAP, and
EAP-IG with S = 1 on the right rule, would score every edge 0: they are refused in one line.

`evaluate(circuit, loaded, sizes)` *runs* the model with only a circuit's edges clean: every other
edge u -> r carries the corrupted run's value, so r reads
`s_r - sum_{u not kept} (a_u - a_u^corrupted)` (counterfactual ablation, MIB's recommendation;
Mueller et al. 2025, arXiv 2504.13151; the runs are `headscope.circuits.patched`'s).
Faithfulness is `f(C) = (m(C) - m(empty)) / (m(model) - m(empty))` with m the mean metric,
m(model) the clean run's (every edge kept: the model itself) and m(empty) the corrupted run's
(no edge kept: every receiver reads the corrupted stream, which is the corrupted run). As MIB
defines them (its circuit track's `area_under_curve`, with `absolute` off for CPR and on for CMD):
- CPR (higher is better) = the area under f of the circuits made of the top `size`% of edges by
  *signed* score in the direction that moves the metric from the corrupted run toward the clean
  one (`toward_clean`: -score when m(model) > m(empty), +score otherwise): the edges that push
  the metric the task's way;
- CMD (0 is best) = the area under |1 - f| of the circuits made of the top `size`% of edges by
  |score|;
both by the trapezoid rule over the sizes x (fractions of all edges) from the smallest to 100%
(`check_sizes`: 100 is added when absent; at least two sizes). Random circuits of the same sizes
(uniform draws of edges) give the baseline; their CPR and CMD use the same curves.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..checks import check_count
from ..errors import HeadscopeError, UsageError
from .edges import Graph, graph_of
from .patched import Patched, plain_senders
from .running import Target, batches, output_logits
from .split import split_run

__all__ = ["score_edges", "evaluate", "METHODS", "CIRCUIT_METHODS", "RIEMANN", "check_sizes", "area", "toward_clean",
           "integration_points"]

METHODS = ("eap", "eap-ig")
CIRCUIT_METHODS = METHODS  # the name the package exports (attribution has METHODS of its own)


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
                progress=None, riemann: str = "left") -> tuple[np.ndarray, dict, dict, np.ndarray]:
    """`(scores, passes, metrics, per_prompt)`: every edge's score (module docstring) in
    `graph.edges()` order, the passes spent (over all prompts), the clean and corrupted runs' mean
    metrics, and the per-prompt scores `[n, edges]` (float32) whose mean is `scores`."""
    if method not in METHODS:
        raise UsageError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    steps, points = integration_points(method, steps, riemann)
    if task.metric == "kl" and points == [1.0]:
        what = "EAP" if method == "eap" else "EAP-IG with one step on the right rule"
        raise UsageError(f"{what} takes the gradient at the clean run only, where the kl metric's gradient is exactly "
                         f"0, so every score would be 0: use method='eap-ig' (its left rule starts at the corrupted "
                         f"run) or another metric")
    model = target.model
    per_prompt = {id(r): torch.zeros(task.n, len(r.names), len(r.upstream), dtype=torch.float64)
                  for r in graph.receivers}
    metrics = {"clean": 0.0, "corrupted": 0.0}
    parts = batches(task.n, batch_size)
    stage = f"circuit ({method}: {len(points)} gradient{'s' if len(points) > 1 else ''} x {len(parts)} batches)"
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
        for point, alpha in enumerate(points):
            leaves = {}

            def delta_for(receiver):
                shape = (len(receiver.names), *clean_senders.shape[1:])
                leaves[id(receiver)] = torch.zeros(shape, dtype=clean_senders.dtype, device=clean_senders.device,
                                                   requires_grad=True)
                return leaves[id(receiver)]

            mixed = None if alpha == 1.0 else (lambda e, a=alpha: e_corrupted + a * (e_clean - e_corrupted))
            with torch.enable_grad(), split_run(target, graph, delta_for, embed=mixed):
                logits = output_logits(model(**clean, use_cache=False))
                metric = rows.score(target.aligned(logits).float(), reference=reference).sum()
                found = torch.autograd.grad(metric, [leaves[id(r)] for r in graph.receivers], allow_unused=True)
            for receiver, grad in zip(graph.receivers, found):
                if grad is not None:
                    grads[id(receiver)] = grads[id(receiver)] + grad.detach()
            if progress is not None:  # one forward/backward pair: steps x batches of them in all
                progress(stage, done * len(points) + point + 1, len(parts) * len(points))
        for receiver in graph.receivers:
            grad = grads[id(receiver)]
            if isinstance(grad, float):
                continue
            upstream = change[receiver.upstream].double()  # (U, B, T, D)
            per_prompt[id(receiver)][part] += torch.einsum("ubtd,rbtd->bru", upstream,
                                                            grad.double() / steps).cpu()
    prompts = torch.cat([per_prompt[id(r)].reshape(task.n, -1) for r in graph.receivers], dim=1)  # (n, edges)
    scores = prompts.mean(0).numpy()
    means = {name: value / task.n for name, value in metrics.items()}
    return scores, {"forward": 2 + steps, "backward": steps}, means, prompts.float().numpy()


RIEMANN = ("left", "right")


def integration_points(method: str, steps, riemann: str = "left") -> tuple[int, list]:
    """`(S, [alpha_k])`: the interpolation coefficients at which EAP-IG takes its gradients
    (module docstring); EAP is the single point 1 (the clean run)."""
    if riemann not in RIEMANN:
        raise UsageError(f"unknown Riemann rule {riemann!r}; choose one of {', '.join(RIEMANN)}")
    if method == "eap":
        return 1, [1.0]
    check_count("steps", steps)
    first = 0 if riemann == "left" else 1
    return steps, [k / steps for k in range(first, first + steps)]


def check_sizes(sizes) -> list:
    """Sizes in percent of all edges, each a number in (0, 100], sorted, with 100 added when
    absent (the areas run to 100%), at least two; UsageError in one line otherwise."""
    try:
        values = [float(s) for s in sizes]
    except (TypeError, ValueError):
        raise UsageError(f"sizes are percentages of the edges, numbers in (0, 100], got {sizes!r}") from None
    bad = [s for s in values if not (0 < s <= 100) or math.isnan(s)]
    if not values or bad:
        raise UsageError(f"circuit sizes are percentages of the edges in (0, 100], got {bad[0] if bad else 'none'}")
    full = sorted(set(values) | {100.0})
    if len(full) < 2:
        raise UsageError("CPR and CMD are areas over circuit sizes up to 100%: give at least one size below 100")
    return full


def area(sizes, values) -> float:
    """The trapezoid-rule area under `values` over `sizes` given in percent (x as fractions);
    at least two sizes."""
    x = np.asarray(sizes, dtype=float) / 100
    y = np.asarray(values, dtype=float)
    if len(x) < 2 or len(x) != len(y):
        raise UsageError(f"an area needs at least two sizes and one value per size, got {len(x)} and {len(y)}")
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


def toward_clean(scores: np.ndarray, clean: float, corrupted: float) -> np.ndarray:
    """Each edge's signed push from the corrupted run's metric toward the clean run's: an edge
    whose corruption moves the metric away from the clean value (score of the opposite sign to
    clean - corrupted) is positive. CPR's circuits are its top edges (module docstring)."""
    return -np.asarray(scores, dtype=float) * (1.0 if clean >= corrupted else -1.0)


def _ranked(values: np.ndarray) -> np.ndarray:
    """Edge indices by `values`, largest first, ties in edge order."""
    return np.argsort(-values, kind="stable")


def _aligned_scores(edges, names: list) -> np.ndarray:
    """The circuit's scores in the model graph's edge order (`names`, "src->dst"); HeadscopeError
    naming the first edge that is missing, extra or listed twice."""
    given = [f"{s}->{d}" for s, d in zip(edges.src, edges.dst)]
    if not given:
        raise HeadscopeError("this circuit has no edges; the model's graph has "
                             f"{len(names)}: evaluate a circuit found on this model")
    position: dict = {}
    for i, name in enumerate(given):
        if name in position:
            raise HeadscopeError(f"this circuit lists the edge {name} twice (rows {position[name]} and {i})")
        position[name] = i
    missing = next((n for n in names if n not in position), None)
    if missing is not None:
        raise HeadscopeError(f"this circuit's edges are not this model's: it lacks {missing} of the model's graph "
                             f"({len(given)} edges against {len(names)}); evaluate it on the model it was found in")
    known = set(names)
    extra = next((n for n in given if n not in known), None)
    if extra is not None:
        raise HeadscopeError(f"this circuit's edges are not this model's: {extra} is not in the model's graph; "
                             f"evaluate it on the model it was found in")
    return edges.score.to_numpy(dtype=float)[[position[n] for n in names]]  # rows in any order


def evaluate(circuit, loaded: Any, sizes, n_random: int = 5, seed: int = 0, batch_size: int = 16, progress=None):
    """Faithfulness of `circuit` at each size and of random circuits of the same sizes (module docstring).

    Returns:
        `(evaluation, random)` DataFrames (see `Circuit.evaluate`): `faithfulness` and `metric` of
        the circuits ranked by signed score (CPR's), `faithfulness_abs` and `metric_abs` of those
        ranked by |score| (CMD's).
    """
    import pandas as pd

    sizes = check_sizes(sizes)
    check_count("n_random", n_random, least=0)
    task = circuit.task
    target = Target(loaded, task, circuit.meta.get("sites"), "evaluate")
    graph = graph_of(target, task)
    names = [f"{graph.senders[u][0]}->{name}" for u, _, name in graph.edges()]
    scores = _aligned_scores(circuit.edges, names)
    if not np.isfinite(scores).all():
        raise HeadscopeError("this circuit has scores that are NaN or infinite; they cannot be ranked")
    n_edges = len(scores)
    everything = np.ones(n_edges, dtype=bool)
    patched = Patched(target, graph, task, batch_size)
    clean, empty = patched.metric(everything), patched.metric(~everything)
    if clean == empty:
        raise HeadscopeError("the metric is the same with every edge clean and every edge corrupted; faithfulness "
                             "is undefined")
    signed = _ranked(toward_clean(scores, clean, empty))
    absolute = _ranked(np.abs(scores))
    rng = np.random.default_rng(seed)
    measured: dict = {}

    def faithfulness(kept) -> tuple:
        key = np.packbits(kept).tobytes()
        if key not in measured:  # a size at which both rankings keep the same edges runs once
            measured[key] = patched.metric(kept)
        return (measured[key] - empty) / (clean - empty), measured[key]

    rows, random_rows = [], []
    total = len(sizes) * (2 + n_random)
    for i, size in enumerate(sizes):
        count = max(1, int(round(n_edges * size / 100)))
        row = dict(size=size, n_edges=count)
        for suffix, order in (("", signed), ("_abs", absolute)):
            kept = np.zeros(n_edges, dtype=bool)
            kept[order[:count]] = True
            row[f"faithfulness{suffix}"], row[f"metric{suffix}"] = faithfulness(kept)
        rows.append(row)
        for draw in range(n_random):
            chosen = np.zeros(n_edges, dtype=bool)
            chosen[rng.choice(n_edges, size=count, replace=False)] = True
            f, value = faithfulness(chosen)
            random_rows.append(dict(draw=draw, size=size, n_edges=count, faithfulness=f, metric=value))
        if progress is not None:
            progress("evaluate", (i + 1) * (2 + n_random), total)
    evaluation = pd.DataFrame(rows, columns=["size", "n_edges", "faithfulness", "metric", "faithfulness_abs",
                                             "metric_abs"])
    random = pd.DataFrame(random_rows, columns=["draw", "size", "n_edges", "faithfulness", "metric"])
    if len(random):
        grouped = random.groupby("size").faithfulness
        evaluation["random_mean"] = grouped.mean().reindex(evaluation["size"]).to_numpy()
        evaluation["random_lo"] = grouped.min().reindex(evaluation["size"]).to_numpy()
        evaluation["random_hi"] = grouped.max().reindex(evaluation["size"]).to_numpy()
    evaluation.attrs.update(cpr=area(sizes, evaluation.faithfulness),
                            cmd=area(sizes, np.abs(1 - evaluation.faithfulness_abs)),
                            cpr_ranking="signed score toward the clean run", cmd_ranking="|score|",
                            clean_metric=clean, corrupted_metric=empty, n_random=n_random)
    if len(random):
        draws = [random[random.draw == d].faithfulness.to_numpy() for d in range(n_random)]
        evaluation.attrs.update(random_cpr=float(np.mean([area(sizes, f) for f in draws])),
                                random_cmd=float(np.mean([area(sizes, np.abs(1 - f)) for f in draws])))
    return evaluation, random

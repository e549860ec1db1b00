"""Faithfulness of a circuit, measured by running the model with only its edges clean.

`evaluate(circuit, loaded, sizes)` *runs* the model with only a circuit's edges clean: every other
edge u -> r carries the corrupted run's value, so r reads
`s_r - sum_{u not kept} (a_u - a_u^corrupted)` (counterfactual ablation, MIB's recommendation;
Mueller et al. 2025, arXiv 2504.13151; the runs are `headscope.circuits.edge_patching`'s).
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

`MIB_SIZES`: the sizes MIB's circuit track evaluates at, in percent of all edges.

Where `batch_size` holds several copies of the task's prompts, each pass runs that many circuits
side by side (`Patched.metrics`). Progress counts circuits; after the empty circuit's run the
whole evaluation is estimated from its time, a circuit a run
(`headscope.circuits.eap.check_estimate`): over an hour is warned about, over a day refused.
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from ..checks import check_count
from ..errors import HeadscopeError, UsageError
from .eap import check_estimate
from .edge_patching import Patched
from .edges import graph_of
from .target import Target

__all__ = ["evaluate", "check_sizes", "area", "toward_clean", "MIB_SIZES"]

MIB_SIZES = (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)  # percent of all edges (Mueller et al. 2025, MIB)


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


def _measure(patched: Patched, circuits, together: int, progress, total: int) -> list:
    """Each of `circuits`' (an iterable of edge masks) mean metric, `together` circuits per pass
    (`Patched.metrics`), holding no more masks than one pass's; a circuit listed again (a size at
    which both rankings keep the same edges) runs once. Progress counts the circuits measured,
    after the empty and full ones."""
    keys, values, pending = [], {}, {}  # pending: packed mask -> mask, for the next pass
    shown = [2]

    def run():
        if pending:
            values.update(zip(pending, patched.metrics(list(pending.values()))))
            pending.clear()
        if progress is not None and shown[0] != 2 + len(keys):
            shown[0] = 2 + len(keys)
            progress("evaluate", shown[0], total)

    for kept in circuits:
        key = np.packbits(kept).tobytes()
        keys.append(key)
        if key not in values and key not in pending:
            pending[key] = kept
            if len(pending) == together:
                run()
        elif not pending:  # measured already, and nothing waits before it
            run()
    run()
    return [values[key] for key in keys]


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
    total = 2 + len(sizes) * (2 + n_random)  # patched runs, at most (a size both rankings share runs once)
    clean = patched.metric(everything)
    started = time.monotonic()
    empty = patched.metric(~everything)  # the corrupted senders now cached: a run as the others will be
    check_estimate(time.monotonic() - started, total - 2, kind="patched runs", doing="this evaluation",
                   instead="use fewer sizes, random circuits or prompts")
    if progress is not None:
        progress("evaluate", 2, total)
    if clean == empty:
        raise HeadscopeError("the metric is the same with every edge clean and every edge corrupted; faithfulness "
                             "is undefined")
    signed = _ranked(toward_clean(scores, clean, empty))
    absolute = _ranked(np.abs(scores))
    rng = np.random.default_rng(seed)
    circuits = []  # (size, edges kept, column suffix or draw) in the order they are drawn

    def masks():
        for size in sizes:
            count = max(1, int(round(n_edges * size / 100)))
            for suffix, order in (("", signed), ("_abs", absolute)):
                kept = np.zeros(n_edges, dtype=bool)
                kept[order[:count]] = True
                circuits.append((size, count, suffix))
                yield kept
            for draw in range(n_random):
                chosen = np.zeros(n_edges, dtype=bool)
                chosen[rng.choice(n_edges, size=count, replace=False)] = True
                circuits.append((size, count, draw))
                yield chosen

    together = max(1, batch_size // task.n)  # circuits per pass: as many copies of the prompts as a batch holds
    measured = _measure(patched, masks(), together, progress, total)
    rows, random_rows = {}, []
    for (size, count, which), value in zip(circuits, measured):
        f = (value - empty) / (clean - empty)
        if isinstance(which, str):
            rows.setdefault(size, dict(size=size, n_edges=count)).update({f"faithfulness{which}": f,
                                                                            f"metric{which}": value})
        else:
            random_rows.append(dict(draw=which, size=size, n_edges=count, faithfulness=f, metric=value))
    rows = list(rows.values())
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

"""A circuit's files, read back with every field checked (`Circuit.load`), and the checks a
circuit in memory passes before it is ranked.

- `FILES`, `KINDS`: the files of a circuit folder and the kinds of node.
- `read_meta(path)`: meta.json, an object whose keys have their types (`META`).
- `read_nodes(path)`: nodes.csv: `embed` first, `logits` last, each node once, of a known kind,
  named as the graph names it (`a{L}.h{H}` for head H of layer L, `m{L}`, `c{L}`).
- `read_edges(path, nodes, n_edges)`: edges.csv: src, dst and score on every line, every score a
  finite number, every src a sender of nodes.csv and every dst one of their receivers, never a
  receiver that reads before its sender writes, each edge once, as many as meta.json says; the
  rows come back in the graph's order (the order `headscope.circuit` writes), whatever order the
  file holds them in.
- `read_evaluation(path, attrs)`, `read_random(path)`: the faithfulness tables, numbers finite.
- `check_scores(edges, what)`: an edges table in memory holds src, dst and a finite number as
  every score (what `Circuit.top` and `Circuit.evaluate` rank), naming the first edge that does not.
Each fault is one HeadscopeError naming the file, the line and the field.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ..errors import HeadscopeError
from ..tables import read_table
from .eap import METHODS
from .tasks import METRICS

__all__ = ["FILES", "KINDS", "META", "read_meta", "read_nodes", "read_edges", "read_evaluation", "read_random",
           "check_scores"]

FILES = {"edges": "edges.csv", "nodes": "nodes.csv", "meta": "meta.json", "task": "task.json",
         "evaluation": "evaluation.csv", "random": "random.csv"}
KINDS = ("embed", "head", "mlp", "mixer", "attn", "logits")
AGAIN = "write it again with headscope"
# meta.json: each key's check, and what it expects; the first four are always written.
META = {
    "model": (lambda v: isinstance(v, str), "a string"),
    "task": (lambda v: isinstance(v, str), "a string"),
    "method": (lambda v: v in METHODS, f"one of {', '.join(METHODS)}"),
    "n_edges": (lambda v: _whole(v) and v >= 1, "a whole number >= 1"),
    "steps": (lambda v: _whole(v) and v >= 1, "a whole number >= 1"),
    "n": (lambda v: _whole(v) and v >= 1, "a whole number >= 1"),
    "metric": (lambda v: v in METRICS, f"one of {', '.join(METRICS)}"),
    "clean_metric": (lambda v: _finite(v), "a finite number"),
    "corrupted_metric": (lambda v: _finite(v), "a finite number"),
    "passes": (lambda v: isinstance(v, dict), "an object"),
    "sites": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "evaluation": (lambda v: isinstance(v, dict), "an object"),
}
REQUIRED = ("model", "task", "method", "n_edges")
MODULE_NAME = re.compile(r"(?P<prefix>[mc])(?P<layer>\d+)(\.\d+)?\Z")
MODULE_PREFIX = {"mlp": "m", "mixer": "m", "attn": "c"}
EVALUATION = ("size", "n_edges", "faithfulness", "metric")
RANDOM = ("draw", "size", "n_edges", "faithfulness", "metric")


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _float(text: str) -> float:
    """The number a cell holds, NaN where it holds none."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def _damaged(path: Path, problem: str) -> HeadscopeError:
    return HeadscopeError(f"{path} is damaged: {problem}; {AGAIN}")


def _short(value) -> str:
    """`value` as Python writes it (a numpy number as the number), cut to 40 characters."""
    text = repr(value.item() if hasattr(value, "item") and not isinstance(value, str) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_meta(path: Path) -> dict:
    """meta.json as a dict, every key `META` lists of its type (the first four required)."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _damaged(path, f"it is not valid JSON ({type(err).__name__})") from None
    if not isinstance(meta, dict):
        raise _damaged(path, f"it holds a {type(meta).__name__}, not an object")
    missing = [key for key in REQUIRED if key not in meta]
    if missing:
        raise _damaged(path, f"it lacks {', '.join(missing)}")
    for key, (fits, expected) in META.items():
        if key in meta and not fits(meta[key]):
            raise _damaged(path, f"{key} is {_short(meta[key])}, expected {expected}")
    return meta


def _as_text(path: Path, columns) -> "object":
    """The table at `path`, every cell as text ("" for an empty one), with exactly `columns`."""
    table = read_table(path, dtype=str, keep_default_na=False)
    if list(table.columns) != list(columns):
        raise _damaged(path, f"its columns are {', '.join(map(str, table.columns)) or 'none'}, expected "
                             f"{', '.join(columns)}")
    return table


def _numbers(path: Path, table, column: str, whole: bool = False):
    """`table[column]` as floats; HeadscopeError naming the first line whose cell is not a finite
    number (or, with `whole`, not a whole number)."""
    import numpy as np

    values = np.array([_float(cell) for cell in table[column]], dtype=float)  # as written: exactly
    bad = ~np.isfinite(values)
    if whole:
        bad |= np.isfinite(values) & (values != np.round(values))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise _damaged(path, f"line {row + 2}: {column} is {table[column].iloc[row]!r}, expected a "
                             f"{'whole' if whole else 'finite'} number")
    return values


def read_nodes(path: Path):
    """nodes.csv as `headscope.circuit` writes it (module docstring): DataFrame name, kind, layer, head."""
    import pandas as pd

    table = _as_text(path, ("name", "kind", "layer", "head"))
    if table.empty:
        raise _damaged(path, "it holds no nodes")
    rows = []
    for i, row in enumerate(table.itertuples(index=False)):
        where = f"line {i + 2}"
        name, kind = row.name, row.kind
        if kind not in KINDS:
            raise _damaged(path, f"{where}: kind is {kind!r}, expected one of {', '.join(KINDS)}")
        layer = head = None
        if kind in ("embed", "logits"):
            if name != kind or row.layer or row.head:
                raise _damaged(path, f"{where}: the {kind} node is {name!r} with layer {row.layer!r} and head "
                                     f"{row.head!r}, expected {kind!r} with neither")
        else:
            if not row.layer.isdigit() or (kind == "head") != row.head.isdigit() or (kind != "head" and row.head):
                raise _damaged(path, f"{where}: node {name!r} ({kind}) has layer {row.layer!r} and head {row.head!r}, "
                                     f"expected whole numbers" + ("" if kind == "head" else " and no head"))
            layer, head = int(row.layer), (int(row.head) if kind == "head" else None)
            match = MODULE_NAME.match(name)
            named = (name == f"a{layer}.h{head}" if kind == "head" else
                     bool(match) and match["prefix"] == MODULE_PREFIX[kind] and int(match["layer"]) == layer)
            if not named:
                expected = f"a{layer}.h{head}" if kind == "head" else f"{MODULE_PREFIX[kind]}{layer}"
                raise _damaged(path, f"{where}: node {name!r} is a {kind} of layer {layer}, which the graph names "
                                     f"{expected!r}")
        rows.append((name, kind, layer, head))
    names = [name for name, *_ in rows]
    if names[0] != "embed" or names[-1] != "logits" or names.count("embed") + names.count("logits") != 2:
        raise _damaged(path, "the embed node must come first and the logits node last, each once")
    seen = set()
    for i, name in enumerate(names):
        if name in seen:
            raise _damaged(path, f"line {i + 2}: node {name!r} is listed twice")
        seen.add(name)
    nodes = pd.DataFrame(rows, columns=["name", "kind", "layer", "head"])
    nodes["layer"], nodes["head"] = nodes["layer"].astype("Int64"), nodes["head"].astype("Int64")
    return nodes


def _receivers(nodes) -> dict:
    """`{receiver name: (rank in the graph's order, index of the first sender it cannot read)}`:
    each head's q, k, v (a layer's heads read none of that layer's heads), each other writer's
    input, the logits; in the order the nodes write, as `headscope.circuits.edges` orders them."""
    names, kinds, layers = list(nodes["name"]), list(nodes["kind"]), list(nodes["layer"])
    receivers = {}
    for index in range(1, len(names) - 1):
        if kinds[index] == "head":
            first = index
            while first > 1 and kinds[first - 1] == "head" and layers[first - 1] == layers[index]:
                first -= 1
            for part in "qkv":
                receivers[f"{names[index]}.{part}"] = (len(receivers), first)
        else:
            receivers[names[index]] = (len(receivers), index)
    receivers["logits"] = (len(receivers), len(names) - 1)
    return receivers


def read_edges(path: Path, nodes, n_edges=None):
    """edges.csv checked against `nodes` (module docstring), in the graph's order: DataFrame src,
    dst, score; `n_edges`: how many meta.json says (None: not checked)."""
    import numpy as np
    import pandas as pd

    table = _as_text(path, ("src", "dst", "score"))
    if table.empty:
        raise _damaged(path, "it holds no edges")
    scores = _numbers(path, table, "score")
    senders = {name: i for i, name in enumerate(nodes["name"][:-1])}
    receivers = _receivers(nodes)
    order = np.empty((len(table), 2), dtype=np.int64)
    seen: dict = {}
    for i, (src, dst) in enumerate(zip(table.src, table.dst)):
        where = f"line {i + 2}"
        if src not in senders:
            raise _damaged(path, f"{where}: src {src!r} is not a sender of nodes.csv (the embed, a head, an MLP or "
                                 f"other writer)")
        if dst not in receivers:
            raise _damaged(path, f"{where}: dst {dst!r} is not a receiver of nodes.csv's graph (a head's .q, .k or "
                                 f".v, an MLP or other writer, the logits)")
        rank, before = receivers[dst]
        if senders[src] >= before:
            raise _damaged(path, f"{where}: the edge {src} -> {dst} runs backwards: {dst} reads the residual stream "
                                 f"before {src} writes to it")
        if (src, dst) in seen:
            raise _damaged(path, f"{where}: the edge {src} -> {dst} is listed twice (first on line {seen[src, dst]})")
        seen[src, dst] = i + 2
        order[i] = (rank, senders[src])
    if n_edges is not None and len(table) != n_edges:
        raise _damaged(path, f"it holds {len(table)} edges, meta.json says {n_edges} (n_edges)")
    rows = np.lexsort((order[:, 1], order[:, 0]))  # the graph's order: by receiver, then sender
    return pd.DataFrame({"src": table.src.to_numpy()[rows], "dst": table.dst.to_numpy()[rows],
                         "score": scores[rows]})


def _table(path: Path, required, optional=(), whole=()):
    """A faithfulness table: the `required` columns, then any of `optional`, every cell a finite number."""
    import pandas as pd

    table = read_table(path, dtype=str, keep_default_na=False)
    columns = list(table.columns)
    if columns[:len(required)] != list(required) or not set(columns[len(required):]) <= set(optional):
        raise _damaged(path, f"its columns are {', '.join(map(str, columns)) or 'none'}, expected "
                             f"{', '.join(required)}" + (f" (then {', '.join(optional)})" if optional else ""))
    return pd.DataFrame({column: _numbers(path, table, column, whole=column in whole) for column in columns})


def read_evaluation(path: Path, attrs):
    """evaluation.csv (sizes in (0, 100], once each, in order) with meta.json's `evaluation` as its attrs."""
    table = _table(path, EVALUATION, ("faithfulness_abs", "metric_abs", "random_mean", "random_lo", "random_hi"),
                   whole=("n_edges",))
    if table.empty:
        raise _damaged(path, "it holds no sizes")
    sizes = table["size"].to_numpy()
    if not ((sizes > 0) & (sizes <= 100)).all() or (sizes[1:] <= sizes[:-1]).any():
        raise _damaged(path, "its sizes must be percentages in (0, 100], each once, smallest first")
    table["n_edges"] = table["n_edges"].astype(int)
    where = path.with_name(FILES["meta"])
    if not isinstance(attrs, dict) or not all(_finite(attrs.get(key)) for key in ("cpr", "cmd")):
        raise _damaged(where, f"its evaluation lacks finite cpr and cmd, which {path.name} needs")
    text = ("cpr_ranking", "cmd_ranking")  # which ranking made which number, in words
    bad = [key for key, value in attrs.items() if not (_finite(value) or (isinstance(value, float) and math.isnan(value))
                                                       or (key in text and isinstance(value, str)))]
    if bad:
        raise _damaged(where, f"evaluation's {bad[0]} is {_short(attrs[bad[0]])}, expected a number")
    table.attrs.update(attrs)
    return table


def read_random(path: Path):
    """random.csv: the random circuits' faithfulness (no rows when none were drawn)."""
    table = _table(path, RANDOM, whole=("draw", "n_edges"))
    for column in ("draw", "n_edges"):
        table[column] = table[column].astype(int)
    return table


def check_scores(edges, what: str) -> None:
    """HeadscopeError unless `edges` has src, dst and score columns and every score is a finite
    number (`what` names the caller in the message)."""
    import numpy as np
    import pandas as pd

    if not hasattr(edges, "columns") or not {"src", "dst", "score"} <= set(edges.columns):
        raise HeadscopeError(f"{what} needs the circuit's edges as a table with src, dst and score columns")
    values = pd.to_numeric(edges["score"], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise HeadscopeError(f"{what}: the score of edge {edges['src'].iloc[row]} -> {edges['dst'].iloc[row]} is "
                             f"{_short(edges['score'].iloc[row])}; a circuit ranks finite numbers only")

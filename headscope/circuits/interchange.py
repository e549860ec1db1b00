"""Circuits in the JSON format of the EAP-IG code (Hanna et al.), which MIB's circuit track reads.

- `write_eap_json(circuit, path, in_graph=None)`: `Circuit.to_eap_json`.
- `read_eap_json(cls, path, loaded, task=None)`: `Circuit.from_eap_json`.
- `to_eap_name(edge)` / `from_eap_name(name)`: one edge's name in each convention.

The format (`Graph.to_json` / `Graph.from_json` there): one JSON object with
    cfg    {"n_layers", "n_heads", "parallel_attn_mlp", "d_model"}
    nodes  {name: {"in_graph": bool, "score": null}}   (an older form maps name -> bool; both are read)
    edges  {"input->a0.h1<q>": {"score": float, "in_graph": bool}, "a0.h1->m0": {...}, ...}
Names: `input` is headscope's `embed`; a head's query, key and value inputs are the suffixes
`<q>`, `<k>`, `<v>` on the edge (headscope's receivers `a0.h1.q`, `.k`, `.v`); `a{L}.h{H}`,
`m{L}` and `logits` are shared. The format has no node for an encoder-decoder's
cross-attention block (`c{L}`) or a layer's second mixer (`m{L}.2`): such circuits are refused.

Scores: the EAP-IG code's metrics are losses (the negated logit difference, say), so its score of
an edge is the change of the *loss*; headscope's is the change of the task's metric. The file holds
-score, so its "top edges by score" (`absolute=False`) are the ones that push the metric toward the
clean run, as CPR ranks them. headscope's own fields ride along under the key "headscope" (the
EAP-IG code reads only cfg, nodes and edges).

`in_graph` marks the circuit: None keeps the circuit's own (`meta["in_graph"]` from a file read
back, otherwise every edge), an integer n the top n edges by signed push toward the clean run, or
an iterable of edge names ("src->dst" in headscope's names). A node is in the graph when one of
its edges is, and `logits` always.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import write_text_atomic
from ..errors import HeadscopeError, UsageError
from .faithfulness import toward_clean
from .edges import graph_of
from .target import Target
from .tasks import Task

__all__ = ["write_eap_json", "read_eap_json", "to_eap_name", "from_eap_name"]

_HEAD_INPUT = re.compile(r"^(a\d+\.h\d+)\.([qkv])$")
_EAP_HEAD_INPUT = re.compile(r"^(a\d+\.h\d+)<([qkv])>$")
_NODE = re.compile(r"^(input|embed|logits|a\d+\.h\d+|m\d+)$")


def _node_out(name: str) -> str:
    if name == "embed":
        return "input"
    if not _NODE.match(name):
        raise HeadscopeError(f"the EAP-IG format has no node for {name!r} (only input, a<L>.h<H>, m<L> and logits); "
                             f"this circuit cannot be written in it")
    return name


def to_eap_name(src: str, dst: str) -> str:
    """`("embed", "a0.h1.q")` -> `"input->a0.h1<q>"`."""
    head = _HEAD_INPUT.match(dst)
    if head:
        return f"{_node_out(src)}->{head.group(1)}<{head.group(2)}>"
    return f"{_node_out(src)}->{_node_out(dst)}"


def from_eap_name(name: str) -> tuple[str, str]:
    """`"input->a0.h1<q>"` -> `("embed", "a0.h1.q")`."""
    src, arrow, dst = str(name).partition("->")
    if not arrow:
        raise HeadscopeError(f"{name!r} is not an edge name of the EAP-IG format (parent->child)")
    head = _EAP_HEAD_INPUT.match(dst)
    src = "embed" if src == "input" else src
    return src, f"{head.group(1)}.{head.group(2)}" if head else dst


def _layers_and_heads(nodes) -> tuple[int, int]:
    layers = heads = 0
    for name in nodes.name:
        match = re.match(r"^a(\d+)\.h(\d+)$", str(name)) or re.match(r"^m(\d+)$", str(name))
        if match:
            layers = max(layers, int(match.group(1)) + 1)
            if str(name).startswith("a"):
                heads = max(heads, int(match.group(2)) + 1)
    return layers, heads


def _marked(circuit, in_graph) -> np.ndarray:
    """Which of the circuit's edges are in the graph (module docstring)."""
    names = [f"{s}->{d}" for s, d in zip(circuit.edges.src, circuit.edges.dst)]
    if in_graph is None:
        in_graph = circuit.meta.get("in_graph")
        if in_graph is None:
            return np.ones(len(names), dtype=bool)
    if isinstance(in_graph, (int, np.integer)) and not isinstance(in_graph, bool):
        if not 0 <= in_graph <= len(names):
            raise UsageError(f"in_graph must be an edge count from 0 to {len(names)}, got {in_graph}")
        meta = circuit.meta
        push = toward_clean(circuit.edges.score.to_numpy(dtype=float), float(meta.get("clean_metric", 1.0)),
                            float(meta.get("corrupted_metric", 0.0)))
        marked = np.zeros(len(names), dtype=bool)
        marked[np.argsort(-push, kind="stable")[:in_graph]] = True
        return marked
    if isinstance(in_graph, (str, bytes)):
        raise UsageError("in_graph takes None, an edge count or an iterable of edge names 'src->dst', not a string")
    wanted = set(in_graph)
    unknown = sorted(wanted - set(names))
    if unknown:
        raise UsageError(f"in_graph names an edge this circuit lacks: {unknown[0]!r}")
    return np.array([n in wanted for n in names], dtype=bool)


def write_eap_json(circuit, path, in_graph=None) -> Path:
    """Write `circuit` in the EAP-IG code's JSON format (module docstring); returns the path."""
    scores = circuit.edges.score.to_numpy(dtype=float)
    if not np.isfinite(scores).all():
        raise HeadscopeError("this circuit has NaN or infinite scores, which the EAP-IG format cannot hold")
    marked = _marked(circuit, in_graph)
    edges, touched = {}, {"logits"}
    for src, dst, score, keep in zip(circuit.edges.src, circuit.edges.dst, scores, marked):
        name = to_eap_name(str(src), str(dst))
        edges[name] = {"score": -float(score), "in_graph": bool(keep)}
        if keep:
            parent, _, child = name.partition("->")
            touched.update({parent, child.split("<")[0]})
    nodes = {_node_out(str(n)): {"in_graph": _node_out(str(n)) in touched, "score": None}
             for n in circuit.nodes.name}
    layers, heads = _layers_and_heads(circuit.nodes)
    names = set(zip(circuit.edges.src, circuit.edges.dst))
    parallel = heads > 0 and layers > 0 and ("a0.h0", "m0") not in names and "m0" in set(circuit.nodes.name)
    cfg = {"n_layers": layers, "n_heads": heads, "parallel_attn_mlp": bool(parallel)}
    if circuit.meta.get("d_model") is not None:
        cfg["d_model"] = int(circuit.meta["d_model"])
    keep = ("model", "task", "method", "steps", "riemann", "n", "metric", "clean_metric", "corrupted_metric")
    record = {"cfg": cfg, "nodes": nodes, "edges": edges,
              "headscope": {"score_sign": "EAP-IG: -(headscope score), the change of the loss -metric",
                            **{k: circuit.meta[k] for k in keep if k in circuit.meta}}}
    path = Path(path)
    write_text_atomic(path, json.dumps(record, indent=None, default=str))
    return path


def read_eap_json(cls, path, loaded: Any, task: Any = None):
    """A `cls` (Circuit) from the EAP-IG code's JSON format, its edges checked against `loaded`'s
    graph (module docstring); `task` is the one to evaluate it with (default: none, and a
    one-prompt stand-in to find the graph)."""
    import pandas as pd

    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HeadscopeError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise HeadscopeError(f"{path} is not a JSON file of the EAP-IG format: {err}") from None
    if not isinstance(record, dict) or not all(isinstance(record.get(k), dict) for k in ("cfg", "nodes", "edges")):
        raise HeadscopeError(f"{path} is not a circuit of the EAP-IG format (it needs the objects cfg, nodes and "
                             f"edges)")
    given = {}
    for name, info in record["edges"].items():
        score = info.get("score") if isinstance(info, dict) else None
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise HeadscopeError(f"{path}: edge {name!r} has no finite score ({score!r})")
        given[from_eap_name(name)] = (-float(score), bool(info.get("in_graph", True)))
    graph_task = task if task is not None else _stand_in(loaded)
    target = Target(loaded, graph_task, None, "from_eap_json")
    graph = graph_of(target, graph_task)
    names = [(graph.senders[u][0], name) for u, _, name in graph.edges()]
    missing = [n for n in names if n not in given]
    extra = [n for n in given if n not in set(names)]
    if missing:
        raise HeadscopeError(f"{path} is not a circuit of this model: it lacks the model's edge "
                             f"{'->'.join(missing[0])}")
    if extra:
        raise HeadscopeError(f"{path} is not a circuit of this model: its edge {'->'.join(extra[0])} is not in the "
                             f"model's graph")
    edges = pd.DataFrame({"src": [s for s, _ in names], "dst": [d for _, d in names],
                          "score": [given[n][0] for n in names]})
    marked = [f"{s}->{d}" for s, d in names if given[(s, d)][1]]
    meta = dict(record.get("headscope") or {})
    meta.pop("score_sign", None)
    meta.update(model=meta.get("model", getattr(loaded, "name", type(target.model).__name__)), n_edges=len(edges),
                sites=target.sites, d_model=record["cfg"].get("d_model"), source=str(path),
                in_graph=None if len(marked) == len(names) else marked)
    return cls(edges, graph.nodes(), meta, task, loaded=loaded)


def _stand_in(loaded):
    """A one-prompt task of the model's first tokens: enough to find its graph."""
    import torch

    ids = torch.tensor([[1, 2, 3, 4]])
    return Task(clean=ids, corrupted=ids, answer=torch.tensor([1]), wrong=torch.tensor([2]))

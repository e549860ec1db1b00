"""`Circuit`: scored edges between a model's components, and its files.

A circuit's nodes are the senders and receivers of the residual stream:
    embed            the embeddings (the first layer's input)
    a{L}.h{H}        head H of attention layer L (the model's own layer numbers): its output as a
                     sender; as a receiver `a{L}.h{H}.q`, `.k`, `.v`, its query, key and value inputs
                     (under grouped-query attention, the query head's own use of its shared key
                     and value)
    m{L}             layer L's MLP or other mixer (a second one in the same layer: `m{L}.2`)
    c{L}             layer L's attention block of another group, whole (an encoder-decoder's
                     cross-attention)
    logits           the unembedding's input (a receiver only)
An edge `src -> dst` is the part of dst's input that src wrote; its score estimates the change of
the task's metric when that one edge carries the corrupted run's value instead of the clean one.

- `circuit(loaded, task, method="eap-ig", steps=5)` -> `Circuit`: every edge scored
  (`headscope.circuits.eap`, which documents the formulas).
- `Circuit.edges` (DataFrame: src, dst, score), `Circuit.nodes` (name, kind, layer, head),
  `Circuit.meta`; `Circuit.top(n)`: the n edges of largest |score| (the ranking CMD uses; CPR
  ranks by signed score, see `headscope.circuits.eap`).
- `Circuit.evaluate(sizes, ...)`: faithfulness measured by running the model, CPR and CMD as MIB
  defines them (`headscope.circuits.eap.evaluate`); `Circuit.evaluation` holds the last one.
- `Circuit.stability(n_boot, sizes)`: bootstrap Jaccard of the top edges over resampled prompts
  (`headscope.circuits.stability`), also kept in `meta["stability"]`.
- `Circuit.to_eap_json(path)` / `Circuit.from_eap_json(path, loaded)`: the circuit in the EAP-IG
  code's and MIB's JSON format (`headscope.circuits.interchange`).
- `Circuit.save(folder)` writes `edges.csv`, `nodes.csv`, `meta.json`, `task.json` and, once
  evaluated, `evaluation.csv` and `random.csv`; `Circuit.load(folder)` reads them back
  (`evaluate` then needs the model again).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import HeadscopeError, UsageError
from .eap import METHODS, evaluate, score_edges
from .edges import graph_of
from .interchange import read_eap_json, write_eap_json
from .running import Target
from .stability import STABILITY_SIZES, stability
from .tasks import Task

__all__ = ["Circuit", "circuit", "MIB_SIZES", "FILES", "KINDS"]

# Circuit sizes as percentages of all edges (Mueller et al. 2025, MIB).
MIB_SIZES = (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)
FILES = {"edges": "edges.csv", "nodes": "nodes.csv", "meta": "meta.json", "task": "task.json",
         "evaluation": "evaluation.csv", "random": "random.csv"}
KINDS = ("embed", "head", "mlp", "mixer", "attn", "logits")


@dataclass
class Circuit:
    """Scored edges of one task on one model (module docstring).

    Attributes:
        edges: DataFrame (src, dst, score), one row per edge of the model's graph.
        nodes: DataFrame (name, kind, layer, head) of the senders, and `logits`.
        meta: model, task, method, steps, n, metric, clean_metric, corrupted_metric, passes,
            n_edges, sites.
        task: the `Task` the edges were scored on.
        evaluation: the last `evaluate`'s table (size, n_edges, faithfulness, metric, random_*),
            or None.
        random: the random circuits' faithfulness (draw, size, n_edges, faithfulness, metric), or None.
        loaded: the model it was found in (not saved; `evaluate` runs it).
        prompt_scores: `[n, edges]` float32 per-prompt scores whose mean is `edges.score` (kept
            in memory by `circuit`, not saved; `stability` resamples them).
    """

    edges: Any
    nodes: Any
    meta: dict
    task: Any = None
    evaluation: Any = None  # DataFrame (size, n_edges, faithfulness, metric); attrs cpr, cmd
    random: Any = None  # DataFrame (draw, size, n_edges, faithfulness, metric)
    loaded: Any = field(default=None, repr=False)  # the model it was found in (not saved)
    prompt_scores: Any = field(default=None, repr=False)  # [n, edges] per-prompt scores (not saved)

    def top(self, n: int = 20):
        """The `n` edges of largest |score|, largest first."""
        order = self.edges.score.abs().sort_values(ascending=False, kind="stable").index
        return self.edges.loc[order].head(n).reset_index(drop=True)

    def evaluate(self, sizes=MIB_SIZES, n_random: int = 5, seed: int = 0, loaded: Any = None,
                 batch_size: int = 16, progress=None):
        """Faithfulness at each size, measured by running the model with only the circuit's edges
        clean (`headscope.circuits.eap.evaluate`, which documents the formulas).

        Args:
            sizes: circuit sizes in percent of all edges, each in (0, 100].
            n_random: random circuits of the same sizes drawn as the baseline.
            seed: their seed.
            loaded: the model (default: the one the circuit was found in; needed after `load`).
            batch_size: prompts per forward pass.
            progress: `progress(stage, done, total)`.
        Returns:
            DataFrame (size, n_edges, faithfulness, metric, random_mean, random_lo, random_hi);
            `attrs`: cpr, cmd, random_cpr, random_cmd, clean_metric, corrupted_metric.
        """
        model = loaded if loaded is not None else self.loaded
        if model is None:
            raise HeadscopeError("evaluate runs the model: pass loaded=headscope.load(...) for a circuit read from disk")
        self.evaluation, self.random = evaluate(self, model, sizes=sizes, n_random=n_random, seed=seed,
                                                batch_size=batch_size, progress=progress)
        return self.evaluation

    def stability(self, n_boot: int = 100, sizes=STABILITY_SIZES, seed: int = 0):
        """Bootstrap Jaccard of the top `sizes`% of edges between circuits of resampled prompts
        (`headscope.circuits.stability`); also kept in `meta["stability"]`, which `save` writes.

        Returns:
            DataFrame (size, n_edges, jaccard, jaccard_lo, jaccard_hi, n_boot, n_prompts).
        """
        if self.prompt_scores is None:
            raise HeadscopeError("stability resamples the per-prompt scores, which only a circuit found in this "
                                 "process holds: run headscope.circuit(...) again")
        table = stability(self.prompt_scores, sizes=sizes, n_boot=n_boot, seed=seed)
        self.meta["stability"] = table.to_dict(orient="records")
        return table

    def to_eap_json(self, path, in_graph=None) -> Path:
        """Write the circuit in the EAP-IG code's JSON format (`headscope.circuits.interchange`);
        returns the path.

        Args:
            path: the JSON file to write.
            in_graph: the edges marked in the graph: None (the circuit's own: every edge, or
                those of the file it was read from), an edge count (the top edges by signed
                push toward the clean run, as CPR ranks them) or edge names "src->dst".
        """
        return write_eap_json(self, path, in_graph)

    @classmethod
    def from_eap_json(cls, path, loaded: Any, task: Any = None) -> "Circuit":
        """A circuit from the EAP-IG code's JSON format, checked against `loaded`'s graph
        (`headscope.circuits.interchange`)."""
        return read_eap_json(cls, path, loaded, task)

    def save(self, folder) -> Path:
        """Write the circuit's files into `folder` (created if missing); returns it."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.edges.to_csv(folder / FILES["edges"], index=False)
        self.nodes.to_csv(folder / FILES["nodes"], index=False)
        meta = dict(self.meta)
        if self.evaluation is not None:
            self.evaluation.to_csv(folder / FILES["evaluation"], index=False)
            meta["evaluation"] = {k: v for k, v in self.evaluation.attrs.items()}
        if self.random is not None:
            self.random.to_csv(folder / FILES["random"], index=False)
        (folder / FILES["meta"]).write_text(json.dumps(meta, indent=1, default=str), encoding="utf-8")
        if self.task is not None:
            self.task.save(folder / FILES["task"])
        return folder

    @classmethod
    def load(cls, folder) -> "Circuit":
        """Read a folder `save` wrote; HeadscopeError naming what is missing or damaged."""
        import pandas as pd

        folder = Path(folder)
        for name in ("edges", "nodes", "meta"):
            if not (folder / FILES[name]).is_file():
                raise HeadscopeError(f"{folder} is not a circuit folder (no {FILES[name]})")
        try:
            meta = json.loads((folder / FILES["meta"]).read_text(encoding="utf-8"))
            edges = pd.read_csv(folder / FILES["edges"])
            nodes = pd.read_csv(folder / FILES["nodes"])
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise HeadscopeError(f"cannot read the circuit in {folder}: {err}") from None
        if list(edges.columns) != ["src", "dst", "score"] or edges.score.isna().any():
            raise HeadscopeError(f"{folder / FILES['edges']} is damaged: expected columns src, dst, score with a "
                                 f"score on every row")
        evaluation = random = task = None
        if (folder / FILES["evaluation"]).is_file():
            evaluation = pd.read_csv(folder / FILES["evaluation"])
            evaluation.attrs.update(meta.get("evaluation", {}))
        if (folder / FILES["random"]).is_file():
            random = pd.read_csv(folder / FILES["random"])
        if (folder / FILES["task"]).is_file():
            task = Task.load(folder / FILES["task"])
        return cls(edges, nodes, meta, task, evaluation, random)


def circuit(loaded: Any, task: Any, method: str = "eap-ig", steps: int = 5, sites: Optional[str] = None,
            batch_size: int = 8, progress=None, riemann: str = "left") -> Circuit:
    """Score every edge of the model's graph for `task` (module docstring; formulas in
    `headscope.circuits.eap`).

    Args:
        loaded: a `headscope.Loaded` (or a transformers model with an adapter).
        task: a `headscope.Task`.
        method: "eap" (one gradient on the clean run) or "eap-ig" (integrated gradients from
            the corrupted to the clean embeddings over `steps` points).
        steps: EAP-IG's points (ignored by "eap").
        riemann: EAP-IG's points: "left" (k = 0..S-1 over S, from the corrupted run, as the
            EAP-IG code and MIB compute it) or "right" (k = 1..S, ending at the clean run).
        sites: the group of attention sites whose heads are nodes; default: the analysed stack.
        batch_size: prompts per pass.
        progress: `progress(stage, done, total)`.
    Returns:
        A `Circuit`; `meta["passes"]` counts forward and backward passes over all prompts.
    """
    import pandas as pd

    if method not in METHODS:
        raise UsageError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    target = Target(loaded, task, sites, "circuit")
    graph = graph_of(target, task)
    scores, passes, metrics, per_prompt = score_edges(target, graph, task, method, steps, batch_size, progress,
                                                      riemann=riemann)
    edges = graph.edges()
    table = pd.DataFrame({"src": [graph.senders[u][0] for u, _, _ in edges], "dst": [name for _, _, name in edges],
                          "score": scores})
    meta = {"model": getattr(loaded, "name", type(target.model).__name__), "task": task.name, "method": method,
            "steps": steps if method == "eap-ig" else 1, "riemann": riemann if method == "eap-ig" else None,
            "n": int(task.n), "metric": task.metric,
            "clean_metric": metrics["clean"], "corrupted_metric": metrics["corrupted"], "passes": passes,
            "n_edges": len(table), "sites": target.sites, "d_model": int(target.d_model)}
    return Circuit(table, graph.nodes(), meta, task, loaded=loaded, prompt_scores=per_prompt)

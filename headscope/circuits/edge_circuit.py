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
  (`headscope.circuits.faithfulness`, which documents the formulas).
- `Circuit.edges` (DataFrame: src, dst, score), `Circuit.nodes` (name, kind, layer, head),
  `Circuit.meta`; `Circuit.top(n)`: the n edges of largest |score| (the ranking CMD uses; CPR
  ranks by signed score, see `headscope.circuits.faithfulness`).
- `Circuit.evaluate(sizes, ...)`: faithfulness measured by running the model, CPR and CMD as MIB
  defines them (`headscope.circuits.faithfulness.evaluate`); `Circuit.evaluation` holds the last one.
- `Circuit.stability(n_boot, sizes)`: bootstrap Jaccard of the top edges over resampled prompts
  (`headscope.circuits.stability`), also kept in `meta["stability"]`.
- `Circuit.to_eap_json(path)` / `Circuit.from_eap_json(path, loaded)`: the circuit in the EAP-IG
  code's and MIB's JSON format (`headscope.circuits.interchange`).
- `Circuit.save(folder, force=False)` writes `edges.csv`, `nodes.csv`, `meta.json`, `task.json`
  and, once evaluated, `evaluation.csv` and `random.csv`, atomically and with a manifest, under
  the rule every folder headscope writes follows (`headscope.atomic`); `Circuit.load(folder,
  unverified=False)` checks the manifest and reads them back (`evaluate` then needs the model again).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..atomic import atomic_dir
from ..checks import check_count, check_seed
from ..errors import HeadscopeError, UsageError
from ..folders import check_folder, write_manifest
from .circuit_files import FILES, KINDS, check_scores, read_edges, read_evaluation, read_meta, read_nodes, read_random
from .eap import METHODS, score_edges
from .edges import graph_of
from .faithfulness import MIB_SIZES, evaluate
from .interchange import read_eap_json, write_eap_json
from .stability import STABILITY_SIZES, stability
from .target import Target
from .tasks import Task

__all__ = ["Circuit", "circuit", "MAX_STEPS", "MAX_RANDOM", "FILES", "KINDS"]

# Bounds on the work one call may ask for: EAP-IG's points (each a forward and backward pass of
# every prompt; 5-20 converge on the models benchmarked, docs/circuits.md) and the random
# circuits drawn per size (each a forward pass of every prompt).
MAX_STEPS = 1000
MAX_RANDOM = 1000


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
        """The `n` edges of largest |score|, largest first (all of them when there are fewer).

        Raises:
            UsageError: `n` not a whole number of at least 1.
            HeadscopeError: a score that is not a finite number, naming its edge.
        """
        check_count("n", n)
        check_scores(self.edges, "Circuit.top")
        order = self.edges.score.abs().sort_values(ascending=False, kind="stable").index
        return self.edges.loc[order].head(n).reset_index(drop=True)

    def evaluate(self, sizes=MIB_SIZES, n_random: int = 5, seed: int = 0, loaded: Any = None,
                 batch_size: int = 16, progress=None):
        """Faithfulness at each size, measured by running the model with only the circuit's edges
        clean (`headscope.circuits.faithfulness.evaluate`, which documents the formulas).

        Args:
            sizes: circuit sizes in percent of all edges, each in (0, 100].
            n_random: random circuits of the same sizes drawn as the baseline (0 to `MAX_RANDOM`).
            seed: their seed (0 to 2**63-1).
            loaded: the model (default: the one the circuit was found in; needed after `load`).
            batch_size: prompts per forward pass; where it holds several copies of the task's
                prompts, each pass runs that many circuits side by side (one copy each).
            progress: `progress(stage, done, total)`, counting the circuits measured.
        Returns:
            DataFrame (size, n_edges, faithfulness, metric, random_mean, random_lo, random_hi);
            `attrs`: cpr, cmd, random_cpr, random_cmd, clean_metric, corrupted_metric.
        """
        check_scores(self.edges, "Circuit.evaluate")
        check_seed(seed)
        check_count("n_random", n_random, least=0, most=MAX_RANDOM)
        if self.task is None:
            raise HeadscopeError("evaluate runs the circuit's task, and this circuit has none (a circuit folder "
                                 f"without {FILES['task']}); find the circuit again with headscope.circuit(loaded, task)")
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

    def save(self, folder, *, force: bool = False) -> Path:
        """Write the circuit's folder atomically, under the rule every folder headscope writes
        follows (`headscope.atomic`): its files, headscope's marker and a manifest of their sizes
        and SHA-256s, which `load` checks.

        Args:
            folder: the folder to write; refused when it exists, unless `force`.
            force: replace an existing folder headscope wrote (or an empty one); a folder of
                anyone else's files is never replaced.
        Returns:
            The folder's path.
        """
        if not isinstance(folder, (str, os.PathLike)):
            raise HeadscopeError(f"Circuit.save needs a folder to write, got {folder!r}")
        with atomic_dir(folder, force=force) as tmp:
            self.write_into(tmp)
            write_manifest(tmp)
        return Path(folder)

    def write_into(self, folder) -> None:
        """Write the circuit's files into an existing folder (an `atomic_dir`'s temporary one; no
        atomicity or manifest of its own); a score that is not a finite number is refused, as
        `load` would refuse the file."""
        check_scores(self.edges, "Circuit.save")
        folder = Path(folder)
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

    @classmethod
    def load(cls, folder, *, unverified: bool = False) -> "Circuit":
        """Read a folder `save` (or `headscope circuit`) wrote; HeadscopeError naming what is
        missing or damaged.

        Args:
            folder: the folder.
            unverified: read a folder whose manifest is missing or no longer matches, with a
                warning (`HeadscopeWarning`).
        Returns:
            The `Circuit` (without a model: `evaluate` needs `loaded=`).
        """
        if not isinstance(folder, (str, os.PathLike)):
            raise HeadscopeError(f"Circuit.load needs the folder a circuit was saved in, got {folder!r}")
        folder = Path(folder)
        for name in ("edges", "nodes", "meta"):
            if not (folder / FILES[name]).is_file():
                raise HeadscopeError(f"{folder} is not a circuit folder (no {FILES[name]})")
        present = [name for name in FILES.values() if (folder / name).is_file()]
        check_folder(folder, present, unverified=unverified, required=True)
        meta = read_meta(folder / FILES["meta"])
        nodes = read_nodes(folder / FILES["nodes"])
        edges = read_edges(folder / FILES["edges"], nodes, meta["n_edges"])
        evaluation = random = task = None
        if (folder / FILES["evaluation"]).is_file():
            evaluation = read_evaluation(folder / FILES["evaluation"], meta.get("evaluation"))
        if (folder / FILES["random"]).is_file():
            random = read_random(folder / FILES["random"])
        if (folder / FILES["task"]).is_file():
            task = Task.load(folder / FILES["task"])
        return cls(edges, nodes, meta, task, evaluation, random)


def circuit(loaded: Any, task: Any, method: str = "eap-ig", steps: int = 5, sites: Optional[str] = None,
            batch_size: int = 8, progress=None, riemann: str = "left", max_memory: Optional[int] = None) -> Circuit:
    """Score every edge of the model's graph for `task` (module docstring; formulas in
    `headscope.circuits.eap`).

    Args:
        loaded: a `headscope.Loaded` (or a transformers model with an adapter).
        task: a `headscope.Task`.
        method: "eap" (one gradient on the clean run) or "eap-ig" (integrated gradients from
            the corrupted to the clean embeddings over `steps` points).
        steps: EAP-IG's points, 1 to `MAX_STEPS` (ignored by "eap").
        riemann: EAP-IG's points: "left" (k = 0..S-1 over S, from the corrupted run, as the
            EAP-IG code and MIB compute it) or "right" (k = 1..S, ending at the clean run).
        sites: the group of attention sites whose heads are nodes; default: the analysed stack.
        batch_size: prompts per pass, at most.
        max_memory: bytes the scoring may take; prompts go through in micro-batches small enough
            to fit (`headscope.circuits.eap.micro_batch`; default: half of the device's free memory).
        progress: `progress(stage, done, total)`.
    Returns:
        A `Circuit`; `meta["passes"]` counts forward and backward passes over all prompts.
    """
    import pandas as pd

    if method not in METHODS:
        raise UsageError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if method == "eap-ig":
        check_count("steps", steps, most=MAX_STEPS)
    target = Target(loaded, task, sites, "circuit")
    graph = graph_of(target, task)
    scores, passes, metrics, per_prompt = score_edges(target, graph, task, method, steps, batch_size, progress,
                                                      riemann=riemann, max_memory=max_memory)
    edges = graph.edges()
    table = pd.DataFrame({"src": [graph.senders[u][0] for u, _, _ in edges], "dst": [name for _, _, name in edges],
                          "score": scores})
    meta = {"model": getattr(loaded, "name", type(target.model).__name__), "task": task.name, "method": method,
            "steps": steps if method == "eap-ig" else 1, "riemann": riemann if method == "eap-ig" else None,
            "n": int(task.n), "metric": task.metric,
            "clean_metric": metrics["clean"], "corrupted_metric": metrics["corrupted"], "passes": passes,
            "n_edges": len(table), "sites": target.sites, "d_model": int(target.d_model)}
    return Circuit(table, graph.nodes(), meta, task, loaded=loaded, prompt_scores=per_prompt)

"""`headscope attribute`: one task through direct logit attribution and attribution patching, and its folder.

- `run_attribution(loaded, task, methods=("atp", "atp*"), exact=False, ...)` -> `AttributionRun`:
  the DLA table, one attribution table per method (exact patching too with `exact`), the head
  labels of an analysis when given, and every head's pattern on the task's first prompts (the
  page's head explorer).
- `AttributionRun.write_into(folder, plotlyjs)`: `task.json` (`Task.save`), `dla.csv`,
  `attribution.csv` (one row per method and head), `meta.json`, `index.html`
  (`headscope.circuits.attribution_page`) and `manifest.json`; `AttributionRun.save(folder,
  force=False)`: the same, atomically, under the rule every folder headscope writes follows.
- `read_attribution(folder, unverified=False)` -> the tables and meta again, after checking the
  folder against its manifest (no torch needed).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from ..atomic import atomic_dir
from ..folders import check_folder, write_manifest
from ..errors import HeadscopeError, UsageError
from ..hf.capture import capture, stack_layers
from ..probes.tokens import display_tokens
from ..tables import read_table
from .attribution import METHODS, attribute
from .attribution_page import render_attribution_html
from .dla import logit_attribution
from .target import Target

__all__ = ["AttributionRun", "Shown", "run_attribution", "read_attribution", "FILES"]

FILES = {"task": "task.json", "dla": "dla.csv", "attribution": "attribution.csv", "meta": "meta.json"}


@dataclass
class Shown:
    """One prompt in the head explorer (the fields the report's explorer payload reads)."""

    probe: str
    index: int
    tokens: list
    patterns: Any  # uint8 [layer, head, query, key]
    key_tokens: Optional[list] = None


@dataclass
class AttributionRun:
    """What `headscope attribute` computed (module docstring)."""

    model: str
    task: Any
    dla: Any
    tables: dict  # method -> DataFrame (attribute's)
    n_layers: int
    n_heads: int
    labels: Any = None  # DataFrame (layer, head, label) of an analysis, or None
    examples: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def attribution_frame(self):
        """Every method's table in one frame, with a `method` column first."""
        import pandas as pd

        frames = [table.assign(method=method) for method, table in self.tables.items()]
        joined = pd.concat(frames, ignore_index=True)
        return joined[["method"] + [c for c in joined.columns if c != "method"]]

    def save(self, folder, *, force: bool = False, plotlyjs: str = "embed") -> Path:
        """Write the folder `headscope attribute` writes, atomically, under the rule every folder
        headscope writes follows (`headscope.atomic`); returns its path.

        Args:
            folder: the folder to write; refused when it exists, unless `force`.
            force: replace an existing folder headscope wrote (or an empty one).
            plotlyjs: "embed" (offline) or "cdn".
        """
        if not isinstance(folder, (str, os.PathLike)):
            raise HeadscopeError(f"AttributionRun.save needs a folder to write, got {folder!r}")
        with atomic_dir(folder, force=force) as tmp:
            self.write_into(tmp, plotlyjs=plotlyjs)
        return Path(folder)

    def write_into(self, folder, plotlyjs: str = "embed") -> None:
        """Write the folder's files into `folder` (an `atomic_dir`'s temporary folder)."""
        folder = Path(folder)
        self.task.save(folder / FILES["task"])
        self.dla.to_csv(folder / FILES["dla"], index=False)
        self.attribution_frame().to_csv(folder / FILES["attribution"], index=False)
        (folder / FILES["meta"]).write_text(json.dumps(self.meta, indent=1, default=str), encoding="utf-8")
        (folder / "index.html").write_text(render_attribution_html(self, plotlyjs=plotlyjs), encoding="utf-8")
        write_manifest(folder)  # every file's size and hash: a damaged folder is told from an intact one


def run_attribution(loaded: Any, task: Any, methods=("atp", "atp*"), exact: bool = False, point: str = "z",
                    direction: str = "denoising", labels=None, batch_size: int = 16, n_show: int = 3,
                    progress=None) -> AttributionRun:
    """Direct logit attribution and attribution patching of `task` on `loaded` (module docstring).

    Args:
        loaded: a `headscope.Loaded`.
        task: a `headscope.Task`.
        methods: attribution methods to run ("atp", "atp*"); `exact` adds exact patching.
        exact: run `method="exact"` too (one forward pass of every prompt per head).
        point, direction: as `headscope.attribute`'s.
        labels: an analysis's labels table (layer, head, label), shown beside the heads.
        batch_size: prompts per pass.
        n_show: prompts whose patterns the head explorer shows.
        progress: `progress(stage, done, total)`, as `headscope.analyze` takes it.
    Returns:
        An `AttributionRun`.
    """
    methods = tuple(dict.fromkeys(list(methods) + (["exact"] if exact else [])))
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise UsageError(f"unknown method {unknown[0] if unknown else '(none)'!r}; choose from {', '.join(METHODS)}")
    target = Target(loaded, task, None, "attribute")
    dla = logit_attribution(loaded, task, batch_size=batch_size)  # the logit difference, whatever the metric
    tables = {}
    for method in methods:
        stage = f"attribute ({method})"
        tables[method] = attribute(loaded, task, method=method, point=point, direction=direction,
                                   batch_size=batch_size,
                                   progress=(lambda done, total, s=stage: progress(s, done, total)) if progress else None)
    layers = target.selection.layers
    n_layers, n_heads = max(layers) + 1, target.selection.n_heads
    examples = _shown(loaded, target, task, n_show, n_layers)
    meta = {"model": getattr(loaded, "name", type(target.model).__name__), "task": task.name, "metric": task.metric,
            "n": int(task.n), "point": point, "direction": direction, "methods": list(methods),
            "attrs": {method: table.attrs for method, table in tables.items()}, "dla": dict(dla.attrs),
            "n_layers": n_layers, "n_heads": n_heads}
    return AttributionRun(meta["model"], task, dla, tables, n_layers, n_heads, labels, examples, meta)


@torch.no_grad()
def _shown(loaded, target: Target, task, n_show: int, n_layers: int) -> list:
    """The first `n_show` clean prompts with every head's pattern, cut to their real tokens."""
    rows = task.subset(slice(0, min(n_show, task.n)))
    inputs, _ = target.inputs(rows, "clean")
    with capture(target.model, to="cpu", sites=target.sites) as cap:
        target.model(**inputs)
    maps = stack_layers(cap.patterns, n_layers)  # (N, L, H, Tq, Tk)
    tokenizer = getattr(loaded, "tokenizer", None)
    shown = []
    for i in range(rows.n):
        length = int(rows.mask[i].sum())
        ids = rows.clean[i, :length].tolist()
        if target.two_inputs:  # the decoder reads its start token, then the prompt
            ids, length = [int(target.start)] + ids, length + 1
        tokens = display_tokens(tokenizer, ids) if tokenizer is not None else [str(t) for t in ids]
        patterns = (maps[i, :, :, :length, :length].clamp(0, 1) * 255).round().to(torch.uint8).numpy()
        shown.append(Shown(task.name, i, tokens, patterns))
    return shown


def read_attribution(folder, unverified: bool = False) -> dict:
    """`{"dla": DataFrame, "attribution": DataFrame, "meta": dict}` of a folder `write_into` wrote,
    after checking it against its manifest (`headscope.folders.check_folder`).

    Args:
        folder: the folder.
        unverified: read a folder whose manifest is missing or no longer matches, with a warning.
    """
    if not isinstance(folder, (str, os.PathLike)):
        raise HeadscopeError(f"read_attribution needs the folder an attribution was written in, got {folder!r}")
    folder = Path(folder)
    missing = [name for name in FILES.values() if not (folder / name).is_file()]
    if missing:
        raise HeadscopeError(f"{folder} is not an attribution folder (no {missing[0]})")
    check_folder(folder, list(FILES.values()), unverified=unverified, required=True)
    path = folder / FILES["meta"]
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeadscopeError(f"{path} is damaged ({type(err).__name__}); write the folder again with headscope") from None
    if not isinstance(meta, dict):
        raise HeadscopeError(f"{path} is damaged: it holds a {type(meta).__name__}, not an object; write the folder "
                             f"again with headscope")
    return {"dla": read_table(folder / FILES["dla"]), "attribution": read_table(folder / FILES["attribution"]),
            "meta": meta}

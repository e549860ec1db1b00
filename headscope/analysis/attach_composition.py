"""Composition scores inside an analysis: attach `headscope.composition`'s tables and re-write the folder.

- `add_composition(analysis_or_folder, loaded, kinds=("q", "k", "v"), ...)`: score every earlier ->
  later pair of the analysed model's heads (`headscope.circuits.composition_scores`) and attach the scores
  as the analysis's `composition` table (saved as composition.csv, its settings in
  `meta["composition"]`); the report then draws a heatmap per kind and the top pairs. Given an
  analysis, returns a copy holding them; given a folder, re-writes it (analysis files, manifest and
  index.html) atomically, as `headscope geometry --into` does (`attach_geometry.rewrite_folder`).
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from .attach_geometry import check_model_matches, rewrite_folder
from .result import Analysis
from ..checks import check_analysis, check_loaded
from ..circuits.composition_scores import BASELINE_SAMPLES, KINDS, composition
from ..errors import UsageError
from ..report.html import check_plotlyjs

__all__ = ["add_composition", "COMPOSITION_TABLE"]

COMPOSITION_TABLE = "composition"  # the analysis's table name (composition.csv)


def add_composition(analysis_or_folder, loaded, kinds: Sequence[str] = KINDS, rotary_offsets=None,
                    baseline_samples: int = BASELINE_SAMPLES, seed: int = 0, plotlyjs: str = "embed") -> Analysis:
    """The analysis with `headscope.composition(loaded, kind)` of each kind attached.

    Args:
        analysis_or_folder: an `Analysis` of `loaded`'s model, or the folder one was saved in
            (re-written in place, atomically, with its report).
        loaded: the `headscope.Loaded` it was made from.
        kinds: which of "q", "k", "v" to score.
        rotary_offsets, baseline_samples, seed: passed to `headscope.composition`.
        plotlyjs: "embed" or "cdn", for a re-written folder's index.html.
    Returns:
        A new `Analysis` whose `composition` table holds every kind's rows (`composition`'s
        columns) and whose `meta["composition"]` records the settings and the seconds taken.
    Raises:
        HeadscopeError: the model's shape differs from the analysis's, or `composition` refuses
            the model (its reason); a folder is then unchanged.
    """
    check_plotlyjs(plotlyjs)  # fail before any work
    folder = Path(analysis_or_folder) if isinstance(analysis_or_folder, (str, os.PathLike)) else None
    analysis = Analysis.load(folder) if folder is not None else analysis_or_folder
    check_analysis(analysis, "add_composition")
    check_loaded(loaded, "add_composition")
    check_model_matches(analysis, loaded)
    kinds = tuple(kinds) if not isinstance(kinds, str) else (kinds,)
    if not kinds or any(kind not in KINDS for kind in kinds) or len(set(kinds)) != len(kinds):
        raise UsageError(f"kinds must be distinct ones of {', '.join(KINDS)}, got {kinds!r}")
    import pandas as pd

    frames = [composition(loaded, kind, rotary_offsets, baseline_samples, seed) for kind in kinds]
    first = frames[0].attrs
    settings = {"kinds": list(kinds), "rotary_offsets": first["rotary_offsets"],
                "rotary_layers": first["rotary_layers"], "folded": first["folded"],
                "baseline_samples": baseline_samples, "seed": seed, "baseline_draw": first["baseline"]["draw"],
                "seconds": round(sum(f.attrs["seconds"] for f in frames), 2)}
    table = pd.concat(frames, ignore_index=True)
    attached = replace(analysis, tables={**analysis.tables, COMPOSITION_TABLE: table},
                       meta={**analysis.meta, "composition": settings})
    if folder is not None:
        rewrite_folder(folder, attached, plotlyjs)
    return attached

"""`headscope timeline`: score the heads of every checkpoint of a training run."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..atomic import atomic_dir
from ..loading import loader
from .shared import Bars, DeviceOpt, ForceOpt, PlotlyOpt, SeedOpt, check_plotlyjs, detector_names, friendly, index_above

__all__ = ["timeline_command"]


@friendly
def timeline_command(
    sources: Annotated[list[str], typer.Argument(help="A Trainer output folder (its checkpoint-* folders), model folders, or hub revisions org/name@revision (read from the cache, offline).")],
    out: Annotated[Path, typer.Option("--out", help="The timeline folder to write (timeline.csv and index.html).")],
    detectors: Annotated[Optional[str], typer.Option("--detectors", help="Comma-separated detector names (default: previous_token, induction, duplicate_token, sink, uniform).")] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    plotlyjs: PlotlyOpt = "embed",
    force: ForceOpt = False,
) -> None:
    """Score the heads of every checkpoint of a training run: timeline.csv and an HTML report.

    The control is the step-0 model when the series has one, else the random-init twin.
    """
    check_plotlyjs(plotlyjs)
    names = detector_names(detectors)
    from ..training.checkpoints import write_series  # torch and transformers: only when run

    guard = atomic_dir(out, force=force, protect=[Path(s) for s in sources if Path(s).exists()])
    bars = Bars()
    write_series(sources, guard, detectors=names, device=loader.resolve_device(device), seed=seed, plotlyjs=plotlyjs,
                 progress=lambda done, total: bars("checkpoints", done, total))
    index_above(out)

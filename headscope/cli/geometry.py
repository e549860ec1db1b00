"""`headscope geometry`: heads as subspaces and patterns, in a folder of their own or attached to
an analysis (`--into`)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

import headscope  # the public API, re-exported lazily: a command loads only what it runs

from .. import head_geometry  # lazy: its modules load torch only when the command runs
from ..analysis.result import Analysis
from ..atomic import atomic_dir
from ..checks import check_count
from ..loading import loader
from .shared import DeviceOpt, DtypeOpt, ForceOpt, ModelArg, NoCacheOpt, PlotlyOpt, check_plotlyjs, friendly

__all__ = ["geometry_command"]


@friendly
def geometry_command(
    model: ModelArg = "smollm2-135m",
    out: Annotated[Optional[Path], typer.Option("--out", help="Folder for heads.csv, pairs.csv, similarity.csv, pruning.csv, settings.json, geometry.html (default: geometry, unless --into).")] = None,
    into: Annotated[Optional[Path], typer.Option("--into", help="An analysis folder of the same model: attach the geometry to it and re-write its report (atomically).")] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    examples: Annotated[int, typer.Option(help="Text-probe windows.")] = 8,
    seq_len: Annotated[int, typer.Option(help="Tokens per window.")] = 128,
    no_importance: Annotated[bool, typer.Option("--no-importance", help="Skip importance and the pruning curve.")] = False,
    steps: Annotated[int, typer.Option("--steps", help="Points of the pruning curve after 0.")] = 10,
    normalize: Annotated[bool, typer.Option("--normalize", help="Order the pruning curve by importance normalised per layer (l2), as Michel et al. prune.")] = False,
    plotlyjs: PlotlyOpt = "embed",
    no_cache: NoCacheOpt = False,
    force: ForceOpt = False,
) -> None:
    """Heads as subspaces and patterns: overlaps, JS map and clusters, redundancy, importance."""
    from ..analysis.attach_geometry import check_model_matches, write_geometry_into  # torch: only when run
    check_plotlyjs(plotlyjs)
    check_count("--examples", examples)
    check_count("--steps", steps)
    check_count("--seq-len", seq_len, least=2)
    target = Analysis.load(into) if into is not None else None  # a bad folder fails before the model loads
    if into is not None:  # re-written atomically at the end: its checks (permission, ...) come before any work
        atomic_dir(into, force=True, protect=[Path(model)] if Path(model).exists() else [])
    guard = None
    if out is not None or into is None:  # its own folder, written atomically; checked before any work
        inputs = [path for path in (model, into) if path is not None and Path(path).exists()]
        guard = atomic_dir(out or Path("geometry"), force=force, protect=inputs)
    loaded = loader.load(model, device=device, dtype=dtype, cache=not no_cache)
    if target is not None:
        check_model_matches(target, loaded)
    result = headscope.geometry(loaded, n_examples=examples, seq_len=seq_len, importance=not no_importance,
                      pruning_steps=steps, normalize=normalize)
    if guard is not None:
        with guard as tmp:
            written = head_geometry.write_geometry(result, tmp)
        for path in written:
            typer.echo(str(guard.target / path.relative_to(tmp)))
    if into is not None:
        write_geometry_into(into, result, plotlyjs=plotlyjs)
        typer.echo(f"report: {into / 'index.html'}")
    typer.echo(f"{int(result.pairs.redundant.sum())} redundant pairs, {result.heads.cluster.nunique()} clusters")

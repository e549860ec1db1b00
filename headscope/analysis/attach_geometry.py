"""Geometry inside an analysis: attach `headscope.geometry`'s result and re-write the folder.

- `add_geometry(analysis, loaded, **options)`: run `headscope.geometry` on the analysed model
  and return a copy of the analysis holding it (`Analysis.geometry`); the report then draws
  its geometry section. The one call `headscope analyze --geometry` needs.
- `write_geometry_into(directory, result, plotlyjs=)`: attach a `GeometryResult` to the analysis
  saved in `directory` and re-write the folder (analysis files, geometry/ and index.html)
  atomically: the new folder is built beside it and renamed into place; files of the folder
  that are not the analysis's own are kept. What `headscope geometry MODEL --into DIR` does.
- `rewrite_folder(directory, analysis, plotlyjs, fresh)`: that re-write, for any attached result.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from .result import Analysis
from ..atomic import atomic_dir
from ..errors import HeadscopeError
from ..checks import check_analysis, check_loaded
from ..head_geometry.geometry_result import GEOMETRY_FOLDER, GeometryResult
from ..head_geometry.run import geometry
from ..report import write_report_into

__all__ = ["add_geometry", "write_geometry_into", "check_model_matches", "rewrite_folder"]


def check_model_matches(analysis: Analysis, loaded) -> None:
    """Raise `HeadscopeError` unless `loaded` has the analysis's layers and heads."""
    if (loaded.n_layers, loaded.n_heads) != (analysis.n_layers, analysis.n_heads):
        raise HeadscopeError(f"{loaded.name} has {loaded.n_layers} x {loaded.n_heads} heads, the analysis "
                             f"({analysis.meta.get('model', 'model')}) {analysis.n_layers} x {analysis.n_heads}")


def add_geometry(analysis: Analysis, loaded, **options) -> Analysis:
    """The analysis with `headscope.geometry(loaded, **options)` attached (a copy).

    Args:
        analysis: an analysis of `loaded`'s model.
        loaded: the `headscope.Loaded` it was made from.
        **options: passed to `headscope.geometry` (n_examples, seq_len, normalize, seeds, ...).
    Returns:
        A new `Analysis` whose `.geometry` is the `GeometryResult`.
    Raises:
        HeadscopeError: the model's shape differs from the analysis's.
    """
    check_analysis(analysis, "add_geometry")
    check_loaded(loaded, "add_geometry")
    check_model_matches(analysis, loaded)
    return analysis.with_geometry(geometry(loaded, **options))


def write_geometry_into(directory, result: GeometryResult, plotlyjs: str = "embed") -> Analysis:
    """Attach `result` to the analysis saved in `directory` and re-write it with its report.

    Args:
        directory: a folder written by `headscope analyze` (or `Analysis.save`).
        result: a `GeometryResult` of the same model.
        plotlyjs: "embed" or "cdn", for the re-written index.html.
    Returns:
        The analysis with its geometry.
    Raises:
        HeadscopeError: not an analysis folder, or the shapes differ; the folder is then unchanged.
    """
    directory = Path(directory)
    analysis = Analysis.load(directory).with_geometry(result)
    rewrite_folder(directory, analysis, plotlyjs, fresh=(GEOMETRY_FOLDER,))
    return analysis


def rewrite_folder(directory: Path, analysis: Analysis, plotlyjs: str = "embed", fresh: tuple = ()) -> None:
    """Re-write the analysis saved in `directory` as `analysis`, with its report, atomically: the
    new folder is built beside it and renamed into place, keeping the files of the folder that are
    not the analysis's own (those named in `fresh` are left out, to be written afresh).

    Raises:
        HeadscopeError: a file cannot be copied; the folder is then unchanged.
    """
    with atomic_dir(directory, force=True) as tmp:
        for item in directory.iterdir():  # keep what else the folder holds
            if item.name in fresh:
                continue
            try:
                if item.is_dir():
                    shutil.copytree(item, tmp / item.name)
                else:
                    shutil.copy2(item, tmp / item.name)
            except (OSError, shutil.Error) as err:
                raise HeadscopeError(f"cannot copy {item} into the re-written {directory} ({err}); the folder was "
                                     f"left as it was") from None
        analysis.write_into(tmp)
        write_report_into(analysis, tmp, plotlyjs=plotlyjs)

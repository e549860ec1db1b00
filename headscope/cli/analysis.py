"""The commands about analyses: `analyze` (score every head, write the analysis and its report),
`report` (re-render a saved analysis, or list the reports under a folder), `compare` (two
analyses side by side) and `detectors` (the registry, with formulas and sources)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

import headscope  # the public API, re-exported lazily: a command loads only what it runs

from .. import detectors  # lazy too: its registry imports the built-in detectors when first read
from .. import report  # module references, not names: what a test replaces on the module is what runs
from ..analysis.result import Analysis
from ..atomic import atomic_dir
from ..errors import UsageError
from ..loading import distributed, loader
from ..loading.control import CONTROL_KINDS
from ..report import index as report_index
from ..report.data import report_warnings, top_heads
from ..report.method import control_text
from ..report.detector_sections import section_data, section_summary
from .shared import (
    DeviceOpt, DtypeOpt, ForceOpt, ModelArg, NoCacheOpt, OpenOpt, PlotlyOpt, SeedOpt, UnverifiedOpt, Bars,
    check_plotlyjs, default_out, detector_names, friendly, index_above,
)

__all__ = ["analyze_command", "report_command", "compare_command", "detectors_command"]

DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's named placements


def _summary(analysis, out: Path) -> None:
    """One line per label: head count, the quantity its scores are in, the strongest heads
    (layer.head score, and the control's score for the same head; induction and duplicate-token
    heads with their OV qualifier), as the report's top-heads table, then the lines the detectors'
    own report sections add (`ReportSection.summary`) and the warnings."""
    counts = analysis.labels.label.value_counts()
    sites = analysis.meta.get("sites") or {}
    where = f" at its {sites['group']} sites ({sites.get('kind', '?')})" if sites.get("group") else ""
    typer.echo(f"\n{analysis.meta['model']}{where}: {analysis.n_layers} layers x {analysis.n_heads} heads")
    typer.echo(f"control: {control_text(analysis.meta)}")
    strongest: dict = {}
    for t in top_heads(analysis, k=3):
        strongest.setdefault(t.label, []).append(t)
    for label, heads in strongest.items():
        per_head = label == "mixed" or len({t.quantity for t in heads}) > 1
        unit = "clearest detector's score" if per_head else heads[0].quantity
        shown = ", ".join(f"{t.layer}.{t.head} {t.text(per_head)}{t.ov_text()}" for t in heads)
        typer.echo(f"  {label:<18} {counts[label]:>4}  {unit}: {shown}")
    if "none" in counts:
        typer.echo(f"  {'none':<18} {counts['none']:>4}")
    for line in section_summary(section_data(analysis)):  # what the detectors' own sections add
        typer.echo(line)
    for warning in report_warnings(analysis.meta):
        typer.echo(f"warning: {warning}")
    typer.echo(f"report: {out / 'index.html'}")


@friendly
def analyze_command(
    model: ModelArg = "smollm2-135m",
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder (default reports/MODEL).")] = None,
    detectors: Annotated[Optional[str], typer.Option("--detectors", help="Comma-separated detector names (default: all that apply); your own as mypkg.module:name.")] = None,
    n_examples: Annotated[int, typer.Option("--n-examples", help="Probe examples per probe.")] = 16,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per natural-text example.")] = 128,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Examples per forward pass (a treebank example: 4 sentences).")] = 8,
    repeat_len: Annotated[int, typer.Option("--repeat-len", help="Random tokens per repeat in the induction probe.")] = 25,
    repeats: Annotated[int, typer.Option("--repeats", help="Repeats in the induction probe.")] = 4,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    seed: SeedOpt = 0,
    treebank: Annotated[Optional[Path], typer.Option("--treebank", help="CoNLL-U file for the syntactic detector (default: the bundled treebank).")] = None,
    n_sentences: Annotated[int, typer.Option("--n-sentences", help="Treebank sentences scored by the syntactic detector (0, the default: all).")] = 0,
    needle_lengths: Annotated[str, typer.Option("--needle-lengths", help="Prompt lengths in tokens of the needle probe that --detectors retrieval reads, comma-separated (those above the model's context are dropped).")] = "2048,4096,8192",
    validate: Annotated[bool, typer.Option("--validate", help="Also ablate each label's top-3 heads against random heads (slow: several forward passes per label).")] = False,
    control: Annotated[str, typer.Option("--control", help="random-init: score the same probes on an untrained twin and give learned labels only to heads that beat its best head; none: no control (labels then rest on thresholds alone).")] = "random-init",
    device_map: Annotated[Optional[str], typer.Option("--device-map", help="Split a large model over devices: auto, balanced, sequential or a JSON {module: device} map (accelerate).")] = None,
    geometry: Annotated[bool, typer.Option("--geometry", help="Also add head geometry to the report: pattern-similarity map, subspace overlap, importance and pruning curve (docs/geometry.md; minutes on CPU for SmolLM2).")] = False,
    sites: Annotated[Optional[str], typer.Option("--sites", help="Group of attention sites to analyse: decoder.self or decoder.cross for an encoder-decoder (default: its encoder; headscope models --families lists each family's groups).")] = None,
    no_cache: NoCacheOpt = False,
    plotlyjs: PlotlyOpt = "embed",
    force: ForceOpt = False,
    open_report: OpenOpt = False,
) -> None:
    """Score every head of MODEL, write the analysis and an interactive HTML report.

    Under `torchrun --nproc-per-node N -m headscope analyze ...` the probe batches are split
    across the N processes; rank 0 alone writes, and the result equals a single-process run.
    """
    check_plotlyjs(plotlyjs)
    if control not in CONTROL_KINDS:
        raise UsageError(f"--control must be one of {', '.join(CONTROL_KINDS)}, got {control!r}")
    if sites is not None and geometry:
        raise UsageError("--geometry works on the default sites only; leave out --sites or --geometry")
    out = out or default_out(model)
    names = detector_names(detectors)
    from ..probes.kinds import command_line_probes  # torch: only when analysing

    # A bad option or treebank file fails here, before the model loads (the file is read once).
    probes = command_line_probes(n_examples, seq_len, repeat_len, repeats, needle_lengths, treebank, n_sentences)
    rank, _ = distributed.init_from_env(device)
    inputs = [path for path in (model, treebank) if path is not None and Path(path).exists()]
    guard = atomic_dir(out, force=force, protect=inputs)  # refuses a bad or existing folder before any work
    if rank == 0:
        typer.echo(f"loading {model} ...", err=True)
    placement = _parse_device_map(device_map)
    loaded = loader.load(model, device=device if placement else distributed.process_device(device), dtype=dtype, device_map=placement,
                  cache=not no_cache)
    analysis = headscope.analyze(loaded, names, probes, batch_size=batch_size, seed=seed, validate=validate,
                       progress=Bars(), control=control, sites=sites)
    if rank != 0:
        return
    if geometry:  # rank 0 only: one process computes it
        analysis = headscope.add_geometry(analysis, loaded, seq_len=seq_len)
    with guard as tmp:
        analysis.write_into(tmp)
        report.write_report_into(analysis, tmp, plotlyjs=plotlyjs)
    _summary(analysis, out)
    index_above(out)
    if open_report:
        import webbrowser

        webbrowser.open((out / "index.html").resolve().as_uri())


def _parse_device_map(value: Optional[str]):
    """`--device-map` as accelerate takes it: a named placement or a {module: device} map."""
    if value is None or value in DEVICE_MAPS:
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise UsageError(f"--device-map must be auto, balanced, sequential or a JSON object, got {value!r}")
    return parsed


@friendly
def report_command(
    directory: Annotated[Optional[Path], typer.Argument(help="A folder written by `headscope analyze`.")] = None,
    index: Annotated[Optional[Path], typer.Option("--index", help="Write INDEX/index.html listing every analysis (saved ones without a page too, with their tables and the command that renders it), comparison, circuit, timeline and KV evaluation under the folder INDEX, each page linking back.")] = None,
    plotlyjs: PlotlyOpt = "embed",
    open_report: OpenOpt = False,
    unverified: UnverifiedOpt = False,
) -> None:
    """Re-render DIR/index.html from a saved analysis (no model needed), or list the reports under a folder (--index)."""
    if directory is None and index is None:
        raise typer.BadParameter("give an analysis folder DIR, or --index FOLDER", param_hint="DIR")
    if directory is None:
        path = report_index.write_index(index)
        typer.echo(f"index: {path}")
        if open_report:
            import webbrowser

            webbrowser.open(path.resolve().as_uri())
        return
    path = report.rewrite_report(Analysis.load(directory, unverified=unverified), directory,
                                 plotlyjs=check_plotlyjs(plotlyjs))
    typer.echo(f"report: {path}")
    if index is not None:
        typer.echo(f"index: {report_index.write_index(index)}")
    else:
        index_above(Path(directory))
    if open_report:
        import webbrowser

        webbrowser.open(path.resolve().as_uri())


@friendly
def compare_command(
    first: Annotated[Path, typer.Argument(help="First analysis folder.")],
    second: Annotated[Path, typer.Argument(help="Second analysis folder.")],
    out: Annotated[Path, typer.Option("--out", help="Output folder for the comparison page.")] = Path("reports/compare"),
    plotlyjs: PlotlyOpt = "embed",
    force: ForceOpt = False,
    unverified: UnverifiedOpt = False,
) -> None:
    """Two analyses side by side: label maps, score differences, heads that changed label."""
    a, b = Analysis.load(first, unverified=unverified), Analysis.load(second, unverified=unverified)
    path = report.write_compare(a, b, out, plotlyjs=check_plotlyjs(plotlyjs), force=force, protect=(first, second))
    typer.echo(f"comparison: {path}")
    index_above(path.parent)


@friendly
def detectors_command(
    extra: Annotated[Optional[str], typer.Option("--detectors", help="Also import your own: mypkg.module:name, comma-separated.")] = None,
) -> None:
    """List the detectors with their formula, threshold and source."""
    detector_names(extra)
    for det in detectors.REGISTRY.values():
        typer.echo(f"{det.name:<16} threshold {det.threshold:<5} probe {det.probe:<9} {det.formula}")
        typer.echo(f"{'':<16} source: {det.source}")
        typer.echo(f"{'':<16} sites: {', '.join(det.applies_to)}")
        if det.opt_in:
            typer.echo(f"{'':<16} opt-in: runs only when named (--detectors {det.name})")

"""The `headscope` command line: thin commands over the library.

Commands: `analyze [MODEL]`, `attribute MODEL --task ioi`, `circuit MODEL --task ioi`, `report DIR` or
`report --index FOLDER`, `compare A B`, `models`, `detectors`, `verify MODEL`,
`cache [--clear]`, `geometry MODEL --out DIR` or `--into ANALYSIS_DIR`, `timeline SOURCE... --out DIR`,
`kv-policy DIR --out FILE`, `kv-eval MODEL POLICY --out DIR`.
Bad input ends with one line on stderr and exit code 1, never a traceback (a fault no check
foresaw too: `error: unexpected ...`, the traceback with HEADSCOPE_TRACEBACK=1); a usage error
(a typo'd option in `main`, a value out of range: `UsageError`) is one line and exit code 2;
a `HeadscopeWarning` is one `warning:` line; Ctrl-C ends with exit code 130 and leaves no
half-written output. Every command that writes follows one rule (`headscope.atomic`,
docs/reliability.md).
"""
from __future__ import annotations

import functools
import os
import sys
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer

import headscope  # the public API, re-exported lazily: a command loads only what it runs

from . import circuits  # lazy: its modules load torch only when a command uses them
from . import detectors  # lazy too: its registry imports the built-in detectors when first read
from .loading import distributed
from .analysis.result import Analysis
from .atomic import atomic_dir
from .errors import HeadscopeError, HeadscopeWarning, UsageError
from .checks import check_count
from .hf.adapters import config_value
from .hf.families import family_table
from . import kv
from .kv.policy import check_keep
from .loading.control import CONTROL_KINDS
from .loading.load_cache import cache_usage, clear_cache
from .loading import loader
from .report import index as report_index
from . import report  # module references, not names: what a test replaces on the module is what runs
from .report.data import report_warnings, top_heads
from .report.method import control_text
from .report.sections import section_data, section_summary

__all__ = ["app", "main"]

app = typer.Typer(
    help="headscope: find out what each attention head of a transformer does.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

ModelArg = Annotated[str, typer.Argument(help="Alias (see `headscope models`), model folder, .gguf file or hub id.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or mps.")]
DtypeOpt = Annotated[Optional[str], typer.Option("--dtype", help="float32, bfloat16 or float16 (default: as stored).")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Convert a GGUF file again instead of using the load cache (see `headscope cache`).")]
TaskOpt = Annotated[str, typer.Option("--task", help="ioi, induction, induction-keys, greater-than, or a JSONL file of prompt pairs (fields clean, corrupted, answer, wrong).")]

VERIFY_TEXT = (
    "The committee met on Tuesday to discuss the budget, and the chair asked everyone to be brief.",
    "Rivers carry sediment to the sea.",
)


def _where() -> str:
    """"rank N: " inside a torchrun process group, else nothing."""
    rank, size = distributed.rank_and_size()
    if size == 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        rank, size = int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"])
    return f"rank {rank}: " if size > 1 else ""


def _friendly(fn):
    """Turn headscope's errors into one line on stderr and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import signal

        def terminated(signum, frame):  # torchrun stops the others when one process fails
            raise KeyboardInterrupt

        # The entry point's handler (atomic.exit_on_interrupt) already cleans up and exits 143;
        # only a command called without it (CliRunner, an embedding program) gets this one.
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, terminated)
        try:
            with warnings.catch_warnings():
                _warnings_as_lines()
                return fn(*args, **kwargs)
        except UsageError as err:
            _Bars.close_all()
            typer.echo(f"error: {_where()}{err}", err=True)
            raise typer.Exit(2)
        except HeadscopeError as err:
            _Bars.close_all()
            typer.echo(f"error: {_where()}{err}", err=True)
            raise typer.Exit(1)
        except KeyboardInterrupt:
            typer.echo(f"{_where()}interrupted; nothing was written", err=True)
            raise typer.Exit(130)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except Exception as err:  # a fault headscope did not foresee: still one line, the traceback on request
            if os.environ.get("HEADSCOPE_TRACEBACK"):
                raise
            message = (str(err).strip().splitlines() or [""])[0][:300]
            typer.echo(f"error: {_where()}unexpected {type(err).__name__}: {message} (a bug or an unchecked input: "
                       f"please report it; HEADSCOPE_TRACEBACK=1 shows the traceback)", err=True)
            raise typer.Exit(1)
        finally:
            signal.signal(signal.SIGTERM, previous)

    return wrapper


def _warnings_as_lines() -> None:
    """Inside `warnings.catch_warnings()`: each HeadscopeWarning is one `warning:` line on stderr."""
    shown = warnings.showwarning

    def show(message, category, *args, **kwargs):
        if issubclass(category, HeadscopeWarning):
            typer.echo(f"warning: {_where()}{message}", err=True)
        else:
            shown(message, category, *args, **kwargs)

    warnings.simplefilter("always", HeadscopeWarning)
    warnings.showwarning = show


@app.command("models")
@_friendly
def models_command(
    families: Annotated[bool, typer.Option("--families", help="List model families and what works on each.")] = False,
) -> None:
    """List the bundled model aliases and how to install a missing one (or, with --families, the families)."""
    if families:
        typer.echo(f"{'family':<14} {'capture':<8} {'verify':<7} {'analyze':<8} {'sites':<36} notes")
        for row in family_table():
            yes = {True: "yes", False: "no"}
            typer.echo(f"{row.model_type:<14} {yes[row.capture]:<8} {yes[row.verify]:<7} {row.analyze_sites or yes[row.analyze]:<8} "
                       f"{row.sites or '-':<36} {row.notes}")
        return
    for entry in loader.models():
        state = "installed" if entry["installed"] else f"missing: {entry['install']}"
        typer.echo(f"{entry['name']:<14} {state:<12} {entry['description']}")


@app.command("verify")
@_friendly
def verify_command(
    model: ModelArg = "smollm2-135m",
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    tolerance: Annotated[Optional[float], typer.Option(help="Largest allowed difference (default by dtype).")] = None,
    no_cache: NoCacheOpt = False,
    sites: Annotated[Optional[str], typer.Option("--sites", help="Group of attention sites to compare: decoder.self or decoder.cross for an encoder-decoder (default: its encoder; headscope models --families lists each family's groups).")] = None,
) -> None:
    """Run headscope's attention beside the model's own on every layer; exit 1 past the tolerance.

    An encoder-decoder's decoder reads the texts teacher-forced (its start token, then the texts
    shifted right by one)."""
    if tolerance is not None and not 0 < tolerance < float("inf"):
        raise UsageError(f"--tolerance must be a positive number such as 1e-4, got {tolerance}")
    import torch

    from .hf.verify import DEFAULT_TOLERANCE, teacher_forced, verify  # torch and transformers: only when verifying

    loaded = loader.load(model, device=device, dtype=dtype, cache=not no_cache)
    tok = loaded.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    context = loaded.context_length  # a short-context model verifies on the texts' first tokens
    batch = tok(list(VERIFY_TEXT), return_tensors="pt", padding=True, truncation=context is not None,
                max_length=context).to(loaded.device)
    table = verify(loaded.model, teacher_forced(loaded.model, batch), sites=sites)
    limit = tolerance if tolerance is not None else DEFAULT_TOLERANCE.get(loaded.model.dtype, 1e-4)
    typer.echo(table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    worst = table[["max_abs_diff_output", "max_abs_diff_pattern"]].to_numpy().max()
    if not worst <= limit:
        typer.echo(f"FAIL: largest difference {worst:.3g} exceeds tolerance {limit:g}", err=True)
        raise typer.Exit(1)
    where = f" of the {sites} sites" if sites else ""
    typer.echo(f"OK: all {len(table)} layers{where} within {limit:g}")


PlotlyOpt = Annotated[str, typer.Option("--plotlyjs", help="embed (works offline) or cdn (small file).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing output folder.")]
OpenOpt = Annotated[bool, typer.Option("--open", help="Open the report in a browser when done.")]
UnverifiedOpt = Annotated[bool, typer.Option("--unverified", help="Read an analysis folder whose manifest.json is missing or no longer matches, with a warning (its tables are still checked; docs/reliability.md).")]


def _check_plotlyjs(value: str) -> str:
    if value not in ("embed", "cdn"):
        raise UsageError(f"--plotlyjs must be embed or cdn, got {value!r}")
    return value


def _default_out(model: str) -> Path:
    import re

    path = Path(model.rstrip("/"))
    if path.exists():  # a local folder or file: its real name (`./m/sub/..` is `m`, `.` the working folder's)
        path = path.resolve()
    stem = path.stem if model.endswith(".gguf") else path.name
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip(".")
    return Path("reports") / (stem or "model")


class _Bars:
    """tqdm bars on stderr, one per stage, fed by analyze's progress callback. A command that
    fails closes the bars still open (`close_all`), so its error line starts a line of its own."""

    open: set = set()

    def __init__(self):
        self.bars = {}

    @classmethod
    def close_all(cls) -> None:
        for bars in list(cls.open):
            for bar in bars.bars.values():
                bar.close()
            bars.bars.clear()
        cls.open.clear()

    def __call__(self, stage: str, done: int, total: int) -> None:
        from tqdm.auto import tqdm

        bar = self.bars.get(stage)
        if bar is None:
            bar = self.bars[stage] = tqdm(total=total, desc=stage, unit="batch", file=sys.stderr, leave=True)
            _Bars.open.add(self)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()
            del self.bars[stage]
            if not self.bars:
                _Bars.open.discard(self)


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


@app.command("analyze")
@_friendly
def analyze_command(
    model: ModelArg = "smollm2-135m",
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder (default reports/MODEL).")] = None,
    detectors: Annotated[Optional[str], typer.Option("--detectors", help="Comma-separated detector names (default: all that apply); your own as mypkg.module:name.")] = None,
    n_examples: Annotated[int, typer.Option("--n-examples", help="Probe examples per probe.")] = 16,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per natural-text example.")] = 128,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Examples per forward pass.")] = 8,
    repeat_len: Annotated[int, typer.Option("--repeat-len", help="Random tokens per repeat in the induction probe.")] = 25,
    repeats: Annotated[int, typer.Option("--repeats", help="Repeats in the induction probe.")] = 4,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**63 - 1, help="Seed for probes and bootstrap.")] = 0,
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
    _check_plotlyjs(plotlyjs)
    if control not in CONTROL_KINDS:
        raise UsageError(f"--control must be one of {', '.join(CONTROL_KINDS)}, got {control!r}")
    if sites is not None and geometry:
        raise UsageError("--geometry works on the default sites only; leave out --sites or --geometry")
    out = out or _default_out(model)
    names = _detector_names(detectors)
    from .probes.kinds import command_line_probes  # torch: only when analysing

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
                       progress=_Bars(), control=control, sites=sites)
    if rank != 0:
        return
    if geometry:  # rank 0 only: one process computes it
        analysis = headscope.add_geometry(analysis, loaded, seq_len=seq_len)
    with guard as tmp:
        analysis.write_into(tmp)
        report.write_report_into(analysis, tmp, plotlyjs=plotlyjs)
    _summary(analysis, out)
    _index_above(out)
    if open_report:
        import webbrowser

        webbrowser.open((out / "index.html").resolve().as_uri())


def _detector_names(value: Optional[str]) -> Optional[list[str]]:
    """Names from `--detectors` ("induction,mypkg.module:name"), each resolved (imported) now."""
    if not value:
        return None
    return [detectors.resolve(spec.strip()).name for spec in value.split(",") if spec.strip()]


def _parse_device_map(value: Optional[str]):
    import json

    if value is None or value in ("auto", "balanced", "balanced_low_0", "sequential"):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise UsageError(f"--device-map must be auto, balanced, sequential or a JSON object, got {value!r}")
    return parsed


def _index_above(folder: Path) -> None:
    """Re-write the list of reports above a folder just written, where there is one (reports/)."""
    try:
        written = report_index.update_index_of(folder)
    except HeadscopeError as err:  # the folder itself is written: say why the list is not
        typer.echo(f"warning: the list of reports was not updated: {err}", err=True)
        return
    if written is not None:
        typer.echo(f"index: {folder.parent / written.name}")


@app.command("report")
@_friendly
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
                                 plotlyjs=_check_plotlyjs(plotlyjs))
    typer.echo(f"report: {path}")
    if index is not None:
        typer.echo(f"index: {report_index.write_index(index)}")
    else:
        _index_above(Path(directory))
    if open_report:
        import webbrowser

        webbrowser.open(path.resolve().as_uri())


@app.command("compare")
@_friendly
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
    path = report.write_compare(a, b, out, plotlyjs=_check_plotlyjs(plotlyjs), force=force, protect=(first, second))
    typer.echo(f"comparison: {path}")
    _index_above(path.parent)


@app.command("detectors")
@_friendly
def detectors_command(
    extra: Annotated[Optional[str], typer.Option("--detectors", help="Also import your own: mypkg.module:name, comma-separated.")] = None,
) -> None:
    """List the detectors with their formula, threshold and source."""
    _detector_names(extra)
    for det in detectors.REGISTRY.values():
        typer.echo(f"{det.name:<16} threshold {det.threshold:<5} probe {det.probe:<9} {det.formula}")
        typer.echo(f"{'':<16} source: {det.source}")
        typer.echo(f"{'':<16} sites: {', '.join(det.applies_to)}")
        if det.opt_in:
            typer.echo(f"{'':<16} opt-in: runs only when named (--detectors {det.name})")


@app.command("geometry")
@_friendly
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
    from .analysis.attach_geometry import check_model_matches, write_geometry_into  # torch: only when run
    from .head_geometry.run import write_geometry

    _check_plotlyjs(plotlyjs)
    if examples < 1 or seq_len < 2 or steps < 1:
        raise UsageError(f"--examples and --steps must be at least 1 and --seq-len at least 2 "
                             f"(got {examples}, {steps}, {seq_len})")
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
            written = write_geometry(result, tmp)
        for path in written:
            typer.echo(str(guard.target / path.relative_to(tmp)))
    if into is not None:
        write_geometry_into(into, result, plotlyjs=plotlyjs)
        typer.echo(f"report: {into / 'index.html'}")
    typer.echo(f"{int(result.pairs.redundant.sum())} redundant pairs, {result.heads.cluster.nunique()} clusters")


@app.command("timeline")
@_friendly
def timeline_command(
    sources: Annotated[list[str], typer.Argument(help="A Trainer output folder (its checkpoint-* folders), model folders, or hub revisions org/name@revision (read from the cache, offline).")],
    out: Annotated[Path, typer.Option("--out", help="The timeline folder to write (timeline.csv and index.html).")],
    detectors: Annotated[Optional[str], typer.Option("--detectors", help="Comma-separated detector names (default: previous_token, induction, duplicate_token, sink, uniform).")] = None,
    device: DeviceOpt = "auto",
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**63 - 1, help="Seed for probes and bootstrap.")] = 0,
    plotlyjs: PlotlyOpt = "embed",
    force: ForceOpt = False,
) -> None:
    """Score the heads of every checkpoint of a training run: timeline.csv and an HTML report.

    The control is the step-0 model when the series has one, else the random-init twin.
    """
    _check_plotlyjs(plotlyjs)
    names = _detector_names(detectors)
    from .training.checkpoints import write_series  # torch and transformers: only when run

    guard = atomic_dir(out, force=force, protect=[Path(s) for s in sources if Path(s).exists()])
    bars = _Bars()
    write_series(sources, guard, detectors=names, device=loader.resolve_device(device), seed=seed, plotlyjs=plotlyjs,
                 progress=lambda done, total: bars("checkpoints", done, total))
    _index_above(out)
FORMATS = ("duo", "headkv")


def _numbers(value: str, kind, option: str) -> list:
    """A comma-separated option as numbers; HeadscopeError naming the option otherwise."""
    try:
        return [kind(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{option} takes comma-separated numbers, got {value!r}") from None


@app.command("kv-policy")
@_friendly
def kv_policy_command(
    directory: Annotated[Path, typer.Argument(help="A folder written by `headscope analyze` (with the ranking's detectors).")],
    out: Annotated[Path, typer.Option("--out", help="duo: a folder for full_attention_heads.tsv and config.json; headkv: a .json file.")],
    keep: Annotated[float, typer.Option("--keep", help="Fraction of key/value heads that keep the full cache, in (0, 1].")] = 0.25,
    format: Annotated[str, typer.Option("--format", help="duo (DuoAttention, kvpress) or headkv (HeadKV / Wu et al. JSON).")] = "duo",
    rank_by: Annotated[str, typer.Option("--rank-by", help="retrieval, or razor (max of induction and duplicate_token).")] = "retrieval",
    sink: Annotated[Optional[int], typer.Option("--sink", help="First keys a streaming head keeps (default 128 from 1B parameters, else 16).")] = None,
    recent: Annotated[Optional[int], typer.Option("--recent", help="Last keys a streaming head keeps (default 256 from 1B parameters, else 64).")] = None,
    force: ForceOpt = False,
    unverified: UnverifiedOpt = False,
) -> None:
    """Rank key/value heads from an analysis and write a KV-cache policy (docs/kv_cache.md)."""
    if format not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, got {format!r}")
    policy = kv.kv_policy(Analysis.load(directory, unverified=unverified), keep=keep, rank_by=rank_by, sink=sink,
                          recent=recent)
    write = kv.write_duo if format == "duo" else kv.write_headkv
    write(policy, out, force=force, protect=[directory])
    typer.echo(f"{policy!r} -> {out}")


@app.command("kv-eval")
@_friendly
def kv_eval_command(
    model: ModelArg,
    policy_path: Annotated[Path, typer.Argument(metavar="POLICY", help="A DuoAttention folder or a HeadKV .json file (from `headscope kv-policy`).")],
    out: Annotated[Path, typer.Option("--out", help="Output folder: results.csv, summary.csv, index.html.")] = Path("reports/kv"),
    keep: Annotated[Optional[float], typer.Option("--keep", help="The policy's own keep fraction (needed for a HeadKV file).")] = None,
    lengths: Annotated[str, typer.Option("--lengths", help="Needle prompt lengths in tokens, comma-separated.")] = "4096,8192",
    depths: Annotated[str, typer.Option("--depths", help="Needle depths (shares of the haystack), comma-separated.")] = "0.5",
    needles: Annotated[int, typer.Option("--needles", help="Held-out needles per length and depth.")] = 1,
    keeps: Annotated[str, typer.Option("--keeps", help="Keep fractions compared, comma-separated.")] = "0.1,0.25,0.5",
    random_draws: Annotated[int, typer.Option("--random", help="Random draws of key/value heads per keep fraction.")] = 5,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**63 - 1, help="Needle prompts and random draws.")] = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    no_cache: NoCacheOpt = False,
    plotlyjs: PlotlyOpt = "embed",
    force: ForceOpt = False,
) -> None:
    """Measure a KV-cache policy on MODEL: needle accuracy, loss and KV bytes vs random, reverse, streaming, full."""
    _check_plotlyjs(plotlyjs)
    numbers = (_numbers(lengths, int, "--lengths"), _numbers(depths, float, "--depths"), _numbers(keeps, float, "--keeps"))
    for value in numbers[2] + ([keep] if keep is not None else []):  # usage errors before the model loads
        check_keep(value)
    check_count("--random", random_draws)
    check_count("--needles", needles)
    inputs = [path for path in (Path(model), policy_path) if path.exists()]
    guard = atomic_dir(out, force=force, protect=inputs)  # refuses a bad or existing folder before any work
    policy = kv.read_policy(policy_path, keep=keep)  # every field checked before the model loads
    typer.echo(f"loading {model} ...", err=True)
    loaded = loader.load(model, device=device, dtype=dtype, cache=not no_cache)
    if policy_path.is_file():  # a HeadKV file holds query heads: grouped by the model's key/value heads
        n_kv = config_value(loaded.model.config, "num_key_value_heads") or loaded.n_heads
        policy = kv.read_headkv(policy_path, keep, n_kv_heads=n_kv)
    evaluation = headscope.kv_evaluate(loaded, policy, lengths=numbers[0], depths=numbers[1], n_needles=needles,
                                       keeps=numbers[2], n_random=random_draws, seed=seed, progress=_Bars())
    with guard as tmp:
        evaluation.write_into(tmp, plotlyjs=plotlyjs)
    typer.echo(evaluation.summary().T.to_string(header=False))
    typer.echo(f"report: {out / 'index.html'}")
    _index_above(out)


def _task_run(model, task, out, suffix, analysis_dir, force, n, seed, metric, device, dtype, no_cache):
    """What `attribute` and `circuit` do before their work: the task's name and metric checked, the
    analysis read, the output folder (default reports/MODEL-TASK + suffix) guarded, all before any
    work; then the model loaded, the analysis checked against it and the task built (its prompts
    against the model's positions)."""
    circuits.resolve_task(task, metric, quiet=True)  # a typo'd --task or --metric before the model loads
    analysis = Analysis.load(analysis_dir) if analysis_dir is not None else None
    task_path = Path(task)
    stem = _default_out(model).name
    out = out or _default_out(model).with_name(f"{stem}-{task_path.stem if task_path.suffix else task}{suffix}")
    inputs = [path for path in (Path(model), task_path, analysis_dir) if path is not None and path.exists()]
    guard = atomic_dir(out, force=force, protect=inputs)  # refuses a bad or existing folder before any work
    typer.echo(f"loading {model} ...", err=True)
    loaded = loader.load(model, device=device, dtype=dtype, cache=not no_cache)
    if analysis is not None:
        _check_analysis_fits(analysis, analysis_dir, loaded)
    built = headscope.task(task, loaded, n=n, seed=seed, **({"metric": metric} if metric else {}))
    return (analysis.labels if analysis is not None else None), out, guard, loaded, built


def _check_analysis_fits(analysis, folder, loaded) -> None:
    """HeadscopeError unless `--analysis` is of a model like `loaded`: its family, layers and heads
    (its labels are drawn on this model's heads)."""
    meta = analysis.meta
    theirs = (meta.get("family"), analysis.n_layers, analysis.n_heads)
    mine = (loaded.family, loaded.n_layers, loaded.n_heads)
    if (theirs[0] is not None and theirs[0] != mine[0]) or theirs[1:] != mine[1:]:
        raise HeadscopeError(f"--analysis {folder} is of {meta.get('model', '?')} ({theirs[0] or '?'}, {theirs[1]} "
                             f"layers x {theirs[2]} heads), not of a model like {loaded.name} ({mine[0]}, {mine[1]} "
                             f"layers x {mine[2]} heads); give an analysis of this model")


@app.command("attribute")
@_friendly
def attribute_command(
    model: ModelArg = "smollm2-135m",
    task: TaskOpt = "ioi",
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder (default: MODEL-TASK under reports/).")] = None,
    n: Annotated[int, typer.Option("--n", min=1, help="Prompt pairs (a built-in task's; a file's first N).")] = 64,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**63 - 1, help="Seed of the built-in task's prompts and the bootstrap.")] = 0,
    metric: Annotated[Optional[str], typer.Option("--metric", help="logit_diff, prob, prob_diff or kl (default: the task's).")] = None,
    methods: Annotated[str, typer.Option("--methods", help="Attribution methods, comma-separated: atp, atp*.")] = "atp,atp*",
    exact: Annotated[bool, typer.Option("--exact", help="Also patch every head exactly (one forward pass of every prompt per head).")] = False,
    point: Annotated[str, typer.Option("--point", help="What is patched: z, q, k, v or pattern.")] = "z",
    direction: Annotated[str, typer.Option("--direction", help="denoising (clean into corrupted) or noising.")] = "denoising",
    analysis_dir: Annotated[Optional[Path], typer.Option("--analysis", help="An analysis folder of the same model: its labels are shown beside the heads.")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Prompts per forward pass.")] = 16,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    no_cache: NoCacheOpt = False,
    plotlyjs: PlotlyOpt = "embed",
    force: ForceOpt = False,
) -> None:
    """Which heads a task needs on MODEL: direct logit attribution, attribution patching (AtP, AtP*) and exact patching."""
    _check_plotlyjs(plotlyjs)
    chosen = [m.strip() for m in methods.split(",") if m.strip()]
    if not chosen or any(m not in ("atp", "atp*") for m in chosen):
        raise UsageError(f"--methods takes atp and atp* (comma-separated; --exact adds exact patching), got {methods!r}")
    if point not in circuits.POINTS:
        raise UsageError(f"--point must be one of {', '.join(circuits.POINTS)}, got {point!r}")
    if direction not in ("denoising", "noising"):
        raise UsageError(f"--direction must be denoising or noising, got {direction!r}")
    labels, out, guard, loaded, built = _task_run(model, task, out, "", analysis_dir, force, n, seed, metric,
                                                  device, dtype, no_cache)
    run = circuits.run_attribution(loaded, built, chosen, exact=exact, point=point, direction=direction,
                                             labels=labels, batch_size=batch_size, progress=_Bars())
    with guard as tmp:
        run.write_into(tmp, plotlyjs=plotlyjs)
    main = next(m for m in ("exact", "atp*", "atp") if m in run.tables)
    top = run.tables[main].sort_values("magnitude", ascending=False).head(5)
    typer.echo(f"{built.name}: {built.n} prompt pairs, {built.metric} clean {run.tables[main].attrs['clean_metric']:.3f}, "
               f"corrupted {run.tables[main].attrs['corrupted_metric']:.3f}")
    typer.echo(f"top heads ({main}, hook_{point}): " + ", ".join(f"{int(r.layer)}.{int(r.head)} {r.effect:+.3f}"
                                                                for r in top.itertuples()))
    typer.echo(f"report: {out / 'index.html'}")


@app.command("circuit")
@_friendly
def circuit_command(
    model: ModelArg = "smollm2-135m",
    task: TaskOpt = "ioi",
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder (default: MODEL-TASK-circuit under reports/).")] = None,
    method: Annotated[str, typer.Option("--method", help="eap (one gradient on the clean run) or eap-ig (integrated gradients, more faithful).")] = "eap-ig",
    steps: Annotated[int, typer.Option("--steps", help="EAP-IG's integration steps (forward/backward pairs per batch; ignored by eap).")] = 5,
    riemann: Annotated[str, typer.Option("--riemann", help="EAP-IG's points: left (k = 0..S-1, from the corrupted run, as the EAP-IG code and MIB) or right (k = 1..S, ending at the clean run).")] = "left",
    n: Annotated[int, typer.Option("--n", min=1, help="Prompt pairs (a built-in task's; a file's first N).")] = 32,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**63 - 1, help="Seed of the built-in task's prompts and the random circuits.")] = 0,
    metric: Annotated[Optional[str], typer.Option("--metric", help="logit_diff, prob, prob_diff or kl (default: the task's).")] = None,
    evaluate: Annotated[bool, typer.Option("--evaluate/--no-evaluate", help="Measure faithfulness by running the model with only the top edges clean, at each size, against random circuits.")] = True,
    sizes: Annotated[Optional[str], typer.Option("--sizes", help="Circuit sizes evaluated, in % of the edges, comma-separated (default: MIB's 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50 and 100).")] = None,
    random_draws: Annotated[int, typer.Option("--random", help="Random circuits drawn per size as the baseline.")] = 5,
    top: Annotated[int, typer.Option("--top", help="Edges drawn in the page's graph (largest |score| first).")] = 300,
    analysis_dir: Annotated[Optional[Path], typer.Option("--analysis", help="An analysis folder of the same model: its labels are shown on the heads.")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Prompts per pass.")] = 8,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    no_cache: NoCacheOpt = False,
    plotlyjs: PlotlyOpt = "embed",
    force: ForceOpt = False,
) -> None:
    """Edge-level circuit of a task on MODEL: EAP or EAP-IG scores, faithfulness against random circuits, a page."""
    _check_plotlyjs(plotlyjs)
    if method not in circuits.CIRCUIT_METHODS:
        raise UsageError(f"--method must be {' or '.join(circuits.CIRCUIT_METHODS)}, got {method!r}")
    if riemann not in circuits.RIEMANN:
        raise UsageError(f"--riemann must be {' or '.join(circuits.RIEMANN)}, got {riemann!r}")
    check_count("--steps", steps, most=circuits.MAX_STEPS)
    check_count("--random", random_draws, least=0, most=circuits.MAX_RANDOM)
    check_count("--top", top)
    chosen_sizes = circuits.check_sizes(_numbers(sizes, float, "--sizes")) if sizes is not None else circuits.MIB_SIZES
    labels, out, guard, loaded, built = _task_run(model, task, out, "-circuit", analysis_dir, force, n, seed, metric,
                                                  device, dtype, no_cache)
    typer.echo(f"task: {built.name}, {built.n} prompt pairs, metric {built.metric}")
    bars = _Bars()
    found = headscope.circuit(loaded, built, method=method, steps=steps, batch_size=batch_size, progress=bars,
                              riemann=riemann)
    meta = found.meta
    rule = f" ({steps} steps, {riemann} rule)" if method == "eap-ig" else ""
    typer.echo(f"scored {meta['n_edges']} edges with {method}{rule}: "
               f"{meta['passes']['forward']} forward and {meta['passes']['backward']} backward passes; "
               f"{built.metric} clean {meta['clean_metric']:.3f}, corrupted {meta['corrupted_metric']:.3f}")
    typer.echo("top edges: " + ", ".join(f"{r.src}->{r.dst} {r.score:+.3g}" for r in found.top(5).itertuples()))
    if built.n >= 2:
        found.stability(seed=seed)
        typer.echo(f"stability: {circuits.stability_text(found.meta['stability'])}")
    if evaluate:
        found.evaluate(sizes=chosen_sizes, n_random=random_draws, seed=seed, batch_size=batch_size, progress=bars)
        typer.echo(f"faithfulness: {circuits.faithfulness_text(found.evaluation)}")
    with guard as tmp:
        written = circuits.write_circuit_into(found, tmp, labels=labels, plotlyjs=plotlyjs, n_edges=top)
    typer.echo(f"report: {out / written.name}")
    _index_above(out)


@app.command("cache")
@_friendly
def cache_command(
    clear: Annotated[bool, typer.Option("--clear", help="Remove every entry.")] = False,
) -> None:
    """Where the load cache of converted GGUF models is ($HEADSCOPE_CACHE moves it), and its size."""
    usage = clear_cache() if clear else cache_usage()
    state = "removed" if clear else "held"
    typer.echo(f"{usage.root}: {usage.entries} entries, {usage.bytes / 2**20:.1f} MiB {state}")


def main() -> None:
    """Console-script entry point. A usage error (a typo'd option, a missing argument) is one
    line and exit code 2, instead of the box typer draws (typer's errors derive from its public
    `TyperException`; with `standalone_mode=False` they reach us instead of being drawn)."""
    try:
        code = app(args=sys.argv[1:] or ["--help"], standalone_mode=False)
        if not sys.argv[1:]:
            code = 2  # no command: the help, and the usage-error status typer's no_args_is_help gives
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(1)
    except typer.TyperException as err:
        context = getattr(err, "ctx", None)
        hint = f"; see '{context.command_path} --help'" if context is not None else ""
        typer.echo(f"error: {err.format_message().rstrip('.')}{hint}", err=True)
        sys.exit(getattr(err, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

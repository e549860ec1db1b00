"""The task commands: `attribute` (which heads a task needs: DLA, AtP, AtP*, exact patching) and
`circuit` (the edge-level circuit of a task: EAP or EAP-IG, faithfulness, a page).

Both start the same way (`_start_task`): the task's name and metric checked, the analysis read and
the output folder guarded before any work, then the model loaded and the task built. The options
they share are declared once below."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

import headscope  # the public API, re-exported lazily: a command loads only what it runs

from .. import circuits  # lazy: its modules load torch only when a command uses them
from ..analysis.result import Analysis
from ..atomic import atomic_dir
from ..checks import MAX_SEED, check_count
from ..errors import HeadscopeError, UsageError
from ..loading import loader
from .shared import (
    Bars, DeviceOpt, DtypeOpt, ForceOpt, ModelArg, NoCacheOpt, PlotlyOpt, check_plotlyjs, default_out, friendly,
    index_above, numbers,
)

__all__ = ["attribute_command", "circuit_command", "TaskRun"]

TaskOpt = Annotated[str, typer.Option("--task", help="ioi, induction, induction-keys, greater-than, or a JSONL file of prompt pairs (fields clean, corrupted, answer, wrong).")]
PairsOpt = Annotated[int, typer.Option("--n", min=1, help="Prompt pairs (a built-in task's; a file's first N).")]
MetricOpt = Annotated[Optional[str], typer.Option("--metric", help="logit_diff, prob, prob_diff or kl (default: the task's).")]


def _seed_option(also: str):
    """`--seed`: the built-in task's prompts and what else the command draws."""
    return Annotated[int, typer.Option("--seed", min=0, max=MAX_SEED, help=f"Seed of the built-in task's prompts and {also}.")]


def _analysis_option(where: str):
    """`--analysis`: an analysis of the same model, whose labels the page shows."""
    return Annotated[Optional[Path], typer.Option("--analysis", help=f"An analysis folder of the same model: its labels are shown {where} the heads.")]


AttributeSeedOpt, CircuitSeedOpt = _seed_option("the bootstrap"), _seed_option("the random circuits")
AttributeAnalysisOpt, CircuitAnalysisOpt = _analysis_option("beside"), _analysis_option("on")


@dataclass
class TaskRun:
    """A task command after its common start: the model, the built task, where the output goes
    (`out`, written through `guard`, an `atomic_dir`) and the labels of `--analysis` (or None)."""

    loaded: Any
    task: Any
    out: Path
    guard: Any
    labels: Any = None


def _start_task(model: str, task: str, *, out: Optional[Path], suffix: str, analysis_dir: Optional[Path],
                force: bool, n: int, seed: int, metric: Optional[str], device: str, dtype: Optional[str],
                no_cache: bool) -> TaskRun:
    """What `attribute` and `circuit` do before their work: the task's name and metric checked, the
    analysis read, the output folder (default reports/MODEL-TASK + suffix) guarded, all before any
    work; then the model loaded, the analysis checked against it and the task built (its prompts
    against the model's positions)."""
    circuits.resolve_task(task, metric, quiet=True)  # a typo'd --task or --metric before the model loads
    analysis = Analysis.load(analysis_dir) if analysis_dir is not None else None
    task_path = Path(task)
    stem = default_out(model).name
    out = out or default_out(model).with_name(f"{stem}-{task_path.stem if task_path.suffix else task}{suffix}")
    inputs = [path for path in (Path(model), task_path, analysis_dir) if path is not None and path.exists()]
    guard = atomic_dir(out, force=force, protect=inputs)  # refuses a bad or existing folder before any work
    typer.echo(f"loading {model} ...", err=True)
    loaded = loader.load(model, device=device, dtype=dtype, cache=not no_cache)
    if analysis is not None:
        _check_analysis_fits(analysis, analysis_dir, loaded)
    built = headscope.task(task, loaded, n=n, seed=seed, **({"metric": metric} if metric else {}))
    return TaskRun(loaded, built, out, guard, analysis.labels if analysis is not None else None)


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


@friendly
def attribute_command(
    model: ModelArg = "smollm2-135m",
    task: TaskOpt = "ioi",
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder (default: MODEL-TASK under reports/).")] = None,
    n: PairsOpt = 64,
    seed: AttributeSeedOpt = 0,
    metric: MetricOpt = None,
    methods: Annotated[str, typer.Option("--methods", help="Attribution methods, comma-separated: atp, atp*.")] = "atp,atp*",
    exact: Annotated[bool, typer.Option("--exact", help="Also patch every head exactly (one forward pass of every prompt per head).")] = False,
    point: Annotated[str, typer.Option("--point", help="What is patched: z, q, k, v or pattern.")] = "z",
    direction: Annotated[str, typer.Option("--direction", help="denoising (clean into corrupted) or noising.")] = "denoising",
    analysis_dir: AttributeAnalysisOpt = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Prompts per forward pass.")] = 16,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    no_cache: NoCacheOpt = False,
    plotlyjs: PlotlyOpt = "embed",
    force: ForceOpt = False,
) -> None:
    """Which heads a task needs on MODEL: direct logit attribution, attribution patching (AtP, AtP*) and exact patching."""
    check_plotlyjs(plotlyjs)
    estimates = [m for m in circuits.METHODS if m != "exact"]  # --exact adds the exact one
    chosen = [m.strip() for m in methods.split(",") if m.strip()]
    if not chosen or any(m not in estimates for m in chosen):
        raise UsageError(f"--methods takes {' and '.join(estimates)} (comma-separated; --exact adds exact patching), "
                         f"got {methods!r}")
    if point not in circuits.POINTS:
        raise UsageError(f"--point must be one of {', '.join(circuits.POINTS)}, got {point!r}")
    if direction not in circuits.DIRECTIONS:
        raise UsageError(f"--direction must be {' or '.join(circuits.DIRECTIONS)}, got {direction!r}")
    started = _start_task(model, task, out=out, suffix="", analysis_dir=analysis_dir, force=force, n=n, seed=seed,
                          metric=metric, device=device, dtype=dtype, no_cache=no_cache)
    built = started.task
    run = circuits.run_attribution(started.loaded, built, chosen, exact=exact, point=point, direction=direction,
                                   labels=started.labels, batch_size=batch_size, progress=Bars())
    with started.guard as tmp:
        run.write_into(tmp, plotlyjs=plotlyjs)
    main = next(m for m in ("exact", "atp*", "atp") if m in run.tables)
    top = run.tables[main].sort_values("magnitude", ascending=False).head(5)
    typer.echo(f"{built.name}: {built.n} prompt pairs, {built.metric} clean {run.tables[main].attrs['clean_metric']:.3f}, "
               f"corrupted {run.tables[main].attrs['corrupted_metric']:.3f}")
    typer.echo(f"top heads ({main}, hook_{point}): " + ", ".join(f"{int(r.layer)}.{int(r.head)} {r.effect:+.3f}"
                                                                for r in top.itertuples()))
    typer.echo(f"report: {started.out / 'index.html'}")


@friendly
def circuit_command(
    model: ModelArg = "smollm2-135m",
    task: TaskOpt = "ioi",
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder (default: MODEL-TASK-circuit under reports/).")] = None,
    method: Annotated[str, typer.Option("--method", help="eap (one gradient on the clean run) or eap-ig (integrated gradients, more faithful).")] = "eap-ig",
    steps: Annotated[int, typer.Option("--steps", help="EAP-IG's integration steps (forward/backward pairs per batch; ignored by eap).")] = 5,
    riemann: Annotated[str, typer.Option("--riemann", help="EAP-IG's points: left (k = 0..S-1, from the corrupted run, as the EAP-IG code and MIB) or right (k = 1..S, ending at the clean run).")] = "left",
    n: PairsOpt = 32,
    seed: CircuitSeedOpt = 0,
    metric: MetricOpt = None,
    evaluate: Annotated[bool, typer.Option("--evaluate/--no-evaluate", help="Measure faithfulness by running the model with only the top edges clean, at each size, against random circuits.")] = True,
    sizes: Annotated[Optional[str], typer.Option("--sizes", help="Circuit sizes evaluated, in % of the edges, comma-separated (default: MIB's 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50 and 100).")] = None,
    random_draws: Annotated[int, typer.Option("--random", help="Random circuits drawn per size as the baseline.")] = 5,
    top: Annotated[int, typer.Option("--top", help="Edges drawn in the page's graph (largest |score| first).")] = 300,
    analysis_dir: CircuitAnalysisOpt = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Prompts per pass.")] = 8,
    max_memory: Annotated[Optional[float], typer.Option("--max-memory", help="GiB the scoring may take; fewer prompts per pass where they would not fit (default: half of the free memory).")] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    no_cache: NoCacheOpt = False,
    plotlyjs: PlotlyOpt = "embed",
    force: ForceOpt = False,
) -> None:
    """Edge-level circuit of a task on MODEL: EAP or EAP-IG scores, faithfulness against random circuits, a page."""
    check_plotlyjs(plotlyjs)
    if method not in circuits.CIRCUIT_METHODS:
        raise UsageError(f"--method must be {' or '.join(circuits.CIRCUIT_METHODS)}, got {method!r}")
    if riemann not in circuits.RIEMANN:
        raise UsageError(f"--riemann must be {' or '.join(circuits.RIEMANN)}, got {riemann!r}")
    check_count("--steps", steps, most=circuits.MAX_STEPS)
    check_count("--random", random_draws, least=0, most=circuits.MAX_RANDOM)
    check_count("--top", top)
    if max_memory is not None and not max_memory > 0:
        raise UsageError(f"--max-memory must be a positive number of GiB, got {max_memory}")
    chosen_sizes = circuits.check_sizes(numbers(sizes, float, "--sizes")) if sizes is not None else circuits.MIB_SIZES
    started = _start_task(model, task, out=out, suffix="-circuit", analysis_dir=analysis_dir, force=force, n=n,
                          seed=seed, metric=metric, device=device, dtype=dtype, no_cache=no_cache)
    built = started.task
    typer.echo(f"task: {built.name}, {built.n} prompt pairs, metric {built.metric}")
    bars = Bars(units={"circuit (": "pass", "evaluate": "circuit"})  # scoring's forward/backward pairs, evaluate's circuits
    found = headscope.circuit(started.loaded, built, method=method, steps=steps, batch_size=batch_size, progress=bars,
                              riemann=riemann, max_memory=None if max_memory is None else int(max_memory * 2**30))
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
    with started.guard as tmp:
        written = circuits.write_circuit_into(found, tmp, labels=started.labels, plotlyjs=plotlyjs, n_edges=top)
    typer.echo(f"report: {started.out / written.name}")
    index_above(started.out)


"""The KV-cache commands: `kv-policy` (rank key/value heads from an analysis and write a policy)
and `kv-eval` (measure a policy on a model against random, reverse, streaming and full caches)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

import headscope  # the public API, re-exported lazily: a command loads only what it runs

from .. import kv
from ..analysis.result import Analysis
from ..atomic import atomic_dir
from ..checks import MAX_SEED, check_count
from ..errors import UsageError
from ..hf.adapters import config_value
from ..kv.policy import check_keep
from ..loading import loader
from .shared import (
    Bars, DeviceOpt, DtypeOpt, ForceOpt, ModelArg, NoCacheOpt, PlotlyOpt, UnverifiedOpt, check_plotlyjs, friendly,
    index_above, numbers,
)

__all__ = ["kv_policy_command", "kv_eval_command"]

WRITERS = {"duo": kv.write_duo, "headkv": kv.write_headkv}  # --format: the policy file each tool reads


@friendly
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
    if format not in WRITERS:
        raise UsageError(f"--format must be one of {', '.join(WRITERS)}, got {format!r}")
    policy = kv.kv_policy(Analysis.load(directory, unverified=unverified), keep=keep, rank_by=rank_by, sink=sink,
                          recent=recent)
    WRITERS[format](policy, out, force=force, protect=[directory])
    typer.echo(f"{policy!r} -> {out}")


@friendly
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
    seed: Annotated[int, typer.Option("--seed", min=0, max=MAX_SEED, help="Needle prompts and random draws.")] = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    no_cache: NoCacheOpt = False,
    plotlyjs: PlotlyOpt = "embed",
    force: ForceOpt = False,
) -> None:
    """Measure a KV-cache policy on MODEL: needle accuracy, loss and KV bytes vs random, reverse, streaming, full."""
    check_plotlyjs(plotlyjs)
    chosen_lengths, chosen_depths = numbers(lengths, int, "--lengths"), numbers(depths, float, "--depths")
    chosen_keeps = numbers(keeps, float, "--keeps")
    for value in chosen_keeps + ([keep] if keep is not None else []):  # usage errors before the model loads
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
    evaluation = headscope.kv_evaluate(loaded, policy, lengths=chosen_lengths, depths=chosen_depths,
                                       n_needles=needles, keeps=chosen_keeps, n_random=random_draws, seed=seed, progress=Bars())
    with guard as tmp:
        evaluation.write_into(tmp, plotlyjs=plotlyjs)
    typer.echo(evaluation.summary().T.to_string(header=False))
    typer.echo(f"report: {out / 'index.html'}")
    index_above(out)

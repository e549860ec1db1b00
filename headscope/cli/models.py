"""The commands about models themselves: `models` (aliases and families), `verify` (headscope's
attention beside the model's own) and `cache` (the load cache of converted GGUF files)."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..errors import UsageError
from ..hf.families import family_table
from ..loading import loader
from ..loading.load_cache import cache_usage, clear_cache
from .shared import DeviceOpt, DtypeOpt, ModelArg, NoCacheOpt, friendly

__all__ = ["models_command", "verify_command", "cache_command", "VERIFY_TEXT"]

VERIFY_TEXT = (
    "The committee met on Tuesday to discuss the budget, and the chair asked everyone to be brief.",
    "Rivers carry sediment to the sea.",
)



@friendly
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


@friendly
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

    from ..hf.verify import DEFAULT_TOLERANCE, teacher_forced, verify  # torch and transformers: only when verifying

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



@friendly
def cache_command(
    clear: Annotated[bool, typer.Option("--clear", help="Remove every entry.")] = False,
) -> None:
    """Where the load cache of converted GGUF models is ($HEADSCOPE_CACHE moves it), and its size."""
    usage = clear_cache() if clear else cache_usage()
    state = "removed" if clear else "held"
    typer.echo(f"{usage.root}: {usage.entries} entries, {usage.bytes / 2**20:.1f} MiB {state}")


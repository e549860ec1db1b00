"""The `headscope` command line: thin commands over the library.

Commands: `models`, `verify MODEL`. Bad input ends with one line on stderr and exit code 1,
never a traceback; Ctrl-C ends with exit code 130.
"""
from __future__ import annotations

import functools
import sys
from typing import Annotated, Optional

import typer

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

VERIFY_TEXT = (
    "The committee met on Tuesday to discuss the budget, and the chair asked everyone to be brief.",
    "Rivers carry sediment to the sea.",
)


def _friendly(fn):
    """Turn headscope's errors into one line on stderr and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from .errors import HeadscopeError

        try:
            return fn(*args, **kwargs)
        except HeadscopeError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(1)
        except KeyboardInterrupt:
            typer.echo("interrupted; nothing was written", err=True)
            raise typer.Exit(130)

    return wrapper


@app.command("models")
@_friendly
def models_command() -> None:
    """List the bundled model aliases and how to install a missing one."""
    from .loading import models

    for entry in models():
        state = "installed" if entry["installed"] else f"missing: {entry['install']}"
        typer.echo(f"{entry['name']:<14} {state:<12} {entry['description']}")


@app.command("verify")
@_friendly
def verify_command(
    model: ModelArg = "smollm2-135m",
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = None,
    tolerance: Annotated[Optional[float], typer.Option(help="Largest allowed difference (default by dtype).")] = None,
) -> None:
    """Run headscope's attention beside the model's own on every layer; exit 1 past the tolerance."""
    import torch

    from .hf.verify import DEFAULT_TOLERANCE, verify
    from .loading import load

    loaded = load(model, device=device, dtype=dtype)
    tok = loaded.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    batch = tok(list(VERIFY_TEXT), return_tensors="pt", padding=True).to(loaded.device)
    table = verify(loaded.model, dict(batch))
    limit = tolerance if tolerance is not None else DEFAULT_TOLERANCE.get(loaded.model.dtype, 1e-4)
    typer.echo(table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    worst = table[["max_abs_diff_output", "max_abs_diff_pattern"]].to_numpy().max()
    if not worst <= limit:
        typer.echo(f"FAIL: largest difference {worst:.3g} exceeds tolerance {limit:g}", err=True)
        raise typer.Exit(1)
    typer.echo(f"OK: all {len(table)} layers within {limit:g}")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

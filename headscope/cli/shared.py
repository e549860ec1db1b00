"""What every command shares: the typer app, its error handling, the entry point and common options.

- `app`: the typer application; `headscope.cli` registers the commands on it, in order.
- `friendly(fn)`: a command's errors as one line on stderr and an exit code (see `headscope.cli`).
- `main()`: the console script's entry point (a usage error is one line and exit code 2).
- `Bars`: tqdm progress bars on stderr, fed by the library's `progress` callbacks.
- Options used by more than one command, as `Annotated` aliases (`ModelArg`, `DeviceOpt`, ...),
  and the helpers their values pass through (`check_plotlyjs`, `numbers`, `default_out`,
  `detector_names`, `index_above`).
"""
from __future__ import annotations

import functools
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer

from .. import detectors  # lazy: its registry imports the built-in detectors when first read
from ..checks import MAX_SEED
from ..errors import HeadscopeError, HeadscopeWarning, UsageError
from ..loading import distributed
from ..report import index as report_index
from ..report.html import PLOTLYJS_MODES

__all__ = ["app", "main", "friendly", "Bars", "ModelArg", "DeviceOpt", "DtypeOpt", "NoCacheOpt", "PlotlyOpt", "ForceOpt",
           "OpenOpt", "UnverifiedOpt", "SeedOpt", "check_plotlyjs", "numbers", "default_out", "detector_names",
           "index_above"]

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
PlotlyOpt = Annotated[str, typer.Option("--plotlyjs", help="embed (works offline) or cdn (small file).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing output folder.")]
OpenOpt = Annotated[bool, typer.Option("--open", help="Open the report in a browser when done.")]
UnverifiedOpt = Annotated[bool, typer.Option("--unverified", help="Read an analysis folder whose manifest.json is missing or no longer matches, with a warning (its tables are still checked; docs/reliability.md).")]
SeedOpt = Annotated[int, typer.Option("--seed", min=0, max=MAX_SEED, help="Seed for probes and bootstrap.")]


def _where() -> str:
    """"rank N: " inside a torchrun process group, else nothing."""
    rank, size = distributed.rank_and_size()
    if size == 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        rank, size = int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"])
    return f"rank {rank}: " if size > 1 else ""


def friendly(fn):
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
            Bars.close_all()
            typer.echo(f"error: {_where()}{err}", err=True)
            raise typer.Exit(2)
        except HeadscopeError as err:
            Bars.close_all()
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


def check_plotlyjs(value: str) -> str:
    """`--plotlyjs`'s value, or UsageError unless it is one of the report's modes."""
    if value not in PLOTLYJS_MODES:
        raise UsageError(f"--plotlyjs must be {' or '.join(PLOTLYJS_MODES)}, got {value!r}")
    return value


def default_out(model: str) -> Path:
    """reports/NAME for a model alias, folder, .gguf file or hub id (NAME made safe for a folder)."""
    path = Path(model.rstrip("/"))
    if path.exists():  # a local folder or file: its real name (`./m/sub/..` is `m`, `.` the working folder's)
        path = path.resolve()
    stem = path.stem if model.endswith(".gguf") else path.name
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip(".")
    return Path("reports") / (stem or "model")


class Bars:
    """tqdm bars on stderr, one per stage, fed by analyze's progress callback. A command that
    fails closes the bars still open (`close_all`), so its error line starts a line of its own.
    `units` names what a stage counts, by the start of its name (default: batches)."""

    open: set = set()

    def __init__(self, units: Optional[dict] = None):
        self.bars = {}
        self.units = units or {}

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
            unit = next((u for start, u in self.units.items() if stage.startswith(start)), "batch")
            bar = self.bars[stage] = tqdm(total=total, desc=stage, unit=unit, file=sys.stderr, leave=True)
            Bars.open.add(self)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()
            del self.bars[stage]
            if not self.bars:
                Bars.open.discard(self)


def detector_names(value: Optional[str]) -> Optional[list[str]]:
    """Names from `--detectors` ("induction,mypkg.module:name"), each resolved (imported) now."""
    if not value:
        return None
    return [detectors.resolve(spec.strip()).name for spec in value.split(",") if spec.strip()]


def index_above(folder: Path) -> None:
    """Re-write the list of reports above a folder just written, where there is one (reports/)."""
    try:
        written = report_index.update_index_of(folder)
    except HeadscopeError as err:  # the folder itself is written: say why the list is not
        typer.echo(f"warning: the list of reports was not updated: {err}", err=True)
        return
    if written is not None:
        typer.echo(f"index: {folder.parent / written.name}")


def numbers(value: str, kind, option: str) -> list:
    """A comma-separated option as numbers; HeadscopeError naming the option otherwise."""
    try:
        return [kind(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{option} takes comma-separated numbers, got {value!r}") from None


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

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

The modules: `shared` (the typer app, error handling, `main`, options shared by commands), then
one per family of commands: `models` (models, verify, cache), `analysis` (analyze, report,
compare, detectors), `circuits` (attribute, circuit), `geometry`, `timeline` and `kv`
(kv-policy, kv-eval). `COMMANDS` below registers them on the app, in the order `--help` and
docs/reference/cli.md list them.
"""
from __future__ import annotations

from ..loading import loader  # the module every command loads models through (`headscope.cli.loader.load`)
from . import analysis, circuits, geometry, kv, models, timeline
from .shared import app, main

__all__ = ["app", "main", "COMMANDS"]

COMMANDS = (
    ("models", models.models_command),
    ("verify", models.verify_command),
    ("analyze", analysis.analyze_command),
    ("report", analysis.report_command),
    ("compare", analysis.compare_command),
    ("detectors", analysis.detectors_command),
    ("geometry", geometry.geometry_command),
    ("timeline", timeline.timeline_command),
    ("kv-policy", kv.kv_policy_command),
    ("kv-eval", kv.kv_eval_command),
    ("attribute", circuits.attribute_command),
    ("circuit", circuits.circuit_command),
    ("cache", models.cache_command),
)

for _name, _command in COMMANDS:
    app.command(_name)(_command)
